"""`cacheroute bench dispatcher`: routing speed and plan-swap stall inside one CPython process.

Workload: the planner's paper-like 128,824-key workload on 30 destinations; a plan is built with
the real planner; requests draw keys by rate (so admitted and cold keys mix as in production) and
hold an in-flight slot (acquire ... release) across a window of 64 outstanding requests.

Figures:
- decisions_per_s: the documented API, `dispatcher.request(key)` entered and exited, with 64
  requests held in flight and released in arrival order (so the least-loaded and spill branches see
  real counts); single thread, no timers in the loop;
- route_index_per_s: the bare `route_index` + `acquire` + `release` calls, the same stream and
  window (the floor under the API's own cost);
- p50_ns / p99_ns / p999_ns: one decision of the documented API (its `request(key).__enter__()`
  plus, when it leaves the window, its `__exit__()`), timed with perf_counter_ns, with the timer's
  own cost (`timer_overhead_ns`, measured in the same run) subtracted for each of the two timings;
- swap_max_stall_ms: the worst single route() latency seen by a routing thread while another
  thread applies a new 128k-key plan version (builds its routing table and swaps it in);
- receive_p50/p99/max_stall_ms: the same, per version over `receive_versions` (20) new versions
  (rates drifted a little each), but the other thread takes each version through the whole
  gateway path first: the encoded Kafka records (chunks + header, as the planner publishes them)
  are assembled, checksummed, decoded and validated by the follower's `PlanAssembler`, then
  applied; `receive_ms` is the mean time that takes;
- receive_hog_p50/max_stall_ms: the same over `hog_versions` more versions while a third thread
  of the process spins on pure Python (a CPU-bound task competing for the GIL);
- baseline_max_stall_ms: the routing thread's worst call over an equally long window with nothing
  else running, so the scheduler's own noise is visible;
- compiled_routing: whether `cacheroute.dispatcher.routing` runs compiled (mypyc, built by
  setup.py at install) or as Python (`CACHEROUTE_PURE_PYTHON=1` at install, or no C compiler);
- switch_interval_ms: Python's thread switch interval during the run: the dispatcher is started
  as a gateway's is (`DispatcherConfig.switch_interval_s`, 0.5 ms), so the interpreter hands the
  GIL from a builder to a waiting router within that.

Scaffolding: the benchmark's own large containers that a gateway does not have (the 200,000
timed latencies, the set used to count admitted requests, the planner's objects of the versions
it encodes) are dropped before the stalls are measured, and what stays (the 1M-key stream the
routing thread reads, the encoded versions) is collected once before each measured phase, as
benchmarks do, so it is not young inside one. A young collection that meets such a container
visits every item with the GIL held (the stream: 11-12 ms, a 200,000-item list: ~4 ms), which
would time the benchmark, not the dispatcher. Nothing else about the process is tuned: the
collector keeps CPython's default thresholds (`cacheroute gateway` raises them,
`serve.tune_gc`).
"""

from __future__ import annotations

import gc
import random
import statistics
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np

from cacheroute.dispatcher.dispatcher import Dispatcher
from cacheroute.dispatcher.routing import COMPILED_FROM
from cacheroute.planner import PlannerParams, build_plan
from cacheroute.planner.assembly import Applied, PlanAssembler
from cacheroute.planner.protocol import HEADER_KEY, chunk_key, encode_plan
from cacheroute.planner.workload import default_q_cap, paper_workload

__all__ = ["bench_dispatcher"]


def _yield_gil() -> None:
    time.sleep(0)


def _stream(keys: list[str], rates: np.ndarray, n: int, rng: np.random.Generator) -> list[str]:
    p = rates / rates.sum()
    idx = rng.choice(len(keys), size=n, p=p)
    return [keys[i] for i in idx.tolist()]


def _timed_requests(d: Dispatcher, stream: list[str], overhead_ns: float) -> list[float]:
    """Per decision of the documented API: enter (route + acquire) and exit (release), 64 held."""
    request = d.request
    clock = time.perf_counter_ns
    out = [0.0] * len(stream)
    window: deque[tuple[int, Any]] = deque()
    for n, key in enumerate(stream):
        t0 = clock()
        held = request(key)
        held.__enter__()
        out[n] = clock() - t0 - overhead_ns
        window.append((n, held))
        if len(window) > 64:
            m, old = window.popleft()
            t0 = clock()
            old.__exit__(None, None, None)
            out[m] += clock() - t0 - overhead_ns
    while window:
        window.popleft()[1].__exit__(None, None, None)
    return out


