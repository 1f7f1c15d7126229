"""`cacheroute evaluate`: shadow-replay a workload or trace through every policy and compare.

The simulation is pure (cacheroute.replay); this shell picks the source, draws progress bars on
stderr, times the run (`sim_requests_per_s`), prints the table or one JSON object, and writes plots
and a Markdown report with `--out`. `--evidence` runs the issue's evidence suite and writes
docs/EVALUATION.md-style output.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

import click
import numpy as np
import orjson
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from cacheroute.cli.options import json_option, q_cap_option, time_ms, warm_slots_option
from cacheroute.errors import CacheRouteError
from cacheroute.planner.params import DEFAULT_FAIR_SHARE
from cacheroute.progress import progress_bar
from cacheroute.replay.errors import ReplayError
from cacheroute.replay.evaluate import (
    AUTO_SLO_MULTIPLE,
    DEFAULT_SLO_MS,
    PLANNER_INTERVAL_S,
    EvalConfig,
    Evaluation,
    calibrate,
    evaluate,
)
from cacheroute.replay.fleet import DEALS, Deal, FleetConfig
from cacheroute.replay.metrics import SLO_METRICS, SloMetric
from cacheroute.replay.policies import POLICY_NAMES
from cacheroute.replay.policy import WARM_SLOTS
from cacheroute.replay.recorded import DEFAULT_OUTPUT_TOKENS, ServedStats
from cacheroute.replay.report import (
    EvidenceRun,
    evidence_checks,
    fleet_capacities,
    relative,
    render_evidence,
    render_run,
)
from cacheroute.replay.requestset import RequestSet
from cacheroute.replay.seeds import combine
from cacheroute.replay.service import ServiceModel
from cacheroute.replay.simulator import SimConfig
from cacheroute.replay.sources import (
    KeyBlocks,
    SourceSpec,
    detect_format,
    load_source,
    resolve_key_blocks,
    write_jsonl,
)
from cacheroute.replay.traces import BLOCK_KEY_FORMATS, SESSION_KEYS, TRACE_FORMATS
from cacheroute.replay.workloads import KINDS, WorkloadKind
from cacheroute.settings import Settings

__all__ = ["evaluate_cmd"]

QUICK_REQUESTS = 20_000
_DEFAULTS = ServiceModel()
FULL_REQUESTS = 60_000


class _Bars:
    """Reporter drawing one rich progress bar per stage (stderr, hidden when not a terminal)."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self.task: TaskID | None = None

    def stage(self, label: str, total: int) -> None:
        if self.task is not None:
            self.progress.update(self.task, visible=False)
        self.task = self.progress.add_task(label, total=total)

    def advance(self, n: int) -> None:
        if self.task is not None:
            self.progress.advance(self.task, n)


@contextmanager
def _bars(console: Console) -> Iterator[_Bars]:
    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=not console.is_terminal,
    )
    with progress:
        yield _Bars(progress)


def _policies(text: str) -> tuple[str, ...]:
    names = tuple(p.strip() for p in text.split(",") if p.strip())
    for n in ("flat-lb", "cacheroute"):
        if n not in names:
            names = (n, *names)
    return names


def _ints(text: str | None) -> tuple[int, ...]:
    if not text:
        return ()
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise click.BadParameter(f"expected comma-separated integers, got {text!r}") from None


def _slo(value: object) -> tuple[float, bool]:
    """--slo-ms: "auto" -> (the default, auto); a number (also from the evidence suite) -> given."""
    if value is None or (isinstance(value, str) and value.strip().lower() == "auto"):
        return DEFAULT_SLO_MS, True
    try:
        ms = float(value)  # type: ignore[arg-type]  # click passes str, the suite a float
    except ValueError:
        raise click.BadParameter(
            f"--slo-ms: expected milliseconds or 'auto', got {value!r}"
        ) from None
    return ms, False


def _coarse_block_keys(source: SourceSpec) -> bool:
    """Whether the source's keys are leading blocks of a block-hash trace (coarser than sessions),
    after `--key-blocks auto` has chosen (`resolve_key_blocks`)."""
    if source.trace is None or source.key_blocks_chosen == SESSION_KEYS:
        return False
    fmt = detect_format(source.trace) if source.fmt == "auto" else source.fmt
    return fmt in BLOCK_KEY_FORMATS


def _key_blocks(value: object) -> KeyBlocks:
    """--key-blocks: "auto", "session" (0) or a number of leading block ids (>= 1)."""
    if isinstance(value, int):
        return value
    text = str(value).strip().lower()
    if text == "auto":
        return "auto"
    if text == "session":
        return SESSION_KEYS
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise click.BadParameter(
            f"--key-blocks: expected an integer >= 1, 'session' or 'auto', got {value!r}"
        )
    return n


@dataclass(frozen=True, slots=True)
class _Run:
    source: SourceSpec
    config: EvalConfig


KNEE_SEED_OFFSET = 1000


def _held_out(source: SourceSpec, requests: RequestSet) -> tuple[RequestSet | None, str]:
    """The knee's held-out requests: the same source with seed + 1000 (None if that changes
    nothing, e.g. an untiled Mooncake trace, which takes no randomness), and their description."""
    seed = source.seed + KNEE_SEED_OFFSET
    knee = load_source(replace(source, seed=seed))
    if (
        knee.n == requests.n
        and np.array_equal(knee.times, requests.times)
        and np.array_equal(knee.prompt_tokens, requests.prompt_tokens)
        and knee.keys == requests.keys
    ):
        return None, ""
    if source.trace is not None:
        return knee, f"the same trace re-drawn with seed {seed} (same prompts, other tiling)"
    return knee, f"seed {seed} of the same workload (held out)"


F = TypeVar("F", bound=Callable[..., Any])


def _sole_gateway_option(flag: str, text: str) -> Callable[[F], F]:
    """An `auto|on|off` option of a rule that is for a gateway seeing all the traffic (auto: on at
    one gateway only, `EvalConfig._sole_gateway_rule`); `_auto_on_off` reads its value."""
    return click.option(
        flag, type=click.Choice(["auto", "on", "off"]), default="auto", show_default=True, help=text
    )


def _auto_on_off(value: str) -> bool | None:
    """An `auto|on|off` option's value as `EvalConfig` takes it: None for auto."""
    return None if value == "auto" else value == "on"


def _run(run: _Run, console: Console) -> tuple[Evaluation, dict[str, Any]]:
    start = time.perf_counter()
    with _bars(console) as bars:
        bars.stage("loading the workload", 1)
        sim = run.config.sim
        source = resolve_key_blocks(run.source, destinations=sim.destinations, service=sim.service)
        hints = run.config.session_hints and _coarse_block_keys(source)
        run = replace(run, source=source, config=replace(run.config, session_hints=hints))
        requests = load_source(run.source)
        knee, note = _held_out(run.source, requests)
        result = evaluate(
            requests,
            run.config,
            workload_info=run.source.describe(),
            reporter=bars,
            knee_requests=knee,
            knee_note=note,
        )
    wall = time.perf_counter() - start
    timing = {
        "wall_s": wall,
        "sim_requests": result.sim_requests,
        "sim_requests_per_s": result.sim_requests / wall if wall > 0 else 0.0,
    }
    return result, timing


