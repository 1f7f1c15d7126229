"""`cacheroute bench planner|churn`: the planner's speed, memory and churn, measured offline.

Timing lives here, in the shell (the planner never reads a clock). Every ratio is measured within
one run - fast and reference builds interleaved on the same workload - because this machine is
shared and absolute numbers drift between runs. With --json, stdout is exactly one JSON object;
progress goes to stderr.
"""

from __future__ import annotations

import gc
import statistics
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import click
import numpy as np
import orjson
from rich.console import Console
from rich.table import Table

from cacheroute.cli.options import json_option, q_cap_option, warm_slots_option
from cacheroute.errors import CacheRouteError
from cacheroute.planner import (
    Destination,
    Plan,
    PlannerError,
    PlannerParams,
    build_plan,
    reference_build_plan,
)
from cacheroute.planner.experiment import run_drift_experiment
from cacheroute.planner.plan import FloatArray
from cacheroute.planner.workload import PAPER_KEYS, Workload, default_q_cap, paper_workload
from cacheroute.progress import progress_bar
from cacheroute.settings import Settings

__all__ = ["bench"]

_DEFAULT_WARM_SLOTS = 2048
"""W = 2048 at R = 30 admits ~48% of the paper-like keys, ~95% of the requests: about the paper's
93% KV hit rate. Admission then walks ~62k keys and LPT places ~61k of them."""


@dataclass(frozen=True, slots=True)
class _Shape:
    """The benchmark's cluster and workload knobs (everything but the key count)."""

    destinations: int
    warm_slots: int
    q_cap: float | None
    admission: str
    seed: int


@click.group()
def bench() -> None:
    """Benchmarks that print one JSON object with --json, each with a same-run baseline.

    planner/churn/dispatcher/emitter run offline; streams needs a broker (`cacheroute kafka start`).
    """


@contextmanager
def _errors() -> Iterator[None]:
    try:
        yield
    except PlannerError as exc:
        raise CacheRouteError(str(exc)) from None


def _workload(keys: int, seed: int) -> Workload:
    return paper_workload(keys, np.random.default_rng(seed))


def _params(
    workload: Workload, q_cap: float | None, warm_slots: int, admission: str, **extra: Any
) -> PlannerParams:
    return PlannerParams(
        q_cap=q_cap if q_cap is not None else default_q_cap(float(workload.rates.sum())),
        warm_slots=warm_slots,
        admission="bytes" if admission == "bytes" else "rate",
        **extra,
    )


def _ms(fn: Callable[[], Plan]) -> tuple[float, Plan]:
    start = time.perf_counter()
    result = fn()
    return (time.perf_counter() - start) * 1e3, result


_workload_options = [
    click.option("--keys", default=PAPER_KEYS, show_default=True, type=click.IntRange(min=1)),
    click.option("--destinations", default=30, show_default=True, type=click.IntRange(min=1)),
    warm_slots_option(default=_DEFAULT_WARM_SLOTS),
    q_cap_option("[default: 0.15% of the total rate: whales get k=2]"),
    click.option("--admission", type=click.Choice(["rate", "bytes"]), default="rate"),
    click.option("--seed", default=0, show_default=True, help="Workload seed."),
]


def _with_workload_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    for option in reversed(_workload_options):
        fn = option(fn)
    return fn