def _stall_during(d: Dispatcher, stream: list[str], action: Any) -> tuple[float, int]:
    """Max single route() latency (ms) in a routing thread while `action()` runs here."""
    worst = [0]
    count = [0]
    started = threading.Event()
    stop = threading.Event()

    def router() -> None:
        route = d.route_index
        clock = time.perf_counter_ns
        i = 0
        n = len(stream)
        started.set()
        while not stop.is_set():
            t0 = clock()
            route(stream[i])
            dt = clock() - t0
            worst[0] = max(worst[0], dt)
            i = i + 1 if i + 1 < n else 0
            count[0] += 1

    thread = threading.Thread(target=router)
    thread.start()
    started.wait()
    time.sleep(0.05)
    worst[0] = 0
    action()
    stop.set()
    thread.join()
    return worst[0] / 1e6, count[0]


def _with_cpu_hog(work: Callable[[], list[float]]) -> list[float]:
    """`work()` while another thread of this process spins on pure Python (a CPU-bound task
    that wants the GIL all the time)."""
    stop = threading.Event()

    def hog() -> None:
        n = 0
        while not stop.is_set():
            for _ in range(1000):
                n += 1

    thread = threading.Thread(target=hog, daemon=True)
    thread.start()
    try:
        return work()
    finally:
        stop.set()
        thread.join()


def _throughput(d: Dispatcher, stream: list[str]) -> float:
    """Seconds for `with d.request(key)` of every key, 64 requests outstanding (FIFO release)."""
    request = d.request
    window: deque[Any] = deque()
    began = time.perf_counter()
    for key in stream:
        held = request(key)
        held.__enter__()
        window.append(held)
        if len(window) > 64:
            window.popleft().__exit__(None, None, None)
    elapsed = time.perf_counter() - began
    while window:
        window.popleft().__exit__(None, None, None)
    return elapsed


def _bare_throughput(d: Dispatcher, stream: list[str]) -> float:
    """Seconds for bare route_index + acquire + release of every key, 64 outstanding."""
    route, acquire, release = d.route_index, d.acquire, d.release
    window: deque[int] = deque()
    began = time.perf_counter()
    for key in stream:
        i = route(key)
        acquire(i)
        window.append(i)
        if len(window) > 64:
            release(window.popleft())
    elapsed = time.perf_counter() - began
    while window:
        release(window.popleft())
    return elapsed


def _timer_overhead_ns() -> float:
    clock = time.perf_counter_ns
    overhead = []
    for _ in range(20_000):
        t0 = clock()
        overhead.append(clock() - t0)
    return float(statistics.median(overhead))


def _encoded_versions(
    work: Any, names: list[str], params: PlannerParams, seed: int, count: int
) -> list[list[tuple[bytes, bytes]]]:
    """`count` new versions (rates drifted a little each), as the planner's Kafka records."""
    drift = np.random.default_rng(seed + 1)
    out = []
    for v in range(3, 3 + count):
        rates = work.rates * np.exp(drift.normal(0.0, 0.05, len(work.rates)))
        plan = build_plan(
            work.keys, rates, names, params, version=v, created_ms=int(time.time() * 1000)
        )
        encoded = encode_plan(plan)
        records = [(chunk_key(i), c) for i, c in enumerate(encoded.chunks)]
        records.append((HEADER_KEY, encoded.header_bytes))
        out.append(records)
    return out