@click.command("evaluate")
@click.option("--workload", type=click.Choice(KINDS), help="A synthetic workload.")
@click.option(
    "--trace", type=click.Path(exists=True, dir_okay=False, path_type=Path), help="A trace file."
)
@click.option(
    "--topic",
    help="A recorded requests topic (e.g. requests, with --topic-prefix as set): evaluate the "
    "traffic the gateways recorded, as a trace file is, and put the hit rate the engines served "
    "next to the simulated one (gateways need --hash-blocks for prefixes). Needs the broker.",
)
@click.option(
    "--from-time", help="With --topic: events at or after this time (epoch ms or ISO-8601)."
)
@click.option("--to-time", help="With --topic: events before this time (epoch ms or ISO-8601).")
@click.option(
    "--block-tokens",
    type=click.IntRange(min=1),
    default=512,
    show_default=True,
    help="With --topic: the block size of the gateways' --hash-blocks.",
)
@click.option(
    "--output-tokens",
    type=click.IntRange(min=1),
    default=DEFAULT_OUTPUT_TOKENS,
    show_default=True,
    help="With --topic: output tokens of every request (gateways do not record them).",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice([*TRACE_FORMATS, "auto"]),
    default="auto",
    show_default=True,
    help="Trace format: mooncake (JSONL, timestamp ms, hash_ids), bailian (Alibaba's Qwen traces: "
    "timestamp s, 16-token hash_ids, chat ids), azure (its CSV), csv (generic CSV/JSONL: ts,key,"
    "prompt_tokens,prefix_tokens); auto: from the first line.",
)
@click.option(
    "--policies",
    default=",".join(POLICY_NAMES),
    show_default=True,
    help="Comma-separated; flat-lb and cacheroute are always included.",
)
@click.option("--quick", is_flag=True, help=f"{QUICK_REQUESTS:,} requests, 2 refinement steps.")
@json_option()
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    help="Write PNG plots, report.md and result.json here.",
)
@click.option("-R", "--destinations", default=30, show_default=True, type=click.IntRange(1, 512))
@click.option("--requests", type=click.IntRange(min=100), help=f"[default {FULL_REQUESTS:,}]")
@click.option("--keys", default=2000, show_default=True, type=click.IntRange(min=1))
@click.option(
    "--rate", type=float, help="Base rate of synthetic workloads [default: 100; conversation: 20]."
)
@click.option("--cv", default=1.0, show_default=True, help="Arrival CV (gamma when != 1).")
@click.option("--seed", default=0, show_default=True)
@click.option(
    "--slo-ms",
    default="auto",
    show_default=True,
    help=f"p99 SLO in ms, or auto: {DEFAULT_SLO_MS:g} unless {AUTO_SLO_MULTIPLE:g} x an idle "
    "replica's p99 exceeds it, then that (rounded up).",
)
@click.option("--slo-metric", type=click.Choice(SLO_METRICS), default="ttft", show_default=True)
@q_cap_option("[default: the measured knee of one replica]")
@click.option(
    "--q-cap-factor", default=1.0, show_default=True, help="q_cap = this x the measured knee."
)
@warm_slots_option(
    "W: keys planned per destination (C = R x W); the rest take the cold path.",
    default=WARM_SLOTS,
)
@click.option(
    "--intervals",
    default=15,
    show_default=True,
    help="Re-plans per replay at least (more where --control-interval-s is shorter).",
)
@click.option(
    "--control-interval-s",
    type=click.FloatRange(min=0),
    default=PLANNER_INTERVAL_S,
    show_default=True,
    help="Re-plan at least this often in replay seconds (the planner service's interval); "
    "0: --intervals times per replay only.",
)
@click.option("--oracle", is_flag=True, help="Plan once from the true rates.")
@click.option(
    "--rate-decay",
    type=click.FloatRange(min=0, min_open=True, max=1),
    help="Per-interval weight of older rate counts; 1 = all rates so far. [default: the planner "
    "service's EWMA, counts halve every 60 s of replay time]",
)
@click.option(
    "--fair-share",
    default=DEFAULT_FAIR_SHARE,
    show_default=True,
    type=click.FloatRange(min=0),
    help="cacheroute: split keys above this x the mean load; 0: the paper's k_b.",
)
@click.option(
    "--group-separator",
    default="/",
    show_default=True,
    help="cacheroute: co-locate keys sharing the text before it; '': plain LPT.",
)
@click.option(
    "--spill-factor",
    default=2.0,
    show_default=True,
    type=click.FloatRange(min=0),
    help="cacheroute: spill planned requests past this x mean in-flight; 0: never.",
)
@click.option(
    "--gateways",
    "-G",
    default=1,
    show_default=True,
    type=click.IntRange(1, 256),
    help="Gateways; each routes its share with only its own state (plans are shared).",
)
@click.option(
    "--deal",
    type=click.Choice(DEALS),
    default="round-robin",
    show_default=True,
    help="How requests reach gateways: round-robin (an L4 balancer) or by client (key hash).",
)
@click.option(
    "--plan-delay-s",
    default=0.5,
    show_default=True,
    type=click.FloatRange(min=0),
    help="Replay seconds from a plan's build until every gateway routes by it.",
)
@click.option(
    "--sync-s",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Reactive baselines' gateways merge their prefix trees every S replay seconds "
    "(gossiping peers); default: never.",
)
@click.option(
    "--sync-load",
    is_flag=True,
    help="With --sync-s, peers also share load snapshots (measured to hurt the baselines).",
)
@click.option(
    "--peer-loads-s",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="cacheroute: every S replay seconds each gateway reports its own in-flight load per "
    "destination and counts the others' latest reports on top of its own (Router."
    "set_peer_loads); default: each knows only its own. Give the baselines --sync-s S "
    "--sync-load (or --sync-s S) for a fair comparison.",
)
@click.option(
    "--jobs",
    "-j",
    type=click.IntRange(min=1),
    default=lambda: min(os.cpu_count() or 1, 8),
    show_default="the CPU count, at most 8",
    help="Processes for the policies' sweeps (same results as one).",
)
@click.option(
    "--seeds",
    type=click.IntRange(1, 64),
    help="Repeat over seeds 0..N-1; capacities are the mean (with _min/_max), verdicts use it.",
)
@click.option(
    "--work-unit-tokens",
    default=512,
    show_default=True,
    type=click.IntRange(min=0),
    help="cacheroute: a request weighs 1 + its uncached prompt tokens // this until its first "
    "token, then 1; 0: 1 per request throughout.",
)
@click.option(
    "--cold-affinity/--no-cold-affinity",
    default=True,
    show_default=True,
    help="cacheroute: keys no plan admits go by bounded-load consistent hashing (else P2C).",
)
@click.option(
    "--session-hints/--no-session-hints",
    default=True,
    show_default=True,
    help="cacheroute: on Mooncake traces keyed by leading blocks, gateways also know each "
    "request's conversation (system prompt + first message) and keep it on one replica of its "
    "key.",
)
@click.option(
    "--context-slack/--no-context-slack",
    default=True,
    show_default=True,
    help="cacheroute: a key may exceed the load bounds where its context is cached by what "
    "recomputing it would cost.",
)
@click.option(
    "--keep-homes/--no-keep-homes",
    default=False,
    show_default=True,
    help="cacheroute: the planner places a newly admitted key on the destination its latest "
    "request went to, while that stays within the load bound (measured: better at one gateway, "
    "worse at 16; docs/EVALUATION.md).",
)
@_sole_gateway_option(
    "--spill-home",
    "cacheroute: a planned key goes to the less loaded of its planned destination and where "
    "its gateway spilled it before (for a gateway that sees all the traffic); auto: on at one "
    "gateway only.",
)
@_sole_gateway_option(
    "--prefix-affinity",
    "cacheroute: a key new to a gateway's cold path goes where that gateway sent its prompt's "
    "leading blocks (its system prompt, its tenant's prompt), if one replica got more than a "
    "quarter of them; auto: on at one gateway only.",
)
@_sole_gateway_option(
    "--cold-cost",
    "cacheroute: a cold key that has to be placed (new with no prompt-prefix home, or its "
    "context gone where it went last) goes where its prompt's missing blocks plus that "
    "replica's recent cache churn cost least, instead of its hashed destinations; so does each "
    "conversation of a planned key (session hints), which then stays where its context is "
    "unless that replica is overloaded (for a gateway that sees all the traffic; with prefix "
    "affinity); auto: on at one gateway only.",
)
@_sole_gateway_option(
    "--context-home",
    "cacheroute: a key new in the live plan stays where its gateway sent its conversation "
    "last (its history is cached there) while that is the cheaper choice (for a gateway that "
    "sees all the traffic); auto: on at one gateway only.",
)
@_sole_gateway_option(
    "--cache-aware",
    "cacheroute: gateways know each replica's KV capacity (--cache-tokens) and estimate "
    "what of a conversation's context is still cached there (LRU; for a gateway that sees all "
    "the traffic); off: cached until it moves; auto: on at one gateway only.",
)
@click.option(
    "--plan-cost",
    type=click.Choice(["reported", "declared"]),
    default="reported",
    show_default=True,
    help="cacheroute: the planner weighs a key's work by the uncached tokens the engines "
    "reported for its finished requests (as the planner service does from usage), or by the "
    "prompt less its declared reusable prefix.",
)
@click.option(
    "--plan-on-work/--plan-on-requests",
    default=True,
    show_default=True,
    help="cacheroute: the planner weighs each key's rate by its mean request cost, 1 + prompt "
    "tokens / --work-unit-tokens (as the planner service does), instead of counting requests.",
)
@click.option("--cluster-sizes", help="Also sweep R at a fixed load, e.g. 8,30,60.")
@click.option("--cluster-load", type=float, help="Load of that sweep [default: reference load].")
@click.option(
    "--key-blocks",
    default="2",
    show_default=True,
    callback=lambda _ctx, _param, value: _key_blocks(value),
    help="Mooncake/Bailian key: leading 512-token block ids; session: shared prefix + first own "
    "block (what a gateway keying on system prompt + first message gets); auto: the "
    "diagnostic's best of session and 1-6 (~5 s).",
)
@click.option("--tile", type=click.IntRange(min=1), help="Trace copies [default: enough].")
@click.option("--limit", type=click.IntRange(min=1), help="Read at most this many trace lines.")
@click.option("--cache-tokens", type=int, help=f"[{_DEFAULTS.cache_tokens}]")
@click.option("--max-running", type=int, help=f"[{_DEFAULTS.max_running}]")
@click.option("--chunk-tokens", type=int, help=f"[{_DEFAULTS.chunk_tokens}]")
@click.option("--prefill-token-us", type=float, help=f"[{_DEFAULTS.prefill_per_token_s * 1e6:g}]")
@click.option("--attention-pair-ns", type=float, help=f"[{_DEFAULTS.attention_per_pair_s * 1e9:g}]")
@click.option("--decode-step-ms", type=float, help=f"[{_DEFAULTS.decode_base_s * 1e3:g}]")
@click.option("--evidence", is_flag=True, help="Run the evidence suite (see --doc).")
@click.option(
    "--doc",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Evidence document [default: OUT/../EVALUATION.md].",
)
def evaluate_cmd(**params: object) -> None:
    """Compare routing policies on a simulated serving cluster; say whether to deploy.

    Every policy runs over a load sweep; the report gives token-weighted KV hit rate, load
    imbalance, p99 latency at a matched load, SLO capacity, tenant fairness, the workload
    diagnostic and the recommendation (deploy only if capacity AND p99 beat flat-lb).
    """
    opts = EvaluateOptions.from_params(params)
    console = Console(stderr=True)
    if opts.evidence:
        _evidence(opts, console)
        return
    if (opts.workload is not None) + (opts.trace is not None) + (opts.topic is not None) != 1:
        raise click.UsageError("give one of --workload KIND, --trace FILE or --topic NAME")
    recorded = _recorded(opts, console) if opts.topic is not None else None
    if opts.seeds:
        _seeds(opts, console, recorded)
        return
    run = _make_run(opts, opts.workload, opts.trace, opts.fmt, recorded)
    try:
        result, timing = _run(run, console)
        if recorded is not None:
            timing["calibration"] = _calibration(recorded, run, result.q_cap, console)
    except ReplayError as exc:
        raise click.ClickException(str(exc)) from None
    data = result.to_dict() | timing
    if opts.out is not None:
        _write_outputs(result, data, opts.out)
    if opts.as_json:
        click.echo(orjson.dumps(data, option=orjson.OPT_SERIALIZE_NUMPY).decode())
    else:
        _render(result, timing, Console())