@bench.command("planner")
@_with_workload_options
@click.option(
    "--runs",
    default=5,
    show_default=True,
    type=click.IntRange(min=1),
    help="Timed fast builds (after one warm-up); build_ms is their median.",
)
@click.option(
    "--reference-runs",
    default=3,
    show_default=True,
    type=click.IntRange(min=0),
    help="Runs of the slow reference (0: skip it).",
)
@click.option(
    "--memory/--no-memory",
    default=True,
    show_default=True,
    help="Measure peak memory of one build in a fresh subprocess.",
)
@click.option("--scale", is_flag=True, help="Also time --scale-keys keys and report the ratio.")
@click.option("--scale-keys", default=1_000_000, show_default=True, type=click.IntRange(min=1))
@json_option("Print exactly one JSON object.")
@click.pass_obj
def planner_bench(
    settings: Settings,
    *,
    keys: int,
    destinations: int,
    warm_slots: int,
    q_cap: float | None,
    admission: str,
    seed: int,
    runs: int,
    reference_runs: int,
    memory: bool,
    scale: bool,
    scale_keys: int,
    as_json: bool,
) -> None:
    """Fast build vs the plain reference on a paper-like workload (same run, same input)."""
    del settings
    console = Console(stderr=True)
    dests = [f"d{i}" for i in range(destinations)]
    shape = _Shape(destinations, warm_slots, q_cap, admission, seed)
    with _errors(), progress_bar(console) as progress:
        task = progress.add_task("workload", total=None)
        result = _measure(
            _workload(keys, seed),
            dests,
            q_cap=q_cap,
            warm_slots=warm_slots,
            admission=admission,
            runs=runs,
            reference_runs=reference_runs,
            advance=lambda total, what: progress.update(
                task, description=what, total=total, advance=1 if total is None else 0
            ),
        )
        gc.collect()
        if memory:
            progress.update(task, description=f"peak memory at {keys:,} keys (subprocess)")
            result.update(_memory_probe(keys, shape))
        if scale:
            progress.update(task, description=f"scale: {scale_keys:,} keys", total=None)
            result["scale"] = _scale(scale_keys, dests, shape=shape, runs=runs)
            result["scale"]["ratio"] = result["scale"]["build_ms"] / result["build_ms"]
            if memory:
                result["scale"].update(_memory_probe(scale_keys, shape))
    if as_json:
        click.echo(orjson.dumps(result))
    else:
        _render(result, Console())


