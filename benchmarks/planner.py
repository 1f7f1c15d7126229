"""The planner's benchmarks: fast build vs the plain reference, scale, peak memory, churn.

Timing lives here, outside the planner (the planner never reads a clock). Every ratio is measured
within one run - fast and reference builds interleaved on the same workload - because this
machine is shared and absolute numbers drift between runs. `cacheroute bench planner|churn` wires
these to the command line (progress, JSON).
"""

from __future__ import annotations

import gc
import statistics
import time
import tracemalloc
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from cacheroute.planner import Plan, PlannerParams, build_plan, reference_build_plan
from cacheroute.planner.workload import Workload, default_q_cap, paper_workload

__all__ = [
    "DEFAULT_WARM_SLOTS",
    "Shape",
    "build_peak_memory",
    "measure_builds",
    "params_for",
    "scale_build",
    "timed_ms",
    "workload",
]

DEFAULT_WARM_SLOTS = 2048
"""W = 2048 at R = 30 admits ~48% of the paper-like keys, ~95% of the requests: about the paper's
93% KV hit rate. Admission then walks ~62k keys and LPT places ~61k of them."""


@dataclass(frozen=True, slots=True)
class Shape:
    """The benchmark's cluster and workload knobs (everything but the key count)."""

    destinations: int
    warm_slots: int
    q_cap: float | None
    admission: str
    seed: int


def workload(keys: int, seed: int) -> Workload:
    return paper_workload(keys, np.random.default_rng(seed))


def params_for(
    workload: Workload, q_cap: float | None, warm_slots: int, admission: str, **extra: Any
) -> PlannerParams:
    return PlannerParams(
        q_cap=q_cap if q_cap is not None else default_q_cap(float(workload.rates.sum())),
        warm_slots=warm_slots,
        admission="bytes" if admission == "bytes" else "rate",
        **extra,
    )


def timed_ms(fn: Callable[[], Plan]) -> tuple[float, Plan]:
    start = time.perf_counter()
    result = fn()
    return (time.perf_counter() - start) * 1e3, result


def measure_builds(
    work: Workload,
    dests: Sequence[str],
    *,
    q_cap: float | None,
    warm_slots: int,
    admission: str,
    runs: int,
    reference_runs: int,
    advance: Callable[[int | None, str], None],
) -> dict[str, Any]:
    """Interleaved fast and reference builds of one workload: noise hits both alike."""
    params = params_for(work, q_cap, warm_slots, admission)
    tokens = work.prefix_tokens if admission == "bytes" else None
    rate_list = work.rates.tolist()  # the reference's natural input: plain Python floats
    token_list = tokens.tolist() if tokens is not None else None

    def fast_build() -> Plan:
        return build_plan(work.keys, work.rates, dests, params, prefix_tokens=tokens)

    def reference_build() -> Plan:
        return reference_build_plan(work.keys, rate_list, dests, params, prefix_tokens=token_list)

    first_ms, fast = timed_ms(fast_build)  # includes loading (or compiling) the numba kernels
    advance(runs + reference_runs, "builds (fast and reference, interleaved)")
    fast_ms: list[float] = []
    ref_ms: list[float] = []
    ref: Plan | None = None
    for i in range(max(runs, reference_runs)):
        if i < runs:
            ms, fast = timed_ms(fast_build)
            fast_ms.append(ms)
            advance(None, "builds (fast and reference, interleaved)")
        if i < reference_runs:
            ms, ref = timed_ms(reference_build)
            ref_ms.append(ms)
            advance(None, "builds (fast and reference, interleaved)")
    fast.validate()
    build_ms = statistics.median(fast_ms)
    reference_ms = statistics.median(ref_ms) if ref_ms else None
    return {
        "keys": len(work.keys),
        "destinations": len(dests),
        "warm_slots": warm_slots,
        "q_cap": params.q_cap,
        "admission": admission,
        "workload": work.stats(),
        "admitted_keys": fast.n_admitted,
        "slots_used": fast.slots_used,
        "multi_replica_keys": int(np.count_nonzero(fast.replicas() > 1)),
        "capped_keys": fast.stats.capped_keys,
        "max_over_mean": fast.max_over_mean(),
        "runs": runs,
        "build_ms": build_ms,
        "build_ms_runs": fast_ms,
        "first_build_ms": first_ms,
        "reference_runs": reference_runs,
        "reference_ms": reference_ms,
        "reference_ms_runs": ref_ms,
        "speedup": reference_ms / build_ms if reference_ms is not None else None,
        "identical": fast.routing_equal(ref) if ref is not None else None,
    }


def scale_build(n: int, dests: Sequence[str], *, shape: Shape, runs: int) -> dict[str, Any]:
    """Median fast build time at `n` keys (same cluster, W and q_cap rule)."""
    work = workload(n, shape.seed)
    params = params_for(work, shape.q_cap, shape.warm_slots, shape.admission)
    tokens = work.prefix_tokens if shape.admission == "bytes" else None

    def fast_build() -> Plan:
        return build_plan(work.keys, work.rates, dests, params, prefix_tokens=tokens)

    times = [timed_ms(fast_build)[0] for _ in range(runs + 1)][1:]  # first run: warm caches
    return {"keys": n, "build_ms": statistics.median(times), "build_ms_runs": times}


def status_mb(field: str) -> float | None:
    """A memory figure of this process from /proc/self/status (Linux), in MiB.

    VmHWM rather than getrusage's ru_maxrss: Linux carries ru_maxrss across exec, so a child
    started by a big parent would report the parent's peak.
    """
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def build_peak_memory(keys: int, shape: Shape) -> dict[str, float | None]:
    """Peak memory of one build in this process: tracemalloc for the build, VmHWM for the process.

    Run it in a fresh interpreter (`bench memory-probe`), so nothing else is counted."""
    dests = [f"d{i}" for i in range(shape.destinations)]
    work = workload(keys, shape.seed)
    params = params_for(work, shape.q_cap, shape.warm_slots, shape.admission)
    tokens = work.prefix_tokens if shape.admission == "bytes" else None
    build_plan(work.keys, work.rates, dests, params, prefix_tokens=tokens)  # compile/load JIT
    gc.collect()
    rss_before = status_mb("VmRSS")
    tracemalloc.start()
    build_plan(work.keys, work.rates, dests, params, prefix_tokens=tokens)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return {
        "peak_mb": peak / 2**20,
        "process_rss_before_build_mb": rss_before,
        "process_peak_rss_mb": status_mb("VmHWM"),
    }