def _seeds(opts: EvaluateOptions, console: Console, recorded: _Recorded | None = None) -> None:
    """Seeds 0..N-1 of the same comparison, combined (means, spread, verdicts from the means)."""
    datas: list[dict[str, Any]] = []
    wall = 0.0
    calibration: dict[str, Any] | None = None
    for seed in range(opts.seeds or 1):
        console.print(f"seed {seed} of {opts.seeds}")
        run = _make_run(
            dataclasses.replace(opts, seed=seed), opts.workload, opts.trace, opts.fmt, recorded
        )
        try:
            result, timing = _run(run, console)
            if recorded is not None and calibration is None:
                calibration = _calibration(recorded, run, result.q_cap, console)
        except ReplayError as exc:
            raise click.ClickException(str(exc)) from None
        wall += timing["wall_s"]
        datas.append(result.to_dict())
        if opts.out is not None:
            _write_outputs(result, result.to_dict() | timing, opts.out, prefix=f"seed{seed}_")
    data = combine(datas, margin=EvalConfig().margin)
    data["wall_s"] = wall
    if calibration is not None:
        data["calibration"] = calibration
    if opts.out is not None:
        (opts.out / "result.json").write_bytes(
            orjson.dumps(data, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY)
        )
    if opts.as_json:
        click.echo(orjson.dumps(data, option=orjson.OPT_SERIALIZE_NUMPY).decode())
        return
    table = Table(
        title=f"{data['workload']['source']}: {data['seeds']} seeds", title_justify="left"
    )
    for col in ("policy", "SLO capacity (mean)", "min", "max", "vs flat-lb"):
        table.add_column(col, justify="left" if col == "policy" else "right")
    flat = data["policies"]["flat-lb"]["slo_capacity_qps"]
    for name, p in data["policies"].items():
        cap = p["slo_capacity_qps"]
        table.add_row(
            name,
            f"{cap:.1f}",
            f"{p['slo_capacity_qps_min']:.1f}",
            f"{p['slo_capacity_qps_max']:.1f}",
            f"{cap / flat:.2f}x" if flat > 0 else "-",
        )
    out = Console()
    out.print(table)
    sim = data["simulation"]
    out.print(
        f"simulation: [bold]{sim['verdict']}[/] (capacity {sim['capacity_ratio']:.3f}x of "
        f"flat-lb; by seed {', '.join(sim['verdicts_by_seed'])}); "
        f"recommendation: [bold]{data['recommendation']}[/]"
    )


