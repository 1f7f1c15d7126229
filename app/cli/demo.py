"""`cacheroute demo`: the main job - the whole pipeline live on a local broker.

Real `cacheroute gateway` processes in front of `cacheroute engine` stand-ins, driven over HTTP by
a load generator -> `requests` -> streams agent -> `rates` -> planner -> `plans` -> the gateways'
dispatchers, with a live terminal view. With --in-process the gateways instead replay the workload
inside their processes (real `Dispatcher` + `Emitter`, simulated prefix caches) at a higher rate.
See cacheroute.demo.run for what it starts and how it cleans up.
"""

from __future__ import annotations

import click
from rich.console import Console

from cacheroute.cli.kafka import broker_for, local_for
from cacheroute.cli.options import json_option, q_cap_option, warm_slots_option
from cacheroute.errors import CacheRouteError
from cacheroute.localkafka import LocalBroker, resolve_distribution
from cacheroute.localkafka.broker import broker_answers
from cacheroute.settings import Settings

__all__ = ["demo"]


DEMO_WARM_SLOTS = 64
"""W of the demo's planner: `evaluate`'s default (`replay.policy.WARM_SLOTS`, tested equal), not
imported so that the gateway install's CLI loads without the simulator."""


@click.command()
@click.option("--duration", "duration_s", default=60.0, show_default=True, help="Seconds to run.")
@click.option(
    "--interval",
    "interval_s",
    default=5.0,
    show_default=True,
    help="Planner control interval (s); also the streams window.",
)
@click.option("--gateways", default=2, show_default=True, type=click.IntRange(min=1, max=8))
@click.option(
    "--destinations",
    type=click.IntRange(min=1),
    default=None,
    help="Simulated destinations [8]; with --http the engines are the destinations.",
)
@click.option(
    "--rate",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Total requests/s offered [2000; with --http 150].",
)
@click.option("--keys", default=2000, show_default=True, type=click.IntRange(min=1))
@q_cap_option("Planner q_cap (req/s per replica).", default=4.0)
@warm_slots_option(default=DEMO_WARM_SLOTS)
@click.option("--cache-blocks", default=2048, show_default=True, help="Simulated cache/dest.")
@click.option(
    "--max-plan-age",
    "max_plan_age_s",
    type=float,
    help="Planner --max-plan-age (s) [planner default: 10 intervals].",
)
@click.option(
    "--http/--in-process",
    default=True,
    show_default=True,
    help="Real gateways and engine stand-ins over HTTP, driven by a load generator (default); "
    "or gateways that replay the workload in-process against a simulated cluster.",
)
@click.option(
    "--engines",
    default=4,
    show_default=True,
    type=click.IntRange(min=1, max=32),
    help="With --http: engine stand-ins (the plan's destinations d0..).",
)
@click.option("--no-broker", is_flag=True, help="Use the broker at --bootstrap; do not start one.")
@click.option("--headless", is_flag=True, help="No live view; progress lines on stderr.")
@json_option("Print one JSON summary on stdout at the end.")
@click.option("--keep-topics", is_flag=True, help="Keep this run's topics (default: delete).")
@click.pass_obj
def demo(
    settings: Settings,
    duration_s: float,
    interval_s: float,
    gateways: int,
    destinations: int | None,
    rate: float | None,
    keys: int,
    q_cap: float,
    warm_slots: int,
    cache_blocks: int,
    max_plan_age_s: float | None,
    http: bool,
    engines: int,
    no_broker: bool,
    headless: bool,
    as_json: bool,
    keep_topics: bool,
) -> None:
    """Run the live demo: broker, topics, streams worker, planner, engines and gateways.

    Starts (or reuses) the local broker, creates topics under a fresh prefix `demo-<id>.`, runs a
    faust rate worker and a planner, --engines `cacheroute engine` stand-ins (the destinations;
    cache --cache-blocks blocks of 256 tokens each) and --gateways real `cacheroute gateway`
    processes on 127.0.0.1 following the plans topic, driven round-robin over HTTP by a load
    generator replaying a paper-like workload at --rate (default 150 req/s, what a 2-core machine
    sustains). The live view shows TTFT per gateway, each engine's own prefix-cache hit rate and
    the hit rate Flat-LB (power-of-two-choices) would have had on the same requests (a shadow
    simulated cluster). Ends after --duration or on Ctrl-C: stops everything it started (the
    broker only if it started it) and deletes its topics unless --keep-topics.

    With --in-process: --gateways processes replay the workload through real dispatchers and
    emitters against a simulated cluster (block LRU prefix cache per destination), at 2000 req/s.
    """
    from cacheroute.demo.run import DemoOptions, run_demo, write_json  # noqa: PLC0415

    if interval_s < 1:
        raise click.BadParameter("must be >= 1 s", param_hint="--interval")
    if http and destinations is not None and destinations != engines:
        raise click.BadParameter(
            "with --http the engines are the destinations: give --engines",
            param_hint="--destinations",
        )
    if http:
        destinations = engines
    default_rate = 150.0 if http else 2000.0
    console = Console(stderr=True)
    started: LocalBroker | None = None
    security = settings.kafka_security
    if no_broker or broker_answers(settings.bootstrap, security=security):
        if not broker_answers(settings.bootstrap, security=security):
            raise CacheRouteError(f"no broker answers at {settings.bootstrap}")
        console.print(f"using the broker at {settings.bootstrap}")
    else:
        broker = broker_for(settings)
        dist = resolve_distribution(local_for(settings), console=console)
        with console.status(f"Starting Kafka {dist.version} at {broker.bootstrap} ..."):
            result = broker.start(dist)
        if not result.already_running:
            started = broker
        console.print(f"[green]Kafka {dist.version} running[/] at {result.bootstrap}")
    options = DemoOptions(
        duration_s=duration_s,
        interval_s=interval_s,
        gateways=gateways,
        destinations=8 if destinations is None else destinations,
        rate=default_rate if rate is None else rate,
        keys=keys,
        q_cap=q_cap,
        warm_slots=warm_slots,
        cache_blocks=cache_blocks,
        max_plan_age_s=max_plan_age_s,
        live=not headless,
        keep_topics=keep_topics,
        http=http,
        engines=engines,
    )
    try:
        summary = run_demo(settings, options, console)
    finally:
        if started is not None:
            with console.status("Stopping the broker this demo started ..."):
                started.stop()
            console.print("stopped the broker this demo started")
    if as_json:
        click.echo(write_json(summary))
    if summary["failed"]:
        raise CacheRouteError(
            f"{summary['failed']} exited early; logs in "
            f"{settings.home / 'demo' / summary['run_id']}"
        )
    if not as_json:
        console.print(
            f"done: {summary['plan_versions']} plan versions, {summary['events']} events, "
            f"{summary['dead_letters']} dead letters, admitted keys {summary['admitted_keys']}"
        )
