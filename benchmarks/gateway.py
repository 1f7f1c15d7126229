"""`cacheroute bench gateway`: what one gateway costs, measured against going straight to a backend.

It starts `--engines` zero-delay engine stand-ins and one gateway (`--no-kafka`) on 127.0.0.1, and
drives them from this process with an asyncio + aiohttp client (keep-alive pool):

1. saturation: `--concurrency` closed-loop clients for `--duration` seconds through the gateway
   -> `requests_per_s` (non-streamed) and `stream_requests_per_s` (streamed, `--stream-tokens`
   output tokens each); `direct_requests_per_s` is the same client straight to one engine (when
   it is not far above `requests_per_s`, the client or the machine is the limit, not the gateway);
2. latency at half that load: an open-loop arrival stream at 0.5 x the saturation rate, once
   straight to one engine and once through the gateway, in the same run -> p50/p99 of each and
   `added_p50_ms` / `added_p99_ms` (gateway minus direct); the same for streams, to the last
   byte -> `stream_added_p99_ms`. Latency is counted from each request's scheduled start, so a
   client that falls behind shows up as latency (no coordinated omission).

Everything shares this machine's cores (the client too), so the numbers are a floor for what a
gateway on its own cores does; compare numbers from the same run only.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import orjson

from cacheroute.demo.procs import Child, start_child
from cacheroute.errors import CacheRouteError
from cacheroute.loopback import free_port
from cacheroute.serve import loop_factory

__all__ = ["GatewayBench", "run_gateway_bench", "wait_healthy"]

_MODEL = "cacheroute-sim"
_SYSTEM = "You are a helpful assistant for a large software company. Answer briefly. " * 12


@dataclass(frozen=True)
class GatewayBench:
    """Knobs of the benchmark."""

    engines: int = 2
    duration_s: float = 4.0
    concurrency: int = 64
    keys: int = 1000
    stream_tokens: int = 16
    seed: int = 0


def _body(i: int, *, stream: bool, tokens: int) -> bytes:
    return orjson.dumps(
        {
            "model": _MODEL,
            "messages": [
                {"role": "system", "content": _SYSTEM},
                {"role": "user", "content": f"question {i}"},
            ],
            "max_tokens": tokens if stream else 1,
            "stream": stream,
        }
    )


def wait_healthy(child: Child, port: int, path: str = "/health", timeout: float = 30.0) -> None:
    """Wait until `child` answers 200 on `path` (the gateway: /ready with every backend up)."""
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        if not child.alive():
            raise CacheRouteError(f"{child.name} exited during start:\n{child.tail()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=1) as r:
                body = r.read()
                if r.status == 200 and (path != "/ready" or _all_up(body)):
                    return
                last = body.decode("utf-8", "replace")
        except OSError as exc:
            last = str(exc)
        time.sleep(0.1)
    raise CacheRouteError(
        f"{child.name} did not answer {path} in {timeout:.0f} s ({last}):\n{child.tail()}"
    )


def _all_up(ready_body: bytes) -> bool:
    backends = orjson.loads(ready_body).get("backends", {})
    return bool(backends) and all(b.get("up") for b in backends.values())


class _Client:
    """Sends the benchmark's requests and times them."""

    def __init__(self, session: aiohttp.ClientSession, cfg: GatewayBench) -> None:
        self.session = session
        self.cfg = cfg
        self.rng = np.random.default_rng(cfg.seed)
        self.failures: Counter[str] = Counter()
        self.max_outstanding = 8 * cfg.concurrency

    async def one(self, port: int, i: int, *, stream: bool) -> bool:
        """One request, read to its last byte; False (and counted by why) if it failed."""
        headers = {"Content-Type": "application/json", "x-session-id": f"k{i % self.cfg.keys}"}
        body = _body(i, stream=stream, tokens=self.cfg.stream_tokens)
        try:
            async with self.session.post(
                f"http://127.0.0.1:{port}/v1/chat/completions", data=body, headers=headers
            ) as resp:
                async for _ in resp.content.iter_any():
                    pass
                if resp.status != 200:
                    self.failures[f"HTTP {resp.status}"] += 1
                    return False
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            self.failures[type(exc).__name__] += 1
            return False
        return True

    async def saturate(self, port: int, *, stream: bool) -> float:
        """Completed requests per second of `concurrency` closed-loop clients."""
        done = 0
        stop = time.perf_counter() + self.cfg.duration_s

        async def worker(w: int) -> None:
            nonlocal done
            i = w
            while time.perf_counter() < stop:
                ok = await self.one(port, i, stream=stream)
                done += ok  # not `done += await ...`: that reads `done` before the await
                i += self.cfg.concurrency

        t0 = time.perf_counter()
        await asyncio.gather(*(worker(w) for w in range(self.cfg.concurrency)))
        return done / (time.perf_counter() - t0)

    async def open_loop(self, port: int, rate: float, *, stream: bool) -> np.ndarray[Any, Any]:
        """Latencies (s) of Poisson arrivals at `rate`/s for `duration_s`, from scheduled start."""
        n = max(1, int(rate * self.cfg.duration_s))
        starts = np.cumsum(self.rng.exponential(1.0 / rate, n))
        lat = np.full(n, np.nan)
        t0 = time.perf_counter()

        async def timed(j: int) -> None:
            if await self.one(port, j, stream=stream):
                lat[j] = time.perf_counter() - (t0 + starts[j])

        tasks: set[asyncio.Task[None]] = set()
        for j, at in enumerate(starts):
            delay = t0 + at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            if len(tasks) >= self.max_outstanding:  # overloaded: waiting longer says nothing new
                self.failures["client gave up (too many outstanding)"] += 1
                continue
            task = asyncio.create_task(timed(j))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        while tasks:
            await asyncio.gather(*tasks)
        done: np.ndarray[Any, Any] = lat[~np.isnan(lat)]
        return done