@dataclass(frozen=True, slots=True)
class _Recorded:
    """A recorded topic, read: its requests, what the engines served, and where it came from."""

    requests: RequestSet
    served: ServedStats
    origin: str


def _recorded(opts: EvaluateOptions, console: Console) -> _Recorded:
    """Read `--topic` (between --from-time and --to-time) into requests; `--out` keeps a copy."""
    from confluent_kafka import KafkaException  # noqa: PLC0415 - Kafka client, lazily

    from cacheroute.replay.live import read_recorded  # noqa: PLC0415

    settings: Settings = click.get_current_context().find_root().obj
    assert opts.topic is not None
    topic = settings.topic_prefix + opts.topic
    from_ms = time_ms(opts.from_time) if opts.from_time else None
    to_ms = time_ms(opts.to_time) if opts.to_time else None
    with progress_bar(console) as progress:
        task = progress.add_task(f"reading {topic}", total=None)
        try:
            traffic = read_recorded(
                settings,
                topic,
                from_ms=from_ms,
                to_ms=to_ms,
                on_progress=lambda n: progress.advance(task, n),
            )
        except KafkaException as exc:
            raise CacheRouteError(f"reading {topic}: {exc}") from None
    span = f" from {opts.from_time}" if opts.from_time else ""
    span += f" to {opts.to_time}" if opts.to_time else ""
    origin = f"topic {topic}{span}"
    try:
        requests = traffic.request_set(
            block_tokens=opts.block_tokens,
            output_tokens=opts.output_tokens,
            source=f"recorded requests of {origin}",
        )
    except ReplayError as exc:
        raise click.ClickException(str(exc)) from None
    served = traffic.served()
    console.print(
        f"read {requests.n:,} requests recorded by {len(served.gateways)} gateway(s) over "
        f"{requests.duration:.0f} s ({requests.rate:.1f} req/s); engines reported cached tokens "
        f"for {served.reported:,}"
    )
    if opts.out is not None:
        opts.out.mkdir(parents=True, exist_ok=True)
        write_jsonl(requests, opts.out / "recorded.jsonl")
    return _Recorded(requests, served, origin)


def _calibration(recorded: _Recorded, run: _Run, q_cap: float, console: Console) -> dict[str, Any]:
    """The served hit rate next to the simulated one of cacheroute on the same requests."""
    served = recorded.served
    r = len(served.destinations) or run.config.sim.destinations
    g = max(1, len(served.gateways))
    console.print(f"calibration: simulating the recorded traffic as it was (R = {r}, G = {g})")
    cal = calibrate(recorded.requests, run.config, q_cap=q_cap, destinations=r, gateways=g)
    return cal.to_dict() | {
        "served_hit_rate": served.hit_rate,
        "served_requests_reporting": served.reported,
        "served_destinations": list(served.destinations),
        "served_gateways": list(served.gateways),
    }


def _calibration_text(cal: Mapping[str, Any]) -> str:
    """One sentence: served vs simulated hit rate on the recorded traffic."""
    served = cal["served_hit_rate"]
    served_text = (
        "no engine reported cached tokens"
        if served is None
        else f"the engines served a KV hit rate of {100 * served:.1f}%"
    )
    return (
        f"{served_text} ({cal['served_requests_reporting']:,} of {cal['requests']:,} requests "
        "reported usage); "
        f"the simulator gives {cal['policy']} {100 * cal['simulated_hit_rate']:.1f}% on the same "
        f"requests at their recorded times (R = {cal['destinations']}, G = {cal['gateways']}, "
        f"{cal['offered_qps']:.1f} req/s). A large gap means the service model (--cache-tokens, "
        "block size) is not the engines'."
        + (
            f" {cal['left_out']:,} recorded prompts longer than --cache-tokens were not simulated."
            if cal.get("left_out")
            else ""
        )
    )


def _make_run(
    opts: EvaluateOptions,
    workload: str | None,
    trace: Path | None,
    fmt: str,
    recorded: _Recorded | None = None,
) -> _Run:
    quick = bool(opts.quick)
    requests = opts.requests or (QUICK_REQUESTS if quick else FULL_REQUESTS)
    service = ServiceModel()
    overrides: dict[str, Any] = {}
    for opt, field_name, scale in (
        ("cache_tokens", "cache_tokens", 1),
        ("max_running", "max_running", 1),
        ("chunk_tokens", "chunk_tokens", 1),
        ("prefill_token_us", "prefill_per_token_s", 1e-6),
        ("attention_pair_ns", "attention_per_pair_s", 1e-9),
        ("decode_step_ms", "decode_base_s", 1e-3),
    ):
        value = opts.service_override(opt)
        if value is not None:
            overrides[field_name] = value * scale if scale != 1 else value
    if overrides:
        try:
            service = replace(service, **overrides)
        except ReplayError as exc:
            raise click.BadParameter(str(exc)) from None
    source = SourceSpec(
        workload=workload,  # type: ignore[arg-type]  # click.Choice guarantees a kind
        trace=trace,
        fmt=fmt,  # type: ignore[arg-type]  # click.Choice guarantees a format
        requests=requests,
        keys=opts.keys,
        rate=opts.rate,
        cv=opts.cv,
        seed=opts.seed,
        key_blocks=_key_blocks(opts.key_blocks),
        tile=opts.tile,
        limit=opts.limit,
        recorded=None if recorded is None else recorded.requests,
        recorded_from="" if recorded is None else recorded.origin,
    )
    slo_ms, slo_auto = _slo(opts.slo_ms)
    try:
        config = EvalConfig(
            session_hints=opts.session_hints,  # narrowed to coarse block keys in `_run`
            policies=_policies(opts.policies),
            sim=SimConfig(destinations=opts.destinations, service=service, seed=opts.seed),
            slo_ms=slo_ms,
            slo_auto=slo_auto,
            slo_metric=opts.slo_metric,
            refine_steps=2 if quick else 3,
            q_cap=opts.q_cap,
            q_cap_factor=opts.q_cap_factor,
            warm_slots=opts.warm_slots,
            intervals=opts.intervals,
            control_interval_s=opts.control_interval_s or None,
            oracle=opts.oracle,
            rate_decay=opts.rate_decay,
            fair_share=opts.fair_share or None,
            group_separator=opts.group_separator or None,
            spill_factor=opts.spill_factor or None,
            cold_affinity=opts.cold_affinity,
            context_slack=opts.context_slack,
            plan_on_work=opts.plan_on_work,
            keep_homes=opts.keep_homes,
            spill_home=_auto_on_off(opts.spill_home),
            context_home=_auto_on_off(opts.context_home),
            reported_cost=opts.plan_cost == "reported",
            cache_aware=_auto_on_off(opts.cache_aware),
            prefix_affinity=_auto_on_off(opts.prefix_affinity),
            cold_cost=_auto_on_off(opts.cold_cost),
            work_unit_tokens=opts.work_unit_tokens or None,
            cluster_sizes=_ints(opts.cluster_sizes),
            cluster_load_qps=opts.cluster_load,
            jobs=opts.jobs,
            fleet=FleetConfig(
                gateways=opts.gateways,
                deal=opts.deal,
                plan_delay_s=opts.plan_delay_s,
                sync_s=opts.sync_s,
                sync_load=opts.sync_load,
                peer_loads_s=opts.peer_loads_s,
            ),
        )
    except ReplayError as exc:
        raise click.BadParameter(str(exc)) from None
    return _Run(source, config)


