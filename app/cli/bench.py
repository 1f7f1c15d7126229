"""`cacheroute bench ...`: the command line of the benchmarks in `cacheroute.benchmarks`.

Each command parses its options, shows progress on stderr and prints the benchmark's result (with
--json, stdout is exactly one JSON object). What is measured and how lives in the benchmark
modules.
"""

from __future__ import annotations

import gc
import statistics
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import click
import numpy as np
import orjson
from rich.console import Console
from rich.table import Table

from cacheroute.benchmarks.planner import (
    DEFAULT_WARM_SLOTS,
    Shape,
    build_peak_memory,
    measure_builds,
    params_for,
    scale_build,
    timed_ms,
    workload,
)
from cacheroute.cli.options import json_option, q_cap_option, warm_slots_option
from cacheroute.errors import CacheRouteError
from cacheroute.planner import (
    Destination,
    Plan,
    PlannerError,
    PlannerParams,
    build_plan,
)
from cacheroute.planner.experiment import run_drift_experiment
from cacheroute.planner.plan import FloatArray
from cacheroute.planner.workload import PAPER_KEYS
from cacheroute.progress import progress_bar
from cacheroute.settings import Settings

__all__ = ["bench"]


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


_workload_options = [
    click.option("--keys", default=PAPER_KEYS, show_default=True, type=click.IntRange(min=1)),
    click.option("--destinations", default=30, show_default=True, type=click.IntRange(min=1)),
    warm_slots_option(default=DEFAULT_WARM_SLOTS),
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
    shape = Shape(destinations, warm_slots, q_cap, admission, seed)
    with _errors(), progress_bar(console) as progress:
        task = progress.add_task("workload", total=None)
        result = measure_builds(
            workload(keys, seed),
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
            result["scale"] = scale_build(scale_keys, dests, shape=shape, runs=runs)
            result["scale"]["ratio"] = result["scale"]["build_ms"] / result["build_ms"]
            if memory:
                result["scale"].update(_memory_probe(scale_keys, shape))
    if as_json:
        click.echo(orjson.dumps(result))
    else:
        _render(result, Console())


def _memory_probe(keys: int, shape: Shape) -> dict[str, Any]:
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
    with _errors():
        probe = build_peak_memory(keys, Shape(destinations, warm_slots, q_cap, admission, seed))
    click.echo(orjson.dumps(probe))


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
        ms, built = timed_ms(lambda: build_plan(keys, rates, destinations, params, prev=prev))
        timings["hysteresis" if prev is not None else "scratch"].append(ms)
        return built

    with _errors(), progress_bar(console) as progress:
        task = progress.add_task("workload", total=None)
        work = workload(keys, seed)
        params = params_for(
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
@click.option(
    "--versions",
    type=click.IntRange(min=1),
    default=20,
    show_default=True,
    help="New plan versions received while routing (stall percentiles over them).",
)
@json_option("Print exactly one JSON object.")
def bench_dispatcher_cmd(
    keys: int, destinations: int, decisions: int, seed: int, versions: int, as_json: bool
) -> None:
    """Routing decisions/s, per-call p50/p99, and the worst stall while a new plan is applied."""
    from cacheroute.benchmarks.dispatcher import bench_dispatcher  # noqa: PLC0415

    with Console(stderr=True).status("routing ..."):
        result = bench_dispatcher(keys, destinations, decisions, seed, versions)
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