def _ms(values: np.ndarray[Any, Any], q: float) -> float:
    return round(float(np.percentile(values, q)) * 1000, 3) if len(values) else float("nan")


async def _measure(
    gw_port: int, direct_port: int, cfg: GatewayBench, say: Callable[[str], None]
) -> dict[str, Any]:
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=30)
    async with aiohttp.ClientSession(connector=connector) as session:
        client = _Client(session, cfg)
        await asyncio.gather(*(client.one(gw_port, i, stream=False) for i in range(64)))  # warm
        out: dict[str, Any] = {}
        say("saturation straight to one engine (what the client and one engine manage) ...")
        out["direct_requests_per_s"] = round(await client.saturate(direct_port, stream=False), 1)
        for stream, prefix in ((False, ""), (True, "stream_")):
            say(f"{prefix or 'plain '}saturation ...")
            rps = await client.saturate(gw_port, stream=stream)
            if rps <= 0:
                raise CacheRouteError(
                    f"no request through the gateway completed in {cfg.duration_s} s "
                    f"({dict(client.failures)})"
                )
            out[f"{prefix}requests_per_s"] = round(rps, 1)
            rate = rps / 2
            say(f"{prefix or 'plain '}latency at {rate:.0f} req/s, direct then via the gateway ...")
            direct = await client.open_loop(direct_port, rate, stream=stream)
            via = await client.open_loop(gw_port, rate, stream=stream)
            out[f"{prefix}half_load_per_s"] = round(rate, 1)
            for name, values in (("direct", direct), ("gateway", via)):
                out[f"{prefix}{name}_p50_ms"] = _ms(values, 50)
                out[f"{prefix}{name}_p99_ms"] = _ms(values, 99)
            out[f"{prefix}added_p50_ms"] = round(_ms(via, 50) - _ms(direct, 50), 3)
            out[f"{prefix}added_p99_ms"] = round(_ms(via, 99) - _ms(direct, 99), 3)
        out["failed_requests"] = dict(client.failures)
        return out


def run_gateway_bench(
    cfg: GatewayBench, say: Callable[[str], None] = lambda _: None
) -> dict[str, Any]:
    """Start the engines and the gateway, measure, stop them (by pid); returns the figures."""
    children: list[Child] = []
    with tempfile.TemporaryDirectory(prefix="cacheroute-bench-gateway-") as tmp:
        logs = Path(tmp)
        try:
            ports = []
            for e in range(cfg.engines):
                port = free_port()
                child = start_child(
                    f"engine-{e}",
                    ["-m", "cacheroute", "engine", "--port", str(port), "--zero-delay"],
                    logs / f"engine-{e}.log",
                )
                children.append(child)
                ports.append(port)
            gw_port = free_port()
            argv = ["-m", "cacheroute", "gateway", "--no-kafka", "--port", str(gw_port)]
            for e, port in enumerate(ports):
                argv += ["--backend", f"e{e}=http://127.0.0.1:{port}"]
            for child, port in zip(children, ports, strict=True):
                wait_healthy(child, port)
            gw = start_child("gateway", argv, logs / "gateway.log")
            children.append(gw)
            wait_healthy(gw, gw_port, "/ready")
            say("measuring ...")
            try:
                runner_result: dict[str, Any] = _run(_measure(gw_port, ports[0], cfg, say))
            except CacheRouteError as exc:
                raise CacheRouteError(f"{exc}\ngateway log:\n{gw.tail()}") from exc
        finally:
            for child in reversed(children):
                child.stop()
    factory = loop_factory()
    return {
        "engines": cfg.engines,
        "concurrency": cfg.concurrency,
        "duration_s": cfg.duration_s,
        "stream_tokens": cfg.stream_tokens,
        "event_loop": "uvloop" if factory is not None else "asyncio",
        **runner_result,
    }


def _run(coro: Awaitable[dict[str, Any]]) -> dict[str, Any]:
    async def main() -> dict[str, Any]:
        return await coro

    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(main())
