"""The HTTP demo's load generator: the demo workload, replayed over HTTP against real gateways.

Run by `cacheroute demo --http` as `python -m cacheroute.demo.httpload ...`, in its own process so
its event loop does not share a GIL with the conductor's live view. It draws the same seeded
`paper` workload the in-process demo gateways replay and sends request j, at its arrival time, to
gateway j mod G (round-robin, as an L4 balancer in front of the gateways would), as a streamed
POST /v1/completions with the request's routing key in `x-session-id`.

Prompts are cheap synthetic text the engine stand-in reads the way the workload means it: the
engine counts 4 characters per token and caches chained hashes of 64-character blocks, so each
workload block id b becomes `block_tokens x 4` characters that depend only on b. Two requests
then share exactly the text prefix their block ids share (block ids already encode everything
before them), the engine sees exactly the workload's prompt tokens, and the partial last block is
text unique to the request (the workload never caches it either).

Measured here: per gateway, time to first token (first byte of the streamed answer, counted from
the request's scheduled arrival, so a client that falls behind shows up instead of hiding), the
requests each backend served (`x-cacheroute-backend`), and, for comparison, the hit rate the same
requests would have had under Flat-LB: a shadow cluster of the replay simulator's block LRU
caches (`cacheroute.replay.cache`, one per engine, the engines' capacity) routed by
power-of-two-choices on the shadow's own in-flight counts (the dispatcher's Router with no plan,
as the replay's `flat-lb` baseline). A request holds its shadow slot for as long as the real one
takes.

Stats: one JSON object per `--stats-interval` seconds on stdout; the last one has `"final": true`.
Stops on SIGTERM/SIGINT, when `--duration` is over, or when its parent process goes away.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import signal
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import click
import numpy as np
import orjson

from cacheroute.demo.procs import run_child_command
from cacheroute.dispatcher.routing import Router
from cacheroute.logs import setup_logging
from cacheroute.openai_api import CHARS_PER_TOKEN, COMPLETIONS_PATH
from cacheroute.replay.cache import cache_lookup_insert, new_cache, warm_up
from cacheroute.replay.requestset import IntArray, RequestSet
from cacheroute.replay.workloads import generate, spec_for
from cacheroute.serve import loop_factory

__all__ = ["LoadArgs", "block_text", "main", "prompt_text_for", "run"]

log = logging.getLogger("cacheroute.demo.httpload")

MODEL = "cacheroute-sim"
BACKEND_HEADER = "x-cacheroute-backend"
MAX_PERIOD_S = 300.0
"""Longest stretch of workload drawn at once; longer runs replay it again (shifted in time)."""
DRAIN_S = 3.0
"""On stop, how long requests already sent may take to finish before they are cancelled."""


@dataclass(frozen=True, slots=True)
class LoadArgs:
    """The load generator's settings (its command line)."""

    gateway: tuple[str, ...]
    """NAME=PORT of each gateway on 127.0.0.1; requests go round-robin."""
    destinations: int
    """Engines behind the gateways, named d0.. (the plan's names)."""
    rate: float = 150.0
    keys: int = 2000
    cache_blocks: int = 2048
    max_tokens: int = 2
    duration: float = 3600.0
    stats_interval: float = 1.0
    max_outstanding: int = 2000
    seed: int = 7