def bench_dispatcher(
    keys: int = 128_824,
    destinations: int = 30,
    decisions: int = 1_000_000,
    seed: int = 0,
    versions: int = 20,
) -> dict[str, Any]:
    """Run the benchmark described in the module docstring."""
    rng = np.random.default_rng(seed)
    work = paper_workload(keys, rng)
    names = [f"d{i}" for i in range(destinations)]
    total = float(work.rates.sum())
    params = PlannerParams(q_cap=default_q_cap(total), warm_slots=2048)
    plan1 = build_plan(
        work.keys, work.rates, names, params, version=1, created_ms=int(time.time() * 1000)
    )
    plan2 = build_plan(
        work.keys,
        work.rates[::-1].copy(),
        names,
        params,
        version=2,
        created_ms=int(time.time() * 1000),
    )
    d = Dispatcher(names, rng=random.Random(seed))  # noqa: S311 - load balancing, seeded
    d.start()  # as a following gateway runs: maintenance thread, thread switch interval
    d.apply_plan(plan1)
    stream = _stream(work.keys, work.rates, decisions, rng)
    admitted = set(plan1.keys)
    admitted_share = sum(1 for k in stream[:100_000] if k in admitted) / min(len(stream), 100_000)
    del admitted  # the bench's own objects, not a gateway's: see "Scaffolding" above

    gc.collect()  # the setup's objects (the 1M-key stream...) leave the young generations
    elapsed = _throughput(d, stream)
    bare = _bare_throughput(d, stream)
    overhead_ns = _timer_overhead_ns()
    lat = sorted(_timed_requests(d, stream[:200_000], overhead_ns))
    p50_ns, p99_ns, p999_ns = (round(lat[int(len(lat) * q)]) for q in (0.5, 0.99, 0.999))
    del lat

    # swap stall: apply a ready plan (build the table, swap it in) while a thread routes
    t_apply = [0.0]

    def apply() -> None:
        t0 = time.perf_counter()
        d.apply_plan(plan2)
        t_apply[0] = time.perf_counter() - t0

    stall_ms, routed_during = _stall_during(d, stream, apply)

    # receive stalls: take new versions from their Kafka records to the live table, each
    # while a thread routes; then again with a CPU-bound thread competing for the GIL
    hogged = max(1, versions // 2)
    encoded_versions = _encoded_versions(work, names, params, seed, versions + hogged)
    gc.collect()  # scaffolding made since the last collect leaves the young generations
    receive_s: list[float] = []

    def receive(records: list[tuple[bytes, bytes]]) -> None:
        t0 = time.perf_counter()
        assembler = PlanAssembler(pause=_yield_gil)
        for key, value in records:
            outcome = assembler.offer(key, value)
            if isinstance(outcome, Applied):
                d.apply_plan(outcome.plan)
            else:
                time.sleep(0)
        receive_s.append(time.perf_counter() - t0)

    stalls = [
        _stall_during(d, stream, lambda r=r: receive(r))[0] for r in encoded_versions[:versions]
    ]
    hog_stalls = _with_cpu_hog(
        lambda: [
            _stall_during(d, stream, lambda r=r: receive(r))[0] for r in encoded_versions[versions:]
        ]
    )
    mean_receive = statistics.fmean(receive_s[:versions])
    base_ms, _ = _stall_during(d, stream, lambda: time.sleep(max(mean_receive, 0.05)))
    encoded = encode_plan(plan1)
    return {
        "keys": keys,
        "destinations": destinations,
        "admitted_keys": plan1.n_admitted,
        "admitted_request_share": round(admitted_share, 4),
        "decisions": decisions,
        "decisions_per_s": round(decisions / elapsed),
        "api": "with dispatcher.request(key): 64 in flight, FIFO release",
        "route_index_per_s": round(decisions / bare),
        "p50_ns": p50_ns,
        "p99_ns": p99_ns,
        "p999_ns": p999_ns,
        "timer_overhead_ns": overhead_ns,
        "swap_max_stall_ms": round(stall_ms, 3),
        "baseline_max_stall_ms": round(base_ms, 3),
        "swap_apply_ms": round(t_apply[0] * 1000, 1),
        "receive_versions": versions,
        "receive_p50_stall_ms": round(float(np.percentile(stalls, 50)), 3),
        "receive_p99_stall_ms": round(float(np.percentile(stalls, 99)), 3),
        "receive_max_stall_ms": round(max(stalls), 3),
        "receive_ms": round(mean_receive * 1000, 1),
        "hog_versions": hogged,
        "receive_hog_p50_stall_ms": round(float(np.percentile(hog_stalls, 50)), 3),
        "receive_hog_max_stall_ms": round(max(hog_stalls), 3),
        "switch_interval_ms": round(sys.getswitchinterval() * 1000, 3),
        "compiled_routing": COMPILED_FROM is not None,
        "swap_chunks": len(encoded.chunks),
        "swap_record_bytes": sum(len(c) for c in encoded.chunks) + len(encoded.header_bytes),
        "routed_during_swap": routed_during,
        "version_after_swap": d.version,
    }