def _write_outputs(
    result: Evaluation, data: dict[str, Any], out: Path, prefix: str = ""
) -> dict[str, str]:
    from cacheroute.replay.plots import save_plots  # noqa: PLC0415 - matplotlib is slow to import

    out.mkdir(parents=True, exist_ok=True)
    files = save_plots(result, out, prefix)
    links = {name: relative(path, out) for name, path in files.items()}
    (out / f"{prefix}result.json").write_bytes(
        orjson.dumps(data, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY)
    )
    report = render_run(result, links, title=f"Evaluation: {result.workload['source']}", level=1)
    if "calibration" in data:
        report += (
            "\n## Calibration on the recorded traffic\n\n"
            + _calibration_text(data["calibration"])
            + "\n"
        )
    (out / f"{prefix}report.md").write_text(report, encoding="utf-8")
    return {name: str(path) for name, path in files.items()}


def _render(result: Evaluation, timing: dict[str, Any], console: Console) -> None:
    metric = result.config.slo_metric
    table = Table(
        title=f"{result.workload['source']} - R = {result.config.sim.destinations}, "
        f"reference load {result.reference_qps:.0f} req/s, SLO p99 {metric} <= "
        f"{result.config.slo_ms:.0f} ms",
        title_justify="left",
    )
    for col in ("policy", "KV hit", "max/mean", f"p99 {metric} ms", "SLO capacity", "vs flat-lb"):
        table.add_column(col, justify="left" if col == "policy" else "right")
    flat = result.policies["flat-lb"].slo_capacity_qps
    for name, p in result.policies.items():
        ref = p.at_reference
        table.add_row(
            name,
            f"{100 * ref.hit_rate:.1f}%",
            f"{ref.max_over_mean:.2f}",
            f"{ref.p99_ms(metric):.0f}",
            f"{p.slo_capacity_qps:.0f}",
            f"{p.slo_capacity_qps / flat:.2f}x" if flat > 0 else "-",
        )
    console.print(table)
    notes = result.workload.get("notes") or []
    if notes:  # tiling, and any request left out or cut (`servable`): the user should see it
        console.print("workload: " + "; ".join(notes), markup=False)
    d = result.diagnostic
    console.print(f"diagnostic: [bold]{d.verdict}[/] - {d.reason}")
    console.print(
        f"simulation: [bold]{result.simulation_verdict}[/] (capacity "
        f"{result.capacity_ratio:.2f}x, p99 {result.p99_ratio:.2f}x of flat-lb); "
        f"{'agrees' if result.agree else 'disagrees'} with the diagnostic"
    )
    console.print(f"recommendation: [bold]{result.recommendation}[/]")
    if "calibration" in timing:
        console.print("calibration: " + _calibration_text(timing["calibration"]))
    console.print(
        f"simulated {timing['sim_requests']:,} requests in {timing['wall_s']:.1f} s "
        f"({timing['sim_requests_per_s']:,.0f} requests/s)"
    )