@click.command(
    context_settings={"help_option_names": ["-h", "--help"]},
    help="The HTTP demo's load generator (started by `cacheroute demo --http`).",
)
@click.option(
    "--gateway",
    multiple=True,
    required=True,
    metavar="NAME=PORT",
    help="A gateway on 127.0.0.1 (repeatable; requests go round-robin).",
)
@click.option(
    "--destinations",
    required=True,
    type=click.IntRange(min=1),
    help="Engines behind the gateways, named d0.. (the plan's names).",
)
@click.option("--rate", default=150.0, show_default=True, help="Requests/s offered in total.")
@click.option("--keys", default=2000, show_default=True, type=click.IntRange(min=1))
@click.option("--cache-blocks", default=2048, show_default=True, help="Per engine, in blocks.")
@click.option("--max-tokens", default=2, show_default=True, help="Output tokens per request.")
@click.option("--duration", default=3600.0, show_default=True, help="Seconds.")
@click.option("--stats-interval", default=1.0, show_default=True, help="Seconds between stats.")
@click.option(
    "--max-outstanding", default=2000, show_default=True, help="Then drop, as clients do."
)
@click.option("--seed", default=7, show_default=True, help="Workload seed.")
def command(  # one parameter per option
    *,
    gateway: tuple[str, ...],
    destinations: int,
    rate: float,
    keys: int,
    cache_blocks: int,
    max_tokens: int,
    duration: float,
    stats_interval: float,
    max_outstanding: int,
    seed: int,
) -> int:
    """The command line as `LoadArgs`, then `run`."""
    return run(
        LoadArgs(
            gateway=gateway,
            destinations=destinations,
            rate=rate,
            keys=keys,
            cache_blocks=cache_blocks,
            max_tokens=max_tokens,
            duration=duration,
            stats_interval=stats_interval,
            max_outstanding=max_outstanding,
            seed=seed,
        )
    )


def block_text(block: int, chars: int) -> str:
    """`chars` characters that depend only on `block` (one workload block of a prompt)."""
    unit = f"<{block:014x}>"
    reps, rest = divmod(chars, len(unit))
    return unit * reps + unit[:rest]


def prompt_text_for(blocks: IntArray, prompt_tokens: int, block_tokens: int, seq: int) -> str:
    """A prompt of exactly `prompt_tokens` x 4 characters: the blocks' text, then a tail unique
    to request `seq` for the tokens past the last full block."""
    chars = block_tokens * CHARS_PER_TOKEN
    head = "".join(block_text(b, chars) for b in blocks.tolist())
    tail = prompt_tokens * CHARS_PER_TOKEN - len(head)
    return head + block_text(-1 - seq, max(0, tail)) if tail > 0 else head


def _percentiles(values: list[float]) -> tuple[float | None, float | None]:
    """p50 and p99 in ms (None when there is nothing to rank)."""
    if not values:
        return None, None
    p50, p99 = np.percentile(np.asarray(values), [50, 99])
    return round(float(p50) * 1000, 2), round(float(p99) * 1000, 2)


@dataclass
class _GatewayStats:
    """What the load generator saw of one gateway."""

    name: str
    port: int
    destinations: int
    sent: int = 0
    ok: int = 0
    failed: int = 0
    ttft: list[float] = field(default_factory=list)
    ttft_window: list[float] = field(default_factory=list)
    load_total: list[int] = field(default_factory=list)
    load_window: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.load_total = [0] * self.destinations
        self.load_window = [0] * self.destinations

    def report(self, dt: float) -> dict[str, Any]:
        p50, p99 = _percentiles(self.ttft)
        r50, r99 = _percentiles(self.ttft_window)
        out = {
            "sent": self.sent,
            "ok": self.ok,
            "failed": self.failed,
            "ttft_p50_ms": p50,
            "ttft_p99_ms": p99,
            "ttft_recent_p50_ms": r50,
            "ttft_recent_p99_ms": r99,
            "load_total": list(self.load_total),
            "load": [round(x / dt, 2) if dt > 0 else 0.0 for x in self.load_window],
        }
        self.ttft_window = []
        self.load_window = [0] * self.destinations
        return out


