"""One demo gateway process: replays a paper-like workload through a real Dispatcher and Emitter.

Run by `cacheroute demo` as `python -m cacheroute.demo.gateway ...`. Every gateway draws the same
seeded workload (same keys, same popularity) and takes every n-th request of it, so n gateways
together offer `--rate` requests/s. Each request is routed by the gateway's `Dispatcher` (which
follows the plans topic), emitted by its `Emitter` (so the streams agent sees it) and served by a
simulated cluster: one block-level LRU prefix cache per destination (`cacheroute.replay.cache`).
The simulated cluster is private to the gateway (it sees only its own share of the traffic).

Stats: one JSON object per `--stats-interval` seconds on stdout; the last one has `"final": true`.
Stops on SIGTERM/SIGINT, when `--duration` is over, or when its parent process goes away.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from types import FrameType

import click
import numpy as np
import orjson

from cacheroute.demo.procs import run_child_command
from cacheroute.dispatcher.dispatcher import Dispatcher, DispatcherConfig
from cacheroute.dispatcher.emitter.emitter import Emitter
from cacheroute.dispatcher.routing import RouteKind
from cacheroute.logs import setup_logging
from cacheroute.replay.cache import cache_lookup_insert, new_cache, warm_up
from cacheroute.replay.workloads import generate, spec_for
from cacheroute.settings import Settings

__all__ = ["GatewayArgs", "main", "run"]

MAX_PERIOD_S = 300.0
"""Longest stretch of workload drawn at once; longer runs replay it again (shifted in time)."""


@dataclass(frozen=True, slots=True)
class GatewayArgs:
    """One demo gateway's settings (its command line)."""

    bootstrap: str
    topic_prefix: str
    gateway_id: str
    index: int = 0
    """This gateway's share: requests index::gateways."""
    gateways: int = 1
    destinations: int = 8
    rate: float = 2000.0
    """Total requests/s of all gateways."""
    keys: int = 2000
    cache_blocks: int = 2048
    """Simulated cache blocks per destination."""
    duration: float = 3600.0
    interval: float = 60.0
    """The planner's control interval (s): the dispatcher's staleness clock."""
    stats_interval: float = 1.0
    seed: int = 7


@click.command(
    context_settings={"help_option_names": ["-h", "--help"]},
    help="One demo gateway (started by `cacheroute demo`): replays its share of the workload "
    "through a real Dispatcher and Emitter against a simulated cluster.",
)
@click.option("--bootstrap", required=True, help="Kafka bootstrap servers.")
@click.option("--topic-prefix", required=True, help="Prefix of the demo's topics.")
@click.option("--gateway-id", required=True, help="This gateway's id in its events.")
@click.option("--index", default=0, show_default=True, type=click.IntRange(min=0))
@click.option("--gateways", default=1, show_default=True, type=click.IntRange(min=1))
@click.option("--destinations", default=8, show_default=True, type=click.IntRange(min=1))
@click.option("--rate", default=2000.0, show_default=True, help="Total req/s of all gateways.")
@click.option("--keys", default=2000, show_default=True, type=click.IntRange(min=1))
@click.option("--cache-blocks", default=2048, show_default=True, help="Per destination.")
@click.option("--duration", default=3600.0, show_default=True, help="Seconds.")
@click.option("--interval", default=60.0, show_default=True, help="Planner control interval (s).")
@click.option("--stats-interval", default=1.0, show_default=True, help="Seconds between stats.")
@click.option("--seed", default=7, show_default=True, help="Workload seed.")
def command(
    *,
    bootstrap: str,
    topic_prefix: str,
    gateway_id: str,
    index: int,
    gateways: int,
    destinations: int,
    rate: float,
    keys: int,
    cache_blocks: int,
    duration: float,
    interval: float,
    stats_interval: float,
    seed: int,
) -> int:
    """The command line as `GatewayArgs`, then `run`."""
    return run(
        GatewayArgs(
            bootstrap=bootstrap,
            topic_prefix=topic_prefix,
            gateway_id=gateway_id,
            index=index,
            gateways=gateways,
            destinations=destinations,
            rate=rate,
            keys=keys,
            cache_blocks=cache_blocks,
            duration=duration,
            interval=interval,
            stats_interval=stats_interval,
            seed=seed,
        )
    )


def main(argv: list[str] | None = None) -> int:
    """Parse `argv` (click, as every other command) and run one gateway; the exit code."""
    return run_child_command(command, argv, "python -m cacheroute.demo.gateway")