_EVIDENCE_HEADER = """# Evaluation: shadow replay of CacheRoute against five baselines, with many gateways

Generated by `cacheroute evaluate --evidence` - do not edit by hand; re-run the command.
Everything below is simulated: a serving cluster of R replicas (service model in
`replay/service.py`: Llama-3.1-8B-class replicas on H100s with chunked prefill, a concurrency
limit and a block-level LRU prefix cache), routed by each policy. The plan-based policies
(`affinity`, `affinity+replication`, `affinity+replication+lpt`, `cacheroute`) run the real planner
(`build_plan`) and the real gateway dispatcher (`Router`; tables from `table_from_plan`, as
`Dispatcher.apply_plan` builds them, or `build_table` for the hash placements of the ablation).

**Many gateways.** Real fleets run many gateway replicas behind an L4 balancer, and each sees only
its own requests. With `--gateways G` every policy runs G instances, one per gateway, each with
only its own state (in-flight counts, prefix trees, CHWBL loads) and told only of the completions
of its own requests; requests are dealt round-robin. Plan-based policies share one planner, which
sees every gateway's requests (as the streams agent does), and each gateway installs a new plan
0.5 s (of replay time) after it is built. Baselines keep their published settings and, in the
main runs, get no shared state; neither does CacheRoute beyond the plan. The last runs give every
router shared state four times a second at G = 16: CacheRoute's gateways read each other's
in-flight loads (`--peer-loads-s 0.25`, what `cacheroute gateway --peer` does), the reactive
baselines gossip their prefix trees (`--sync-s 0.25`), once without and once with their load
views (`--sync-load`).

The ablation, step by step: `affinity` pins each key to one hashed destination;
`affinity+replication` gives it the paper's k_b = ceil(rate / q_cap) hashed destinations;
`affinity+replication+lpt` is the paper's Algorithm 1 (admission, k_b, LPT placement) with our
churn-aware re-planning, routing other keys by power-of-two-choices; `cacheroute` is planner and
dispatcher as deployed, which add six extensions of ours: **planning on work** (each key's
rate weighted by its mean request cost, 1 + uncached prompt tokens / 512, rescaled to the same
total, as the planner service does; `--plan-on-requests` turns it off), fair-share sizing, sibling co-location
(keys with the same text before the last `/` share destinations), the dispatcher's overload spill,
**cold-key affinity** (keys no plan admits - new conversations - go by bounded-load consistent
hashing on a ring of destination names, the same on every gateway without coordination, and a
gateway keeps a cold key where it last sent it while that destination is under the bound) and
**work units** (a request weighs 1 + its prompt tokens not expected in the destination's cache //
512 in the gateway's in-flight load until its first token, then 1: the load tracks the prefill
queued at each replica) with **context slack** (a key may exceed the load bounds where its context
is cached by what recomputing that context would cost). On Mooncake traces keyed by leading
blocks, gateways also pass each request's conversation as its **session** (found from the
blocks as session keys are: what a gateway also hashes from system prompt plus first message),
and a planned key's replicas share its conversations by bounded-load rendezvous hashing instead
of request by request (`--no-session-hints` turns it off). A sole gateway (G = 1), which sees all
the traffic, also uses the rules that need that view: spill homes, context homes, cache awareness
and **prefix affinity** (a key new to the gateway's cold path goes where the gateway sent its
prompt's leading blocks, if one replica got more than a quarter of them, and a cold key whose
last replica no longer got more than a quarter of its blocks is placed again instead of staying;
`--prefix-affinity`).
Ties among a key's replicas are broken at random. W = 64 keys are planned per destination (`WARM_SLOTS` in `replay/policy.py` says how
that default was chosen, on these runs); the rest take the cold path. Runs below turn extensions
off one at a time. Absolute numbers depend on the service model; the
comparisons are what this document is for. It says where CacheRoute does not win.

Method in one paragraph: the SLO is p99 TTFT <= 2 s unless an idle replica's p99 already comes
near it (long-context traces): then it is 2.5x the idle replica's p99 (stated per run). Each run
measures the knee of one replica on held-out data (another seed of the workload, or the trace
re-tiled with another seed) and uses it as `q_cap`; sweeps every policy over offered loads (the
replay time-compressed to each load; traces are also tiled; a policy still within the SLO at the
top load goes on in x1.2 steps until it fails); takes the SLO capacity as the highest load whose
p99 stays under the SLO (bisection between sweep points; a policy failing the lowest load is run
at quarters of it until it passes); quotes hit rate, imbalance (requests and prefill work) and
p99 at the reference load (the highest sweep load Flat-LB still serves); and runs the
workload-only diagnostic. Plans are rebuilt as the planner service rebuilds them: every 60 s of
replay time (or 15 times per replay where that is more often; at most 256), from per-key rates
whose counts halve every 60 s, the planner's EWMA (no oracle). The first 20% of each replay is
warm-up and not measured.
"""


@dataclass(frozen=True, slots=True)
class EvaluateOptions:
    """`cacheroute evaluate`'s options, typed (one field per option, same name and default)."""

    workload: WorkloadKind | None
    trace: Path | None
    topic: str | None
    from_time: str | None
    to_time: str | None
    block_tokens: int
    output_tokens: int
    fmt: str
    policies: str
    quick: bool
    as_json: bool
    out: Path | None
    destinations: int
    requests: int | None
    keys: int
    rate: float | None
    cv: float
    seed: int
    slo_ms: str
    slo_metric: SloMetric
    q_cap: float | None
    q_cap_factor: float
    warm_slots: int
    intervals: int
    control_interval_s: float
    oracle: bool
    rate_decay: float | None
    fair_share: float
    group_separator: str
    spill_factor: float
    gateways: int
    deal: Deal
    plan_delay_s: float
    sync_s: float | None
    sync_load: bool
    peer_loads_s: float | None
    jobs: int
    seeds: int | None
    work_unit_tokens: int
    cold_affinity: bool
    session_hints: bool
    context_slack: bool
    plan_on_work: bool
    keep_homes: bool
    spill_home: str
    prefix_affinity: str
    cold_cost: str
    context_home: str
    cache_aware: str
    plan_cost: str
    cluster_sizes: str | None
    cluster_load: float | None
    key_blocks: str
    tile: int | None
    limit: int | None
    cache_tokens: int | None
    max_running: int | None
    chunk_tokens: int | None
    prefill_token_us: float | None
    attention_pair_ns: float | None
    decode_step_ms: float | None
    evidence: bool
    doc: Path | None

    @classmethod
    def from_params(cls, params: Mapping[str, object]) -> EvaluateOptions:
        """From click's parsed values; the names must be exactly the fields (tested)."""
        names = [f.name for f in dataclasses.fields(cls)]
        if sorted(params) != sorted(names):
            raise click.UsageError(
                f"evaluate's options and EvaluateOptions differ: {sorted(set(params) ^ set(names))}"
            )
        return cls(**params)  # type: ignore[arg-type]  # click's declared types give each field's

    def service_override(self, name: str) -> int | float | None:
        """One of the service-model overrides by option name (`--cache-tokens` ...)."""
        value: int | float | None = getattr(self, name)
        return value


@dataclass(frozen=True, slots=True)
class _Case:
    """One run of the evidence suite: a source and the options that differ from the defaults."""

    title: str
    prefix: str
    workload: str | None = None
    trace: Path | None = None
    options: tuple[tuple[str, Any, str], ...] = ()
    """(option name, value, as it appears on the command line)."""
    fleet_group: str | None = None
    """Runs of one source that differ only in --gateways (the capacity-vs-G tables)."""


_FLEET_POLICIES = "flat-lb,sticky,chwbl,sglang,preble,cacheroute"
_MOONCAKE = Path("tests/data/traces/mooncake_arxiv_1000.jsonl")
_AZURE = Path("tests/data/traces/azure_llm_2023_conv_3000.csv")
_CONV_TRACE = Path("tests/data/traces/conversation_mooncake_6000.jsonl")
_DEMO_RECORDED = Path("tests/data/traces/demo_recorded_5930.jsonl")
_CHAT_SHAPE = Path("tests/data/traces/chat_shape_6000.jsonl")
_CHAT_SAMPLED = Path("tests/data/traces/chat_sampled_6000.jsonl")
_TENANT_CHAT = Path("tests/data/traces/tenant_chat_6000.jsonl")
_FLEET_SOURCES: tuple[tuple[str, str, str | None, Path | None], ...] = (
    ("Whale workload", "whale", "whale", None),
    ("Paper-like workload", "paper", "paper", None),
    ("Conversation workload (long context, multi-turn)", "conversation", "conversation", None),
    ("Mooncake arXiv trace (1,000 production requests, tiled)", "mooncake", None, _MOONCAKE),
    ("Azure conversation trace (3,000 requests, synthetic keys, tiled)", "azure", None, _AZURE),
    (
        "Conversation trace in Mooncake format (block ids only, session keys, tiled)",
        "conv-trace",
        None,
        _CONV_TRACE,
    ),
    (
        "Conversation trace in Mooncake format, default keys (first 2 blocks, with session "
        "hints: what `evaluate --trace` does without options)",
        "conv-trace-kb2",
        None,
        _CONV_TRACE,
    ),
    (
        "Chat trace in the shape of public long-context chat traces (one shared system-prompt "
        "block, a key per conversation, 3.5 requests each on average; default keys)",
        "chat-shape",
        None,
        _CHAT_SHAPE,
    ),
    (
        "Chat trace closer to slices of Mooncake's conversation trace (partial last blocks with "
        "ids of their own, a third of requests continue a conversation; default keys)",
        "chat-sampled",
        None,
        _CHAT_SAMPLED,
    ),
    (
        "Chat trace of 8 tenants behind 4-block system prompts (the first 2 blocks name a "
        "tenant: a handful of heavy keys, conversations kept apart by session hints; default keys)",
        "tenant-chat",
        None,
        _TENANT_CHAT,
    ),
    (
        "Demo traffic recorded by real gateways (`evaluate --topic`: 40 s, 50 tenants, "
        "conversations that start and end; tiled)",
        "demo-recorded",
        None,
        _DEMO_RECORDED,
    ),
)