class _FlatLBShadow:
    """The same requests under Flat-LB: P2C on in-flight counts over simulated block LRU caches."""

    def __init__(self, destinations: int, cache_blocks: int, max_blocks: int, seed: int) -> None:
        names = [f"d{i}" for i in range(destinations)]
        self.router = Router(names, rng=random.Random(seed), cold_affinity=False)  # noqa: S311
        self.cache = new_cache(destinations, cache_blocks)
        warm_up()  # compile the cache kernel now: the load's clock has not started
        self.r = destinations
        self.scratch = np.zeros(max(1, max_blocks), dtype=np.int64)
        self.hit = self.prompt = 0
        self.win_hit = self.win_prompt = 0
        self.load_total = [0] * destinations

    def send(self, key: str, blocks: IntArray, prompt: int, block_tokens: int) -> int:
        """Route and serve one request; returns its destination (release it when it ends)."""
        d = self.router.route_index(key)
        self.router.acquire(d)
        c = self.cache
        matched = cache_lookup_insert(
            c.cap, c.tkeys, c.tvals, c.ekey, c.eprev, c.enext, c.dstate, self.r, d, blocks,
            self.scratch,
        )  # fmt: skip
        hit = min(int(matched) * block_tokens, prompt)
        self.hit += hit
        self.prompt += prompt
        self.win_hit += hit
        self.win_prompt += prompt
        self.load_total[d] += 1
        return d

    def report(self) -> dict[str, Any]:
        out = {
            "hit_rate": self.hit / self.prompt if self.prompt else None,
            "hit_rate_recent": self.win_hit / self.win_prompt if self.win_prompt else None,
            "load_total": list(self.load_total),
        }
        self.win_hit = self.win_prompt = 0
        return out


