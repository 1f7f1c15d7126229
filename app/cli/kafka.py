"""`cacheroute kafka start|stop|status|logs`: the local single-node Apache Kafka broker."""

from __future__ import annotations

import sys
import time

import click
import orjson
from rich.console import Console

from cacheroute.errors import CacheRouteError
from cacheroute.localkafka import LocalBroker, resolve_distribution
from cacheroute.settings import Settings

__all__ = ["broker_for", "kafka"]


def broker_for(settings: Settings) -> LocalBroker:
    """The local broker that serves `settings.bootstrap`, with its state under `settings.home`."""
    host, port = settings.host_port
    return LocalBroker(
        settings.home / "brokers" / f"{host}-{port}", host=host, port=port, heap=settings.kafka_heap
    )


@click.group()
def kafka() -> None:
    """Run a real local Apache Kafka broker (KRaft, single node, 127.0.0.1 only).

    The jars come from KAFKA_HOME when set, else from the cache, else from Maven Central (or the
    Apache release tarball with CACHEROUTE_KAFKA_SOURCE=tarball). Data and logs live under
    CACHEROUTE_HOME/brokers/<host>-<port>/.
    """


@kafka.command()
@click.option(
    "--timeout", default=120.0, show_default=True, help="Seconds to wait until it answers."
)
@click.option(
    "--source",
    type=click.Choice(["auto", "maven", "tarball"]),
    help="Where to fetch the jars when they are not cached [env CACHEROUTE_KAFKA_SOURCE].",
)
@click.option("--kafka-version", help="Apache Kafka version [env CACHEROUTE_KAFKA_VERSION].")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.pass_obj
def start(
    settings: Settings, timeout: float, source: str | None, kafka_version: str | None, as_json: bool
) -> None:
    """Start the broker (idempotent) and wait until it answers a metadata request."""
    settings = settings.with_overrides(kafka_source=source, kafka_version=kafka_version)
    console = Console(stderr=True)
    broker = broker_for(settings)
    dist = resolve_distribution(settings, console=console)
    with console.status(f"Starting Kafka {dist.version} at {broker.bootstrap} ..."):
        result = broker.start(dist, timeout=timeout)
    if as_json:
        click.echo(
            orjson.dumps(
                {
                    "bootstrap": result.bootstrap,
                    "pid": result.pid,
                    "already_running": result.already_running,
                    "version": dist.version,
                    "seconds": round(result.seconds, 2),
                }
            )
        )
        return
    verb = "was already running" if result.already_running else "is running"
    click.echo(
        f"Kafka {dist.version} {verb} at {result.bootstrap} (pid {result.pid}, "
        f"ready in {result.seconds:.1f}s)"
    )
    click.echo(f"bootstrap: {result.bootstrap}")


@kafka.command()
@click.option("--timeout", default=60.0, show_default=True, help="Seconds before SIGKILL.")
@click.pass_obj
def stop(settings: Settings, timeout: float) -> None:
    """Stop the broker this tool started (pid file); never touches other processes."""
    broker = broker_for(settings)
    pid = broker.stop(timeout=timeout)
    if pid is None:
        click.echo(f"No broker started by cacheroute runs at {broker.bootstrap}; nothing to stop.")
    else:
        click.echo(
            f"Stopped the broker at {broker.bootstrap} (pid {pid}); data kept in "
            f"{broker.state_dir}."
        )


@kafka.command()
@click.option("--json", "as_json", is_flag=True, help="Print the status as JSON.")
@click.pass_obj
def status(settings: Settings, as_json: bool) -> None:
    """Say whether the broker runs and answers; exit 0 when it answers, 3 when it does not."""
    st = broker_for(settings).status()
    if as_json:
        click.echo(
            orjson.dumps(
                {
                    "bootstrap": st.bootstrap,
                    "running": st.running,
                    "pid": st.pid,
                    "answering": st.answering,
                    "state_dir": str(st.state_dir),
                }
            )
        )
    elif st.running:
        health = "answering" if st.answering else "NOT answering yet (see `cacheroute kafka logs`)"
        click.echo(f"running (pid {st.pid}), {health}")
        click.echo(f"bootstrap: {st.bootstrap}")
    elif st.answering:
        click.echo("a broker not started by cacheroute answers at this address")
        click.echo(f"bootstrap: {st.bootstrap}")
    else:
        click.echo("not running; start it with `cacheroute kafka start`")
        click.echo(f"bootstrap: {st.bootstrap}")
    sys.exit(0 if st.answering else 3)


@kafka.command()
@click.option("-n", "--lines", default=50, show_default=True, help="Lines to show.")
@click.option("-f", "--follow", is_flag=True, help="Keep printing new lines (Ctrl-C to stop).")
@click.pass_obj
def logs(settings: Settings, lines: int, follow: bool) -> None:
    """Show the broker's log (and its JVM output, where start-up failures land)."""
    broker = broker_for(settings)
    if not broker.log_file.exists() and not broker.stdout_file.exists():
        raise CacheRouteError(f"no broker logs under {broker.state_dir}: it was never started")
    click.echo(broker.tail(lines))
    if not follow:
        return
    path = broker.log_file
    with path.open("r", errors="replace") as fh:
        fh.seek(0, 2)
        while True:
            line = fh.readline()
            if line:
                click.echo(line, nl=False)
            else:
                time.sleep(0.3)