def _fleet_cases() -> tuple[_Case, ...]:
    cases = []
    for title, prefix, workload, trace in _FLEET_SOURCES:
        for g in (1, 4, 16):
            options: tuple[tuple[str, Any, str], ...] = (("gateways", g, f"--gateways {g}"),)
            if not (prefix == "whale" and g == 1):
                options += (("policies", _FLEET_POLICIES, ""),)
            else:  # the whale run at G = 1 is the full ablation, with the cluster-size sweep
                options += (("cluster_sizes", "8,30,60", "--cluster-sizes 8,30,60"),)
            if prefix == "conv-trace":
                options += (("key_blocks", SESSION_KEYS, "--key-blocks session"),)
            cases.append(
                _Case(
                    f"{title}, G = {g}",
                    f"{prefix}_g{g}",
                    workload=workload,
                    trace=trace,
                    options=options,
                    fleet_group=title,
                )
            )
    return tuple(cases)


_SUITE = (
    *_fleet_cases(),
    _Case(
        "Conversation workload, G = 4, without cold-key affinity (what that extension buys)",
        "conversation_g4_no_cold_affinity",
        workload="conversation",
        options=(
            ("gateways", 4, "--gateways 4"),
            ("cold_affinity", False, "--no-cold-affinity"),
            ("policies", "flat-lb,cacheroute", ""),
        ),
    ),
    _Case(
        "Conversation workload, G = 4, load counted per request (what work units buy)",
        "conversation_g4_request_units",
        workload="conversation",
        options=(
            ("gateways", 4, "--gateways 4"),
            ("work_unit_tokens", 0, "--work-unit-tokens 0"),
            ("policies", "flat-lb,cacheroute", ""),
        ),
    ),
    _Case(
        "Whale workload, planned on request counts (what planning on work buys)",
        "whale_plan_on_requests",
        workload="whale",
        options=(
            ("plan_on_work", False, "--plan-on-requests"),
            ("policies", "flat-lb,cacheroute", ""),
        ),
    ),
    _Case(
        "Conversation workload, G = 1, without context slack (what that extension buys)",
        "conversation_g1_no_context_slack",
        workload="conversation",
        options=(
            ("context_slack", False, "--no-context-slack"),
            ("policies", "flat-lb,cacheroute", ""),
        ),
    ),
    _Case(
        "Whale workload without fair-share sizing (what that extension buys)",
        "whale_no_fair_share",
        workload="whale",
        options=(("fair_share", 0.0, "--fair-share 0"), ("policies", "flat-lb,cacheroute", "")),
    ),
    _Case(
        "Whale workload without sibling co-location (what that extension buys)",
        "whale_no_siblings",
        workload="whale",
        options=(
            ("group_separator", "", "--group-separator ''"),
            ("policies", "flat-lb,cacheroute", ""),
        ),
    ),
    _Case(
        "Whale workload without the dispatcher's overload spill (what that extension buys)",
        "whale_no_spill",
        workload="whale",
        options=(("spill_factor", 0.0, "--spill-factor 0"), ("policies", "flat-lb,cacheroute", "")),
    ),
    _Case(
        "Conversation trace with session keys, G = 16, without sibling co-location (what "
        "co-location costs there)",
        "conv-trace_g16_no_siblings",
        trace=_CONV_TRACE,
        options=(
            ("gateways", 16, "--gateways 16"),
            ("key_blocks", SESSION_KEYS, "--key-blocks session"),
            ("group_separator", "", "--group-separator ''"),
            ("policies", "flat-lb,chwbl,cacheroute", ""),
        ),
    ),
    _Case(
        "Conversation workload, G = 1, newly admitted keys placed where their traffic goes "
        "(--keep-homes, off by default)",
        "conversation_g1_keep_homes",
        workload="conversation",
        options=(("keep_homes", True, "--keep-homes"), ("policies", "flat-lb,cacheroute", "")),
    ),
    _Case(
        "Mooncake arXiv trace, G = 16, with --keep-homes (why it is off by default)",
        "mooncake_g16_keep_homes",
        trace=_MOONCAKE,
        options=(
            ("gateways", 16, "--gateways 16"),
            ("keep_homes", True, "--keep-homes"),
            ("policies", "flat-lb,cacheroute", ""),
        ),
    ),
    _Case(
        "Conversation trace keyed by its first 2 blocks, G = 1, without session hints (what "
        "that extension buys)",
        "conv-trace_kb2_g1_no_session_hints",
        trace=_CONV_TRACE,
        options=(
            ("key_blocks", 2, "--key-blocks 2"),
            ("session_hints", False, "--no-session-hints"),
            ("policies", "flat-lb,cacheroute", ""),
        ),
    ),
    _Case(
        "Conversation trace with default keys, G = 1, without spill homes (what they buy at one "
        "gateway)",
        "conv-trace_kb2_g1_no_spill_home",
        trace=_CONV_TRACE,
        options=(
            ("spill_home", "off", "--spill-home off"),
            ("policies", "flat-lb,cacheroute", ""),
        ),
    ),
    _Case(
        "Chat-shaped trace, G = 1, without context homes (what they buy at one gateway)",
        "chat_g1_no_context_home",
        trace=_CHAT_SHAPE,
        options=(
            ("context_home", "off", "--context-home off"),
            ("policies", "flat-lb,cacheroute", ""),
        ),
    ),
    _Case(
        "Demo traffic recorded by real gateways, G = 1, without prefix affinity (what following "
        "prompts' leading blocks buys at one gateway)",
        "demo-recorded_g1_no_prefix_affinity",
        trace=_DEMO_RECORDED,
        options=(
            ("prefix_affinity", "off", "--prefix-affinity off"),
            ("policies", "flat-lb,cacheroute", ""),
        ),
    ),
    _Case(
        "Conversation trace with session keys, G = 1, cold keys placed by their hashes instead of "
        "by missing blocks and cache churn (what cost placement buys at one gateway)",
        "conv-trace_g1_no_cold_cost",
        trace=_CONV_TRACE,
        options=(
            ("key_blocks", SESSION_KEYS, "--key-blocks session"),
            ("cold_cost", "off", "--cold-cost off"),
            ("policies", "flat-lb,cacheroute", ""),
        ),
    ),
    _Case(
        "Demo traffic recorded by real gateways, G = 1, without cost placement of cold keys "
        "(what it buys on short conversations)",
        "demo-recorded_g1_no_cold_cost",
        trace=_DEMO_RECORDED,
        options=(
            ("cold_cost", "off", "--cold-cost off"),
            ("policies", "flat-lb,cacheroute", ""),
        ),
    ),
    _Case(
        "Conversation workload, G = 16, with prefix affinity (why it is for one gateway only)",
        "conversation_g16_prefix_affinity",
        workload="conversation",
        options=(
            ("gateways", 16, "--gateways 16"),
            ("prefix_affinity", "on", "--prefix-affinity on"),
            ("policies", "flat-lb,cacheroute", ""),
        ),
    ),
    _Case(
        "Conversation workload, G = 1, without cache awareness (what estimating evicted contexts "
        "from the replicas' KV capacity buys at one gateway)",
        "conversation_g1_no_cache_aware",
        workload="conversation",
        options=(
            ("cache_aware", "off", "--cache-aware off"),
            ("policies", "flat-lb,cacheroute", ""),
        ),
    ),
    _Case(
        "Conversation trace with session keys, G = 16, planned on declared prefixes instead of "
        "the engines' reported cached tokens (what reported costs buy)",
        "conv-trace_g16_declared_cost",
        trace=_CONV_TRACE,
        options=(
            ("gateways", 16, "--gateways 16"),
            ("key_blocks", SESSION_KEYS, "--key-blocks session"),
            ("plan_cost", "declared", "--plan-cost declared"),
            ("policies", "flat-lb,chwbl,cacheroute", ""),
        ),
    ),
    _Case(
        "Whale workload planned on declared prefixes (what reported costs buy)",
        "whale_declared_cost",
        workload="whale",
        options=(
            ("plan_cost", "declared", "--plan-cost declared"),
            ("policies", "flat-lb,cacheroute", ""),
        ),
    ),
    _Case("Low-reuse workload (the losing regime)", "low-reuse", workload="low-reuse"),
    _Case(
        "Whale workload, G = 4, baselines gossip their prefix trees every second (--sync-s 1)",
        "whale_g4_sync1",
        workload="whale",
        options=(
            ("gateways", 4, "--gateways 4"),
            ("sync_s", 1.0, "--sync-s 1"),
            ("policies", _FLEET_POLICIES, ""),
        ),
    ),
    _Case(
        "Conversation workload, G = 4, baselines gossip their prefix trees every second",
        "conversation_g4_sync1",
        workload="conversation",
        options=(
            ("gateways", 4, "--gateways 4"),
            ("sync_s", 1.0, "--sync-s 1"),
            ("policies", _FLEET_POLICIES, ""),
        ),
    ),
)