class _LoadGen:
    """Schedules the workload's requests, sends them and keeps the stats."""

    def __init__(self, args: LoadArgs, reqs: RequestSet) -> None:
        self.args = args
        self.reqs = reqs
        self.names = [f"d{i}" for i in range(args.destinations)]
        self.index = {n: i for i, n in enumerate(self.names)}
        self.gateways: list[_GatewayStats] = []
        for spec in args.gateway:
            name, _, port = spec.partition("=")
            self.gateways.append(_GatewayStats(name, int(port), args.destinations))
        max_blocks = int(np.diff(reqs.block_offsets).max(initial=1))
        self.shadow = _FlatLBShadow(args.destinations, args.cache_blocks, max_blocks, args.seed)
        self.failures: Counter[str] = Counter()
        self.stop = asyncio.Event()
        self.tasks: set[asyncio.Task[None]] = set()
        self.seq = 0
        self.sent = self.ok = 0
        self.ok_window = 0
        self.all_ttft: list[float] = []
        self.t0 = self.last_report = time.perf_counter()
        self.session: aiohttp.ClientSession | None = None

    async def one(self, gw: _GatewayStats, j: int, seq: int, at: float) -> None:
        """Send request j (the seq-th sent) to `gw`, timed from its scheduled arrival `at`."""
        reqs = self.reqs
        blocks = reqs.block_ids[reqs.block_offsets[j] : reqs.block_offsets[j + 1]]
        prompt = int(reqs.prompt_tokens[j])
        key = reqs.keys[int(reqs.key_index[j])]
        body = orjson.dumps(
            {
                "model": MODEL,
                "prompt": prompt_text_for(blocks, prompt, reqs.block_tokens, seq),
                "max_tokens": self.args.max_tokens,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
        )
        shadow_d = self.shadow.send(key, blocks, prompt, reqs.block_tokens)
        gw.sent += 1
        self.sent += 1
        assert self.session is not None
        try:
            async with self.session.post(
                f"http://127.0.0.1:{gw.port}{COMPLETIONS_PATH}",
                data=body,
                headers={"Content-Type": "application/json", "x-session-id": key},
            ) as resp:
                first: float | None = None
                async for _ in resp.content.iter_any():
                    if first is None:
                        first = time.perf_counter()
                if resp.status != 200 or first is None:
                    self._failed(gw, f"HTTP {resp.status}")
                    return
                backend = self.index.get(resp.headers.get(BACKEND_HEADER, ""))
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            self._failed(gw, type(exc).__name__)
            return
        finally:
            self.shadow.router.release(shadow_d)
        ttft = first - at
        gw.ok += 1
        gw.ttft.append(ttft)
        gw.ttft_window.append(ttft)
        self.all_ttft.append(ttft)
        self.ok += 1
        self.ok_window += 1
        if backend is not None:
            gw.load_total[backend] += 1
            gw.load_window[backend] += 1

    def _failed(self, gw: _GatewayStats, why: str) -> None:
        gw.failed += 1
        if not self.failures[why]:
            log.warning("a request to %s failed (%s); counting the others", gw.name, why)
        self.failures[why] += 1

    def report(self, *, final: bool = False) -> None:
        """Write one stats line (windowed figures cover the time since the last line)."""
        now = time.perf_counter()
        dt, self.last_report = max(now - self.last_report, 1e-9), now
        p50, p99 = _percentiles(self.all_ttft)
        line = {
            "loadgen": True,
            "t": round(time.perf_counter() - self.t0, 3),
            "offered_rate": self.args.rate,
            "achieved_rate": round(self.ok_window / dt, 1) if dt > 0 else 0.0,
            "sent": self.sent,
            "ok": self.ok,
            "failed": dict(self.failures),
            "outstanding": len(self.tasks),
            "ttft_p50_ms": p50,
            "ttft_p99_ms": p99,
            "gateways": {g.name: g.report(dt) for g in self.gateways},
            "flat_lb": self.shadow.report(),
            "final": final,
        }
        self.ok_window = 0
        sys.stdout.write(orjson.dumps(line).decode() + "\n")
        sys.stdout.flush()

    async def reporter(self) -> None:
        """A stats line every interval; stops the run when the parent process is gone."""
        parent = os.getppid()
        while not self.stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop.wait(), self.args.stats_interval)
            if os.getppid() != parent:
                log.warning("parent process gone: stopping")
                self.stop.set()
            if not self.stop.is_set():
                self.report()

    async def run(self) -> None:
        """Send every request at its time until stopped; then drain, cancel, report."""
        reqs, args = self.reqs, self.args
        times = reqs.times
        n = reqs.n
        span = float(reqs.duration) + 1.0 / args.rate
        g = len(self.gateways)
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=30)
        timeout = aiohttp.ClientTimeout(total=60, connect=5)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            self.session = session
            reporter = asyncio.create_task(self.reporter())
            self.t0 = self.last_report = t0 = time.perf_counter()
            j = cycle = 0
            while not self.stop.is_set():
                at = t0 + float(times[j]) + cycle * span
                if at - t0 >= args.duration:
                    break
                delay = at - time.perf_counter()
                if delay > 0:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self.stop.wait(), delay)
                    continue
                gw = self.gateways[self.seq % g]
                if len(self.tasks) >= args.max_outstanding:  # overloaded: drop, as a client would
                    self._failed(gw, "client gave up (too many outstanding)")
                else:
                    task = asyncio.create_task(self.one(gw, j, self.seq, at))
                    self.tasks.add(task)
                    task.add_done_callback(self.tasks.discard)
                self.seq += 1
                j += 1
                if j == n:
                    j = 0
                    cycle += 1
            self.stop.set()
            await reporter
            if self.tasks:
                log.warning(
                    "stopping: %d requests in flight, %.0f s to finish", len(self.tasks), DRAIN_S
                )
                _, pending = await asyncio.wait(set(self.tasks), timeout=DRAIN_S)
                for task in pending:
                    task.cancel()
                if pending:
                    await asyncio.gather(*pending, return_exceptions=True)
            self.report(final=True)
            log.warning(
                "sent %d requests in %.0f s, %d answered, failures %s",
                self.sent,
                time.perf_counter() - t0,
                self.ok,
                dict(self.failures) or "none",
            )


def main(argv: list[str] | None = None) -> int:
    """Parse `argv` (click, as every other command) and run the load; the exit code."""
    return run_child_command(command, argv, "python -m cacheroute.demo.httpload")


def run(args: LoadArgs) -> int:
    """Run the load generator until stopped; returns the exit code."""
    setup_logging(logging.WARNING)
    period = min(args.duration + 10.0, MAX_PERIOD_S)
    spec = spec_for(
        "paper", keys=args.keys, requests=max(2, int(args.rate * period)), rate=args.rate
    )
    reqs = generate(spec, np.random.default_rng(args.seed))

    async def amain() -> None:
        gen = _LoadGen(args, reqs)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, gen.stop.set)
        await gen.run()

    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        runner.run(amain())
    return 0


if __name__ == "__main__":
    sys.exit(main())
