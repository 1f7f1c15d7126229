"""`cacheroute replay`: push a workload or trace into `requests`, or copy a recorded topic."""

from __future__ import annotations

import time
from pathlib import Path

import click
import orjson
from rich.console import Console

from cacheroute.cli.options import json_option, time_ms
from cacheroute.errors import CacheRouteError
from cacheroute.progress import progress_bar
from cacheroute.replay.sources import SourceSpec, load_source
from cacheroute.replay.traces import TRACE_FORMATS
from cacheroute.replay.workloads import KINDS
from cacheroute.settings import Settings

__all__ = ["replay"]


@click.command("replay")
@click.argument("source")
@click.option(
    "--speed",
    default=1.0,
    show_default=True,
    type=click.FloatRange(min=0),
    help="x real time (10 = ten times faster); 0 = as fast as possible.",
)
@click.option("--format", "fmt", type=click.Choice([*TRACE_FORMATS, "auto"]), default="auto")
@click.option("--requests", default=10_000, show_default=True, help="Synthetic workload size.")
@click.option("--keys", default=2000, show_default=True)
@click.option(
    "--rate", type=float, help="Synthetic workload rate [default: 100; conversation: 20]."
)
@click.option("--seed", default=0, show_default=True)
@click.option("--tile", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--compress", type=float, help="Divide the source's timestamps by this.")
@click.option("--gateway-id", default="replay", show_default=True)
@click.option("--hashes", is_flag=True, help="Send prefix block hashes with each event.")
@click.option("--to", "dest", help="Topic copy: destination topic (must exist).")
@click.option("--from-offset", type=click.IntRange(min=0), help="Topic copy: start offset.")
@click.option("--from-time", help="Topic copy: start time (epoch ms or ISO-8601).")
@json_option("Print the outcome as one JSON object.")
@click.pass_obj
def replay(
    settings: Settings,
    source: str,
    speed: float,
    fmt: str,
    requests: int,
    keys: int,
    rate: float | None,
    seed: int,
    tile: int,
    compress: float | None,
    gateway_id: str,
    hashes: bool,
    dest: str | None,
    from_offset: int | None,
    from_time: str | None,
    as_json: bool,
) -> None:
    """Replay SOURCE into Kafka.

    SOURCE is a trace file (Mooncake JSONL, Azure CSV, generic CSV/JSONL), `workload:KIND` (a
    synthetic workload: paper, whale, low-reuse) or `topic:NAME` (copy a recorded topic into
    --to, from --from-offset or --from-time up to its current end). Files and workloads are
    pushed into the `requests` topic through the gateway emitter.
    """
    console = Console(stderr=True)
    if source.startswith("topic:"):
        if dest is None:
            raise click.UsageError("copying a topic needs --to TOPIC")
        from cacheroute.replay.live import copy_topic  # noqa: PLC0415 - Kafka client, lazily

        with progress_bar(console) as progress:
            task = progress.add_task(f"copy {source[6:]} -> {dest}", total=None)
            copied = copy_topic(
                settings,
                source[6:],
                dest,
                from_offset=from_offset,
                from_time_ms=time_ms(from_time) if from_time else None,
                speed=speed,
                on_progress=lambda n: progress.advance(task, n),
            )
        done = {"copied": copied.records, "partitions": copied.partitions, "to": dest}
        click.echo(orjson.dumps(done).decode() if as_json else f"copied {copied.records} records")
        return
    if source.startswith("workload:"):
        kind = source[9:]
        if kind not in KINDS:  # narrowed to WorkloadKind below
            raise click.BadParameter(f"unknown workload {kind!r}; choose from {', '.join(KINDS)}")
        spec = SourceSpec(workload=kind, requests=requests, keys=keys, rate=rate, seed=seed)
    else:
        path = Path(source)
        if not path.is_file():
            raise click.BadParameter(f"no such file: {source}")
        spec = SourceSpec(trace=path, fmt=fmt, seed=seed, tile=tile)  # type: ignore[arg-type]
    reqs = load_source(spec)
    if compress is not None:
        reqs = reqs.compressed(compress)
    from cacheroute.dispatcher.emitter.emitter import Emitter  # noqa: PLC0415 - Kafka client, lazily
    from cacheroute.replay.live import push  # noqa: PLC0415

    with progress_bar(console) as progress, Emitter(settings, gateway_id) as emitter:
        task = progress.add_task(
            f"replay x{speed:g} into {settings.topics['requests']}", total=reqs.n
        )
        stats = push(
            reqs,
            emitter,
            speed=speed,
            start_ms=time.time_ns() // 1_000_000,
            block_hashes=hashes,
            on_progress=lambda n: progress.advance(task, n),
        )
    if not stats.flushed:
        raise CacheRouteError("some events were not delivered before the timeout", retriable=True)
    out = {
        "requests": stats.requests,
        "accepted": stats.accepted,
        "rejected_or_dropped": stats.rejected_or_dropped,
        "replay_s": stats.replay_s,
        "wall_s": stats.wall_s,
        "notes": list(reqs.notes),
    }
    if as_json:
        click.echo(orjson.dumps(out).decode())
    else:
        click.echo(
            f"pushed {stats.accepted}/{stats.requests} requests in {stats.wall_s:.1f} s "
            f"(replay time {stats.replay_s:.1f} s)"
        )
