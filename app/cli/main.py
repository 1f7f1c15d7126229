"""Entry point of the `cacheroute` command."""

from __future__ import annotations

import faulthandler
import logging
import sys
from pathlib import Path
from typing import NoReturn

import click
from rich.console import Console
from rich.markup import escape

from cacheroute import __version__
from cacheroute.cli.bench import bench
from cacheroute.cli.demo import demo
from cacheroute.cli.doctor import doctor
from cacheroute.cli.engine import engine
from cacheroute.cli.gateway import gateway
from cacheroute.cli.kafka import kafka
from cacheroute.cli.lazy import LazyGroup, missing_extra
from cacheroute.cli.plan import plan
from cacheroute.cli.planner import planner
from cacheroute.cli.streams import streams
from cacheroute.cli.topics import topics
from cacheroute.errors import CacheRouteError
from cacheroute.logs import setup_logging
from cacheroute.settings import Settings

__all__ = ["cli", "main"]


# the evaluator's commands import the simulator (numba, the [eval] extra) when first used
_LAZY = {
    "evaluate": ("cacheroute.cli.evaluate:evaluate_cmd", "eval"),
    "replay": ("cacheroute.cli.replay:replay", "eval"),
    "workload": ("cacheroute.cli.workload:workload", "eval"),
}


@click.group(
    cls=LazyGroup,
    lazy=_LAZY,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@click.version_option(__version__, prog_name="cacheroute")
@click.option(
    "--bootstrap",
    metavar="HOST:PORT",
    help="Kafka bootstrap address [env CACHEROUTE_BOOTSTRAP; default 127.0.0.1:9092].",
)
@click.option(
    "--topic-prefix",
    metavar="PREFIX",
    help="Prefix of every topic name [env CACHEROUTE_TOPIC_PREFIX; default none].",
)
@click.option(
    "--home",
    type=click.Path(path_type=Path, file_okay=False),
    help="Cache of broker jars and local broker state [env CACHEROUTE_HOME; "
    "default ~/.cache/cacheroute].",
)
@click.option(
    "--kafka-config",
    type=click.Path(path_type=Path, dir_okay=False, exists=True),
    help="Kafka connection security: a Kafka client properties file (security.protocol, "
    "sasl.mechanism, sasl.jaas.config, ssl.ca.location, ...) or a .toml file; "
    "CACHEROUTE_KAFKA_* variables override single values [env CACHEROUTE_KAFKA_CONFIG].",
)
@click.option("-v", "--verbose", count=True, help="More log output (-vv for debug).")
@click.option(
    "--log-format",
    type=click.Choice(["text", "json"]),
    default=None,
    help="text for people, json lines for log shippers [env CACHEROUTE_LOG_FORMAT; default text].",
)
@click.pass_context
def cli(
    ctx: click.Context,
    bootstrap: str | None,
    topic_prefix: str | None,
    home: Path | None,
    kafka_config: Path | None,
    verbose: int,
    log_format: str | None,
) -> None:
    """CacheRoute: planned prefix-affinity routing for multi-replica LLM serving.

    Settings come from CACHEROUTE_* environment variables; the flags here override them.
    """
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    setup_logging(level, log_format)
    ctx.obj = Settings.from_env(
        bootstrap=bootstrap, topic_prefix=topic_prefix, home=home, kafka_config=kafka_config
    )


cli.add_command(kafka)
cli.add_command(topics)
cli.add_command(demo)
cli.add_command(plan)
cli.add_command(planner)
cli.add_command(bench)
cli.add_command(streams)
cli.add_command(doctor)
cli.add_command(gateway)
cli.add_command(engine)


def main() -> None:
    """Run the CLI; operational errors print one clear message and exit 1, no traceback."""
    # librdkafka and other C extensions run inside this process: if one crashes, print the
    # Python stack of every thread to stderr, so the crash says where it happened
    faulthandler.enable()
    try:
        cli.main(standalone_mode=False)
    except click.exceptions.Abort:
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except CacheRouteError as exc:
        _fail(exc)
    except KeyboardInterrupt:
        sys.exit(130)
    except ImportError as exc:  # a command that needs an extra this install does not have
        error = missing_extra(exc)
        if error is None:
            raise
        _fail(error)


def _fail(error: CacheRouteError) -> NoReturn:
    """One line on stderr naming the cause (no traceback), exit 1."""
    # soft_wrap: one line however narrow the terminal, so logs and `grep` see it whole; escaped:
    # messages hold brackets ([eval], topic[0]@5) that rich would take for markup
    Console(stderr=True, soft_wrap=True).print(
        f"[bold red]error:[/] {escape(str(error))}", highlight=False
    )
    sys.exit(1)