_SHARED_STATE_SOURCES = (
    "whale",
    "conversation",
    "mooncake",
    "conv-trace-kb2",
    "chat-shape",
    "chat-sampled",
    "tenant-chat",
)


def _shared_state_cases() -> tuple[_Case, ...]:
    """G = 16 with every router sharing state four times a second: CacheRoute's gateways read
    each other's loads (`--peer-loads-s`, what `cacheroute gateway --peer` does), the reactive
    baselines gossip their prefix trees (`--sync-s`), once without and once with their loads
    (`--sync-load`: load snapshots help some baselines and herd others, so both are run and a
    reader takes each baseline's better one)."""
    cases = []
    for title, prefix, workload, trace in _FLEET_SOURCES:
        if prefix not in _SHARED_STATE_SOURCES:
            continue
        for loads in (False, True):
            shared = "prefix trees and loads" if loads else "prefix trees"
            options: tuple[tuple[str, Any, str], ...] = (
                ("gateways", 16, "--gateways 16"),
                ("peer_loads_s", 0.25, "--peer-loads-s 0.25"),
                ("sync_s", 0.25, "--sync-s 0.25"),
            )
            if loads:
                options += (("sync_load", True, "--sync-load"),)
            options += (("policies", _FLEET_POLICIES, ""),)
            cases.append(
                _Case(
                    f"{title.split(' (')[0]}, G = 16, every 0.25 s: CacheRoute's gateways read "
                    f"each other's loads, baselines gossip their {shared}",
                    f"{prefix}_g16_shared{'_loads' if loads else ''}",
                    workload=workload,
                    trace=trace,
                    options=options,
                )
            )
    return tuple(cases)


_SUITE = (*_SUITE, *_shared_state_cases())


def _evidence(opts: EvaluateOptions, console: Console) -> None:
    out: Path = opts.out or Path("docs/evaluation")
    doc: Path = opts.doc or out.parent / "EVALUATION.md"
    runs: list[EvidenceRun] = []
    evals: dict[str, Evaluation] = {}
    totals = {"wall_s": 0.0, "sim_requests": 0}
    for case in _SUITE:
        if case.trace is not None and not case.trace.exists():
            console.print(f"skipping {case.title}: {case.trace} not found")
            continue
        run_opts = dataclasses.replace(opts, **{name: value for name, value, _ in case.options})
        fmt = "auto"
        run = _make_run(run_opts, case.workload, case.trace, fmt)
        console.print(f"[bold]{case.title}[/]")
        result, timing = _run(run, console)
        data = result.to_dict() | timing
        files = _write_outputs(result, data, out, prefix=f"{case.prefix}_")
        links = {n: relative(Path(f), doc.parent) for n, f in files.items()}
        source = f"--workload {case.workload}" if case.workload else f"--trace {case.trace}"
        flags = " ".join(flag for _, _, flag in case.options if flag)
        policies = {n: v for n, v, _ in case.options}.get("policies")
        if policies:
            flags += f" --policies {policies}"
        quick = " --quick" if opts.quick else ""
        cmd = f"cacheroute evaluate {source}{quick} {flags} --out DIR".replace("  ", " ")
        runs.append(EvidenceRun(case.title, result, links, cmd, fleet_group=case.fleet_group))
        evals[case.prefix] = result
        totals["wall_s"] += timing["wall_s"]
        totals["sim_requests"] += timing["sim_requests"]
        _render(result, timing, console)
    totals["sim_requests_per_s"] = totals["sim_requests"] / max(1e-9, totals["wall_s"])
    checks = evidence_checks(evals.get("whale_g1"), evals.get("low-reuse"))
    doc.parent.mkdir(parents=True, exist_ok=True)
    from cacheroute.replay.plots import save_fleet_plot  # noqa: PLC0415 - matplotlib is slow

    fleet_plots = {}
    for i, (group, caps) in enumerate(fleet_capacities(runs).items()):
        path = save_fleet_plot(group, caps, out / f"fleet_{i}.png")
        fleet_plots[group] = relative(path, doc.parent)
    doc.write_text(
        render_evidence(
            runs, checks, header=_EVIDENCE_HEADER, timing=totals, fleet_plots=fleet_plots
        ),
        encoding="utf-8",
    )
    console.print(f"wrote {doc} and the plots under {out}")