def _measure(
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
    params = _params(work, q_cap, warm_slots, admission)
    tokens = work.prefix_tokens if admission == "bytes" else None
    rate_list = work.rates.tolist()  # the reference's natural input: plain Python floats
    token_list = tokens.tolist() if tokens is not None else None

    def fast_build() -> Plan:
        return build_plan(work.keys, work.rates, dests, params, prefix_tokens=tokens)

    def reference_build() -> Plan:
        return reference_build_plan(work.keys, rate_list, dests, params, prefix_tokens=token_list)

    first_ms, fast = _ms(fast_build)  # includes loading (or compiling) the numba kernels
    advance(runs + reference_runs, "builds (fast and reference, interleaved)")
    fast_ms: list[float] = []
    ref_ms: list[float] = []
    ref: Plan | None = None
    for i in range(max(runs, reference_runs)):
        if i < runs:
            ms, fast = _ms(fast_build)
            fast_ms.append(ms)
            advance(None, "builds (fast and reference, interleaved)")
        if i < reference_runs:
            ms, ref = _ms(reference_build)
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


def _scale(n: int, dests: Sequence[str], *, shape: _Shape, runs: int) -> dict[str, Any]:
    """Median fast build time at `n` keys (same cluster, W and q_cap rule)."""
    work = _workload(n, shape.seed)
    params = _params(work, shape.q_cap, shape.warm_slots, shape.admission)
    tokens = work.prefix_tokens if shape.admission == "bytes" else None

    def fast_build() -> Plan:
        return build_plan(work.keys, work.rates, dests, params, prefix_tokens=tokens)

    times = [_ms(fast_build)[0] for _ in range(runs + 1)][1:]  # first run: warm caches
    return {"keys": n, "build_ms": statistics.median(times), "build_ms_runs": times}


def _memory_probe(keys: int, shape: _Shape) -> dict[str, Any]:
    """Run `bench memory-probe` in a fresh interpreter, so nothing of this process is counted."""
    argv = [
        sys.executable,
        "-m",
        "cacheroute",
        "bench",
        "memory-probe",
        f"--keys={keys}",
        f"--destinations={shape.destinations}",
        f"--warm-slots={shape.warm_slots}",
        f"--admission={shape.admission}",
        f"--seed={shape.seed}",
    ]
    if shape.q_cap is not None:
        argv.append(f"--q-cap={shape.q_cap!r}")
    done = subprocess.run(argv, capture_output=True, check=False, timeout=600)
    if done.returncode != 0:
        raise CacheRouteError(f"memory probe failed: {done.stderr.decode(errors='replace')}")
    probe: dict[str, Any] = orjson.loads(done.stdout)
    return probe


@bench.command("memory-probe", hidden=True)
@_with_workload_options
def memory_probe(
    *, keys: int, destinations: int, warm_slots: int, q_cap: float | None, admission: str, seed: int
) -> None:
    """(internal) Peak memory of one build: tracemalloc for the build, VmHWM for the process."""
    dests = [f"d{i}" for i in range(destinations)]
    with _errors():
        work = _workload(keys, seed)
        params = _params(work, q_cap, warm_slots, admission)
        tokens = work.prefix_tokens if admission == "bytes" else None
        build_plan(work.keys, work.rates, dests, params, prefix_tokens=tokens)  # compile/load JIT
        gc.collect()
        rss_before = _status_mb("VmRSS")
        tracemalloc.start()
        build_plan(work.keys, work.rates, dests, params, prefix_tokens=tokens)
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    click.echo(
        orjson.dumps(
            {
                "peak_mb": peak / 2**20,
                "process_rss_before_build_mb": rss_before,
                "process_peak_rss_mb": _status_mb("VmHWM"),
            }
        )
    )


def _status_mb(field: str) -> float | None:
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


@bench.command("churn")
@_with_workload_options
@click.option("--intervals", default=6, show_default=True, type=click.IntRange(min=1))
@click.option("--sigma", default=0.3, show_default=True, help="Log-normal drift per interval.")
@click.option(
    "--hysteresis",
    "h",
    default=0.2,
    show_default=True,
    help="Admission hysteresis h of the re-planner.",
)
@click.option("--tolerance", default=1.05, show_default=True, help="max/mean load bound.")
@click.option("--drift-seed", default=1, show_default=True, help="Seed of the drift factors.")
@json_option("Print exactly one JSON object.")
@click.pass_obj
def churn_bench(
    settings: Settings,
    *,
    keys: int,
    destinations: int,
    warm_slots: int,
    q_cap: float | None,
    admission: str,
    seed: int,
    intervals: int,
    sigma: float,
    h: float,
    tolerance: float,
    drift_seed: int,
    as_json: bool,
) -> None:
    """The paper's drift experiment: rebuild from scratch vs churn-aware re-planning."""
    del settings
    console = Console(stderr=True)
    dests = [f"d{i}" for i in range(destinations)]
    timings: dict[str, list[float]] = {"scratch": [], "hysteresis": []}

    def timed(
        keys: Sequence[str],
        rates: FloatArray,
        destinations: Sequence[str | Destination],
        params: PlannerParams,
        *,
        prev: Plan | None = None,
    ) -> Plan:
        ms, built = _ms(lambda: build_plan(keys, rates, destinations, params, prev=prev))
        timings["hysteresis" if prev is not None else "scratch"].append(ms)
        return built

    with _errors(), progress_bar(console) as progress:
        task = progress.add_task("workload", total=None)
        work = _workload(keys, seed)
        params = _params(
            work, q_cap, warm_slots, admission, hysteresis=h, imbalance_tolerance=tolerance
        )
        if admission == "bytes":
            raise CacheRouteError("bench churn drifts rates only; use --admission rate")
        progress.update(task, description="intervals", total=intervals)
        series = run_drift_experiment(
            work.keys,
            work.rates,
            dests,
            params,
            intervals=intervals,
            sigma=sigma,
            rng=np.random.default_rng(drift_seed),
            build=timed,
            on_interval=lambda _: progress.advance(task),
        )
    scratch = series["scratch"].summary()
    hyst = series["hysteresis"].summary()
    result = {
        "keys": keys,
        "destinations": destinations,
        "intervals": intervals,
        "sigma": sigma,
        "params": {
            "q_cap": params.q_cap,
            "warm_slots": warm_slots,
            "hysteresis": h,
            "imbalance_tolerance": tolerance,
            "seed": seed,
            "drift_seed": drift_seed,
        },
        "scratch": scratch | {"build_ms_mean": statistics.mean(timings["scratch"][1:])},
        "hysteresis": hyst | {"build_ms_mean": statistics.mean(timings["hysteresis"])},
        "target_met": hyst["moved_rate_fraction"] <= 0.10 and hyst["max_over_mean"] <= tolerance,
    }
    if as_json:
        click.echo(orjson.dumps(result))
    else:
        _render(result, Console())


def _render(result: dict[str, Any], console: Console) -> None:
    table = Table(show_header=False)
    for name, value in _flatten(result):
        shown = f"{value:.6g}" if isinstance(value, float) else str(value)
        table.add_row(name, shown)
    console.print(table)


def _flatten(data: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    for name, value in data.items():
        if isinstance(value, dict):
            yield from _flatten(value, f"{prefix}{name}.")
        elif not isinstance(value, list):
            yield f"{prefix}{name}", value


@bench.command("streams")
@click.option("--events", default=1_000_000, show_default=True, help="Request events to ingest.")
@click.option("--keys", default=100_000, show_default=True, help="Distinct routing keys.")
@click.option("--seed", default=0, show_default=True, help="Workload seed.")
@json_option("Print exactly one JSON object.")
@click.pass_obj
def bench_streams_cmd(settings: Any, events: int, keys: int, seed: int, as_json: bool) -> None:
    """Streams agent ingest (events/s) vs a plain consumer on the real broker, plus emit() cost.

    Needs a broker (`cacheroute kafka start`). Creates and deletes its own topics.
    """
    from cacheroute.benchmarks.streams import bench_streams  # noqa: PLC0415 - needs Kafka; lazy

    result = bench_streams(settings, events, keys, seed)
    _emit_result("streams benchmark", result, as_json=as_json)


@bench.command("emitter")
@click.option("--events", default=1_000_000, show_default=True, help="emit() calls.")
@click.option("--keys", default=100_000, show_default=True, help="Distinct routing keys.")
@click.option("--seed", default=0, show_default=True, help="Workload seed.")
@click.option("--broker", is_flag=True, help="Also measure emit+flush into a real broker.")
@json_option("Print exactly one JSON object.")
@click.pass_obj
def bench_emitter_cmd(
    settings: Any, events: int, keys: int, seed: int, broker: bool, as_json: bool
) -> None:
    """Cost of the gateway emitter's emit() (ns/call) against a list-append baseline."""
    from cacheroute.benchmarks.emitter import bench_emitter  # noqa: PLC0415

    result = bench_emitter(events, keys, seed=seed, settings=settings if broker else None)
    _emit_result("emitter benchmark", result, as_json=as_json)


@bench.command("dispatcher")
@click.option("--keys", default=128_824, show_default=True, help="Keys in the workload/plan.")
@click.option("--destinations", default=30, show_default=True, help="Destinations.")
@click.option("--decisions", default=1_000_000, show_default=True, help="Routing decisions.")
@click.option("--seed", default=0, show_default=True, help="Workload seed.")
@json_option("Print exactly one JSON object.")
def bench_dispatcher_cmd(
    keys: int, destinations: int, decisions: int, seed: int, as_json: bool
) -> None:
    """Routing decisions/s, per-call p50/p99, and the worst stall while a new plan is applied."""
    from cacheroute.benchmarks.dispatcher import bench_dispatcher  # noqa: PLC0415

    with Console(stderr=True).status("routing ..."):
        result = bench_dispatcher(keys, destinations, decisions, seed)
    _emit_result("dispatcher benchmark", result, as_json=as_json)


def _emit_result(title: str, result: dict[str, Any], *, as_json: bool) -> None:
    """One JSON object on stdout with --json, else a two-column table."""
    if as_json:
        click.echo(orjson.dumps(result).decode())
        return
    table = Table(title=title, title_justify="left")
    table.add_column("figure")
    table.add_column("value", justify="right")
    for k, v in result.items():
        table.add_row(k, str(v))
    Console().print(table)


@bench.command("gateway")
@click.option("--engines", default=2, show_default=True, type=click.IntRange(min=1))
@click.option(
    "--duration",
    default=4.0,
    show_default=True,
    type=click.FloatRange(min=0.5),
    help="Seconds per phase.",
)
@click.option(
    "--concurrency",
    default=64,
    show_default=True,
    type=click.IntRange(min=1),
    help="Closed-loop clients.",
)
@click.option("--stream-tokens", default=16, show_default=True, type=click.IntRange(min=1))
@click.option("--seed", default=0, show_default=True, help="Arrival-time seed.")
@json_option("Print exactly one JSON object.")
def bench_gateway_cmd(
    engines: int, duration: float, concurrency: int, stream_tokens: int, seed: int, as_json: bool
) -> None:
    """One gateway in front of zero-delay engines: req/s at saturation, and the latency it adds at
    half that load against the same client going straight to an engine (plain and streamed)."""
    from cacheroute.benchmarks.gateway import GatewayBench, run_gateway_bench  # noqa: PLC0415

    cfg = GatewayBench(
        engines=engines,
        duration_s=duration,
        concurrency=concurrency,
        stream_tokens=stream_tokens,
        seed=seed,
    )
    console = Console(stderr=True)
    with console.status("starting engines and a gateway ...") as status:
        result = run_gateway_bench(cfg, say=status.update)
    _emit_result("gateway benchmark", result, as_json=as_json)


@bench.command("propagation")
@click.option(
    "--gateways",
    default=8,
    show_default=True,
    type=click.IntRange(min=1),
    help="Gateway processes, each a real Dispatcher following the plans topic.",
)
@click.option(
    "--keys",
    default=PAPER_KEYS,
    show_default=True,
    type=click.IntRange(min=400),
    help="Keys of the paper-like workload the plans are built from.",
)
@click.option(
    "--versions",
    default=5,
    show_default=True,
    type=click.IntRange(min=1),
    help="Timed plan versions per phase (each phase also publishes one untimed warm-up).",
)
@click.option(
    "--destinations",
    default=30,
    show_default=True,
    type=click.IntRange(min=1),
    help="Destinations in the plans (and in every gateway).",
)
@click.option(
    "--interval",
    default=3.0,
    show_default=True,
    type=click.FloatRange(min=0.5),
    help="Least seconds between two commits; a version also waits for every gateway.",
)
@click.option("--seed", default=0, show_default=True, help="Workload and drift seed.")
@json_option("Print exactly one JSON object.")
@click.pass_obj
def bench_propagation_cmd(
    settings: Settings,
    gateways: int,
    keys: int,
    versions: int,
    destinations: int,
    interval: float,
    seed: int,
    as_json: bool,
) -> None:
    """Planner commit -> applied in every gateway's Dispatcher: p50/p99/max over (version,
    gateway), against one gateway in the same run.

    Needs a broker (`cacheroute kafka start`). Gateways are child processes, stopped at the end;
    the run's topics are created and deleted.
    """
    from cacheroute.benchmarks.propagation import (  # noqa: PLC0415 - needs Kafka; lazy
        PropagationBench,
        run_propagation_bench,
        total_steps,
    )

    cfg = PropagationBench(
        gateways=gateways,
        keys=keys,
        versions=versions,
        destinations=destinations,
        interval_s=interval,
        seed=seed,
    )
    progress = progress_bar(Console(stderr=True))
    progress.disable = progress.disable or as_json  # --json: stdout and stderr stay quiet
    steps = total_steps(cfg)
    with progress:
        task = progress.add_task("plan propagation", total=steps)
        started = [0]

        def advance(description: str) -> None:
            progress.update(task, description=description, completed=started[0])
            started[0] += 1

        result = run_propagation_bench(settings, cfg, advance)
        progress.update(task, completed=steps)
    _emit_result("plan propagation benchmark", result, as_json=as_json)
