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

import argparse
import logging
import os
import signal
import sys
import threading
import time
from types import FrameType

import numpy as np
import orjson

from cacheroute.dispatcher.dispatcher import Dispatcher, DispatcherConfig
from cacheroute.dispatcher.emitter import Emitter
from cacheroute.dispatcher.routing import RouteKind
from cacheroute.logs import setup_logging
from cacheroute.replay.cache import cache_lookup_insert, new_cache
from cacheroute.replay.workloads import generate, spec_for
from cacheroute.settings import Settings

__all__ = ["main"]

MAX_PERIOD_S = 300.0
"""Longest stretch of workload drawn at once; longer runs replay it again (shifted in time)."""


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m cacheroute.demo.gateway")
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--topic-prefix", required=True)
    p.add_argument("--gateway-id", required=True)
    p.add_argument("--index", type=int, default=0, help="This gateway's share: requests i::n.")
    p.add_argument("--gateways", type=int, default=1)
    p.add_argument("--destinations", type=int, default=8)
    p.add_argument("--rate", type=float, default=2000.0, help="Total req/s of all gateways.")
    p.add_argument("--keys", type=int, default=2000)
    p.add_argument("--cache-blocks", type=int, default=2048, help="Per destination.")
    p.add_argument("--duration", type=float, default=3600.0)
    p.add_argument("--interval", type=float, default=60.0, help="Planner control interval (s).")
    p.add_argument("--stats-interval", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=7)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:  # noqa: PLR0915 - one flat replay loop
    """Run one gateway until stopped; returns the exit code."""
    args = _parse(argv)
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