def run(args: GatewayArgs) -> int:  # noqa: PLR0915 - one flat replay loop
    """Run one gateway until stopped; returns the exit code."""
    setup_logging(logging.WARNING)  # text or JSON, as the parent chose (CACHEROUTE_LOG_FORMAT)
    settings = Settings.from_env(bootstrap=args.bootstrap, topic_prefix=args.topic_prefix)
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        del signum, frame
        stop.set()

    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, on_signal)
    parent = os.getppid()

    period = min(args.duration + 10.0, MAX_PERIOD_S)
    spec = spec_for(
        "paper", keys=args.keys, requests=max(2, int(args.rate * period)), rate=args.rate
    )
    reqs = generate(spec, np.random.default_rng(args.seed))
    mine = np.arange(args.index, reqs.n, max(1, args.gateways), dtype=np.int64)
    times = reqs.times[mine]
    keys = [reqs.keys[k] for k in reqs.key_index[mine].tolist()]
    prompt = reqs.prompt_tokens[mine].tolist()
    prefix = reqs.prefix_tokens[mine].tolist()
    offsets = reqs.block_offsets
    span = float(reqs.duration) + 1.0 / args.rate

    names = [f"d{i}" for i in range(args.destinations)]
    r = len(names)
    cache = new_cache(r, args.cache_blocks)
    warm_up()  # compile the cache kernel before the replay's clock starts
    scratch = np.zeros(max(1, int(np.diff(offsets).max(initial=1))), dtype=np.int64)
    block_tokens = reqs.block_tokens

    dispatcher = Dispatcher(names, DispatcherConfig(control_interval_s=args.interval))
    dispatcher.follow(settings, client_id=f"cacheroute-demo-{args.gateway_id}")
    emitter = Emitter(settings, args.gateway_id)
    route_index, acquire, release = (
        dispatcher.route_index,
        dispatcher.acquire,
        dispatcher.release,
    )

    load = [0] * r  # routed per destination since the last report
    load_total = [0] * r
    hit_tokens = prompt_tokens = 0
    win_hit = win_prompt = 0
    routed = 0
    plan_hit = plan_prompt = 0  # requests routed by the plan (admitted keys)
    counts = dispatcher.router.counts
    out = sys.stdout

    def report(now: float, dt: float, *, final: bool = False) -> None:
        nonlocal win_hit, win_prompt
        age = dispatcher.plan_age_s()
        other_prompt = prompt_tokens - plan_prompt
        st = emitter.stats()
        line = {
            "gateway": args.gateway_id,
            "t": round(now, 3),
            "plan_version": dispatcher.version,
            "plan_age_s": None if age is None else round(age, 2),
            "routed": routed,
            "routed_by_plan": int(counts[RouteKind.PLAN]),
            "route_kinds": {n: int(counts[i]) for i, n in enumerate(RouteKind.NAMES)},
            "load": [round(x / dt, 2) if dt > 0 else 0.0 for x in load],
            "load_total": list(load_total),
            "hit_rate": hit_tokens / prompt_tokens if prompt_tokens else None,
            "hit_rate_recent": win_hit / win_prompt if win_prompt else None,
            "hit_rate_plan": plan_hit / plan_prompt if plan_prompt else None,
            "hit_rate_other": (hit_tokens - plan_hit) / other_prompt if other_prompt else None,
            "emitted": st.accepted,
            "emit_dropped": st.dropped + st.rejected,
            "events_sent": st.events_sent,
            "final": final,
        }
        out.write(orjson.dumps(line).decode() + "\n")
        out.flush()
        for i in range(r):
            load[i] = 0
        win_hit = win_prompt = 0

    t0 = time.monotonic()
    last_report = t0
    j = 0  # next request of this gateway
    cycle = 0
    n = len(keys)
    try:
        while not stop.is_set():
            now = time.monotonic()
            elapsed = now - t0
            if elapsed >= args.duration or os.getppid() != parent:
                break
            while n and times[j] + cycle * span <= elapsed:
                key = keys[j]
                before = counts[0]
                i = route_index(key)
                planned = counts[0] != before
                acquire(i)
                blocks = reqs.block_ids[offsets[mine[j]] : offsets[mine[j] + 1]]
                matched = cache_lookup_insert(
                    cache.cap,
                    cache.tkeys,
                    cache.tvals,
                    cache.ekey,
                    cache.eprev,
                    cache.enext,
                    cache.dstate,
                    r,
                    i,
                    blocks,
                    scratch,
                )
                release(i)
                hit = min(matched * block_tokens, prompt[j])
                emitter.emit(
                    key,
                    prompt[j],
                    prefix_tokens=prefix[j],
                    destination=names[i],
                    cached_tokens=hit,
                )
                routed += 1
                load[i] += 1
                load_total[i] += 1
                hit_tokens += hit
                prompt_tokens += prompt[j]
                win_hit += hit
                win_prompt += prompt[j]
                if planned:
                    plan_hit += hit
                    plan_prompt += prompt[j]
                j += 1
                if j == n:
                    j = 0
                    cycle += 1
            if now - last_report >= args.stats_interval:
                report(elapsed, now - last_report)
                last_report = now
            time.sleep(0.01)
    finally:
        now = time.monotonic()
        emitter.close(timeout=10)
        dispatcher.close()
        report(now - t0, max(now - last_report, 1e-9), final=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
