"""Shadow evaluation: every policy over a load sweep, SLO capacity, the diagnostic and a verdict.

Steps (all deterministic for a seed; no clock - the shell times it):
  1. **knee** - the capacity of one replica: an affinity-like slice of the workload (the keys whose
     rendezvous home is one of the first R/5 replicas, none heavier than a replica's share) on R/5
     replicas, load raised until p99 leaves the SLO. It is `q_cap` unless one is given (the paper
     measures q_cap the same way: the QPS where tail latency explodes).
  2. **sweep** - each policy at offered loads `load_factors` x R x knee (requests/s; the replay is
     time-compressed to each load). A policy stops after two failing loads in a row; one that
     still serves the top load goes on in x1.2 steps (at most `extend_steps`) until it fails.
  3. **capacity** - the highest load whose p99 (TTFT by default) stays under the SLO, refined by
     bisection between the last passing and the first failing load.
  4. **reference load** - the highest sweep load at which Flat-LB still passes (matched load):
     hit rate, imbalance and p99 per policy are quoted there.
  5. **verdicts** - simulation: `win` if CacheRoute's capacity is >= 1.10x Flat-LB's, `lose` if
     <= 0.90x, else `tie`; the diagnostic's own (diagnostic.py) from the workload alone; and the
     recommendation `deploy` only if CacheRoute beats Flat-LB on both capacity (>= 1 + margin)
     and p99 at the reference load (<= 1 - margin), margin 10% - hit rate alone never counts.
Optionally a cluster-size sweep: Flat-LB and CacheRoute at R in `cluster_sizes` at one fixed
offered load (and their capacities there).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal, Protocol

import numpy as np

from cacheroute.replay.diagnostic import Diagnosis, Verdict, diagnose
from cacheroute.replay.errors import ReplayError
from cacheroute.replay.metrics import RunMetrics, SloMetric
from cacheroute.replay.planned import rendezvous_order
from cacheroute.replay.policies import POLICY_NAMES
from cacheroute.replay.policy import PlanConfig, PolicyContext, key_hashes
from cacheroute.replay.requestset import RequestSet
from cacheroute.replay.simulator import SimConfig, simulate

__all__ = ["EvalConfig", "Evaluation", "PolicyReport", "Reporter", "evaluate", "find_knee"]

Recommendation = Literal["deploy", "keep flat-lb"]
DEFAULT_FACTORS = (0.25, 0.4, 0.55, 0.7, 0.85, 1.0, 1.2, 1.45)
EXTEND_FACTOR = 1.2
"""A policy that still serves the top sweep load is run at x1.2 steps until it fails."""


class Reporter(Protocol):
    """Progress sink (the CLI draws rich progress bars with it)."""

    def stage(self, label: str, total: int) -> None: ...
    def advance(self, n: int) -> None: ...


class _Silent:
    def stage(self, label: str, total: int) -> None:
        del label, total

    def advance(self, n: int) -> None:
        del n


@dataclass(frozen=True, slots=True)
class EvalConfig:
    """What to compare and how."""

    policies: tuple[str, ...] = POLICY_NAMES
    sim: SimConfig = field(default_factory=SimConfig)
    slo_ms: float = 2000.0
    slo_metric: SloMetric = "ttft"
    load_factors: tuple[float, ...] = DEFAULT_FACTORS
    extend_steps: int = 6
    """At most this many x1.2 steps beyond the sweep for a policy that still serves its top (a
    capacity that is still the top of the sweep after them is a lower bound, shown as such)."""
    refine_steps: int = 3
    q_cap: float | None = None
    q_cap_factor: float = 1.0
    """Without `q_cap`: q_cap = this x the measured knee."""
    warm_slots: int = 128
    intervals: int = 15
    """Control intervals per replay (the interval is the replay's duration / this)."""
    oracle: bool = False
    rate_decay: float = 1.0
    fair_share: float | None = 1.0
    """cacheroute's fair-share sizing (None: the paper's k_b rule only)."""
    group_separator: str | None = "/"
    """cacheroute's sibling co-location (None: plain LPT)."""
    spill_factor: float | None = 2.0
    """cacheroute's dispatcher overload spill (None: the paper's dispatch rule)."""
    margin: float = 0.10
    """Deploy only if capacity is >= (1 + margin)x and p99 <= (1 - margin)x Flat-LB's: the same
    +-10% band the verdicts call a tie, so a tie never deploys."""
    cluster_sizes: tuple[int, ...] = ()
    cluster_load_qps: float | None = None
    """Offered load of the cluster-size sweep (default: the reference load)."""

    def __post_init__(self) -> None:
        unknown = [p for p in self.policies if p not in POLICY_NAMES]
        if unknown:
            raise ReplayError(f"unknown policies {unknown}; choose from {', '.join(POLICY_NAMES)}")
        if "flat-lb" not in self.policies or "cacheroute" not in self.policies:
            raise ReplayError("the comparison needs at least flat-lb and cacheroute")
        if not self.load_factors or min(self.load_factors) <= 0 or self.slo_ms <= 0:
            raise ReplayError("load factors and the SLO must be > 0")
        if self.q_cap_factor <= 0:
            raise ReplayError("q_cap_factor must be > 0")
        if self.spill_factor is not None and not self.spill_factor >= 1.0:
            raise ReplayError("spill_factor must be >= 1 (or None: never spill)")
        if self.fair_share is not None and not self.fair_share > 0.0:
            raise ReplayError("fair_share must be > 0 (or None: the paper's k_b rule)")


@dataclass(frozen=True, slots=True)
class PolicyReport:
    """One policy: its sweep, capacity and figures at the reference load."""

    name: str
    sweep: tuple[RunMetrics, ...]
    slo_capacity_qps: float
    at_reference: RunMetrics
    info: dict[str, Any]
    at_capacity: RunMetrics | None = None
    """The sweep run at the highest load this policy served within the SLO (None: none did)."""
    capacity_is_lower_bound: bool = False
    """True if the policy still served the highest load run: its capacity is at least that."""

    def to_dict(self, metric: SloMetric, slo_ms: float) -> dict[str, Any]:
        """JSON form: headline figures at the reference load, then the sweep."""
        ref = self.at_reference
        return {
            "hit_rate": ref.hit_rate,
            "max_over_mean": ref.max_over_mean,
            "max_over_mean_prefill": ref.max_over_mean_prefill,
            "p99_ms": ref.p99_ms(metric),
            "ttft_p50_ms": ref.ttft_p50_ms,
            "ttft_p99_ms": ref.ttft_p99_ms,
            "e2e_p50_ms": ref.e2e_p50_ms,
            "e2e_p99_ms": ref.e2e_p99_ms,
            "hot_ttft_p99_ms": ref.hot_ttft_p99_ms,
            "cold_ttft_p99_ms": ref.cold_ttft_p99_ms,
            "slo_capacity_qps": self.slo_capacity_qps,
            "slo_capacity_is_lower_bound": self.capacity_is_lower_bound,
            "load_at_reference": list(ref.load),
            "at_capacity": None
            if self.at_capacity is None
            else {
                "offered_qps": self.at_capacity.offered_qps,
                "hit_rate": self.at_capacity.hit_rate,
                "max_over_mean": self.at_capacity.max_over_mean,
                "p99_ms": self.at_capacity.p99_ms(metric),
            },
            "info": self.info,
            "sweep": [
                {
                    "offered_qps": m.offered_qps,
                    "hit_rate": m.hit_rate,
                    "p99_ms": m.p99_ms(metric),
                    "max_over_mean": m.max_over_mean,
                    "passed": m.p99_ms(metric) <= slo_ms,
                }
                for m in self.sweep
            ],
        }


@dataclass(frozen=True, slots=True)
class Evaluation:
    """Everything `cacheroute evaluate` reports."""

    workload: dict[str, Any]
    config: EvalConfig
    knee_qps: float
    q_cap: float
    loads_qps: tuple[float, ...]
    reference_qps: float
    policies: dict[str, PolicyReport]
    diagnostic: Diagnosis
    simulation_verdict: Verdict
    capacity_ratio: float
    p99_ratio: float
    recommendation: Recommendation
    cluster_sweep: list[dict[str, Any]]
    sim_requests: int

    @property
    def agree(self) -> bool:
        """Whether the diagnostic's verdict matches the simulation's."""
        return self.diagnostic.verdict == self.simulation_verdict

    def to_dict(self) -> dict[str, Any]:
        """One JSON object (see `cacheroute evaluate --json`)."""
        cfg = self.config
        return {
            "workload": self.workload,
            "cluster": {
                "destinations": cfg.sim.destinations,
                "service": cfg.sim.service.to_dict(),
                "slo_ms": cfg.slo_ms,
                "slo_metric": cfg.slo_metric,
                "warmup_fraction": cfg.sim.warmup_fraction,
                "seed": cfg.sim.seed,
            },
            "plan": {
                "q_cap": self.q_cap,
                "q_cap_source": "given"
                if cfg.q_cap is not None
                else f"{cfg.q_cap_factor:g} x the measured knee",
                "warm_slots": cfg.warm_slots,
                "control_intervals_per_replay": cfg.intervals,
                "oracle_rates": cfg.oracle,
                "rate_decay": cfg.rate_decay,
                "fair_share": cfg.fair_share,
                "group_separator": cfg.group_separator,
                "spill_factor": cfg.spill_factor,
            },
            "knee_qps_per_replica": self.knee_qps,
            "loads_qps": list(self.loads_qps),
            "reference_qps": self.reference_qps,
            "policies": {
                n: p.to_dict(cfg.slo_metric, cfg.slo_ms) for n, p in self.policies.items()
            },
            "diagnostic": self.diagnostic.to_dict(),
            "simulation": {
                "verdict": self.simulation_verdict,
                "capacity_ratio": self.capacity_ratio,
                "p99_ratio_at_reference": self.p99_ratio,
            },
            "agree": self.agree,
            "recommendation": self.recommendation,
            "cluster_sweep": self.cluster_sweep,
            "sim_requests": self.sim_requests,
        }


@dataclass(slots=True)
class _Runner:
    """Runs (policy, load) simulations of one base replay, counting simulated requests."""

    base: RequestSet
    cfg: EvalConfig
    reporter: Reporter
    q_cap: float = 1.0
    simulated: int = 0
    hashes: np.ndarray[Any, np.dtype[np.uint64]] = field(
        default_factory=lambda: np.zeros(0, dtype=np.uint64)
    )
    last_info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.hashes = key_hashes(self.base.keys)

    def at(self, load: float, base: RequestSet | None = None) -> RequestSet:
        b = base if base is not None else self.base
        return b.compressed(load / b.rate)

    def run(self, policy: str, load: float, destinations: int | None = None) -> RunMetrics:
        requests = self.at(load)
        sim = (
            self.cfg.sim
            if destinations is None
            else replace(self.cfg.sim, destinations=destinations)
        )
        plan = self.plan_config(requests)
        ctx = PolicyContext(
            requests=requests,
            destinations=sim.destinations,
            seed=sim.seed,
            service=sim.service,
            plan=plan,
            hashes=self.hashes,
        )
        result = simulate(
            requests, policy, sim, plan, context=ctx, on_progress=self.reporter.advance
        )
        self.simulated += requests.n
        self.last_info = result.policy_info
        return result.metrics

    def plan_config(self, requests: RequestSet) -> PlanConfig:
        return PlanConfig(
            q_cap=self.q_cap,
            warm_slots=self.cfg.warm_slots,
            control_interval_s=max(requests.duration, 1e-6) / self.cfg.intervals,
            oracle=self.cfg.oracle,
            rate_decay=self.cfg.rate_decay,
            fair_share=self.cfg.fair_share,
            group_separator=self.cfg.group_separator,
            spill_factor=self.cfg.spill_factor,
        )

    def passes(self, m: RunMetrics) -> bool:
        return m.p99_ms(self.cfg.slo_metric) <= self.cfg.slo_ms


def find_knee(
    requests: RequestSet,
    config: EvalConfig,
    *,
    reporter: Reporter | None = None,
    steps: int = 6,
) -> tuple[float, int]:
    """Per-replica capacity (requests/s) on an affinity-like slice; returns (knee, requests run)."""
    rep = reporter or _Silent()
    r = config.sim.destinations
    g = max(1, r // 5)
    home = rendezvous_order(key_hashes(requests.keys), r)[:, 0]
    counts = requests.key_counts()
    light = counts <= counts.sum() / r
    chosen = (home < g) & light
    mask = chosen[requests.key_index]
    if int(mask.sum()) < 50:
        raise ReplayError("the workload is too small to measure a replica's knee")
    sub = _subset(requests, mask)
    sim = replace(config.sim, destinations=g)
    cfg = replace(config, sim=sim)
    runner = _Runner(sub, cfg, rep)  # `sticky` on the slice: q_cap is not used
    rep.stage(f"knee: {g} replica(s), affinity slice", sub.n * (steps + 6))
    lo, hi = 0.0, math.inf
    load = max(0.5, sub.rate)
    for _ in range(30):  # bracket the knee: double up from a pass, halve down from a failure
        if runner.passes(runner.run("sticky", load)):
            lo = load
            load *= 2
        else:
            hi = load
            load /= 2
        if lo > 0 and not math.isinf(hi):
            break
    if lo == 0.0:
        raise ReplayError("no load meets the SLO even on an idle replica; raise --slo-ms")
    for _ in range(steps):
        mid = math.sqrt(lo * hi)
        if runner.passes(runner.run("sticky", mid)):
            lo = mid
        else:
            hi = mid
    return lo / g, runner.simulated


def _subset(q: RequestSet, mask: np.ndarray[Any, np.dtype[np.bool_]]) -> RequestSet:
    idx = np.flatnonzero(mask)
    sizes = np.diff(q.block_offsets)[idx]
    offsets = np.zeros(idx.size + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    gather = np.repeat(q.block_offsets[:-1][idx] - offsets[:-1], sizes) + np.arange(
        int(offsets[-1])
    )
    return replace(
        q,
        times=q.times[idx],
        key_index=q.key_index[idx],
        prompt_tokens=q.prompt_tokens[idx],
        output_tokens=q.output_tokens[idx],
        prefix_tokens=q.prefix_tokens[idx],
        block_offsets=offsets,
        block_ids=q.block_ids[gather],
        notes=(*q.notes, "affinity slice"),
    )


def _sweep(
    runner: _Runner, name: str, loads: Sequence[float], extend_steps: int
) -> tuple[list[RunMetrics], dict[str, Any]]:
    """One policy over the loads (two failures in a row end it), extended past a passing top."""
    sweep: list[RunMetrics] = []
    fails = 0
    for load in loads:
        m = runner.run(name, load)
        sweep.append(m)
        fails = 0 if runner.passes(m) else fails + 1
        if fails == 2:
            break
    load = loads[-1]
    for _ in range(extend_steps):  # still serving at the top: find where it stops
        if not runner.passes(sweep[-1]):
            break
        load *= EXTEND_FACTOR
        sweep.append(runner.run(name, load))
    return sweep, runner.last_info


def _capacity(runner: _Runner, policy: str, sweep: Sequence[RunMetrics], refine: int) -> float:
    """Highest passing load: last pass before the first failure, refined by bisection."""
    lo = 0.0
    hi = math.inf
    for m in sweep:
        if runner.passes(m):
            lo = m.offered_qps
        else:
            hi = m.offered_qps
            break
    if math.isinf(hi):
        return lo  # passed everything: capacity is at least the top of the sweep
    low = lo if lo > 0 else hi / 4
    for _ in range(refine):
        mid = math.sqrt(low * hi)
        if runner.passes(runner.run(policy, mid)):
            lo = low = mid
        else:
            hi = mid
    return lo


def evaluate(
    base: RequestSet,
    config: EvalConfig,
    *,
    workload_info: dict[str, Any] | None = None,
    reporter: Reporter | None = None,
) -> Evaluation:
    """Run the whole comparison on `base` (any offered load; it is rescaled)."""
    rep = reporter or _Silent()
    runner = _Runner(base, config, rep)
    knee, knee_requests = find_knee(base, config, reporter=rep)
    runner.simulated += knee_requests
    runner.q_cap = config.q_cap if config.q_cap is not None else config.q_cap_factor * knee
    r = config.sim.destinations
    loads = tuple(float(f * r * knee) for f in sorted(config.load_factors))
    reports: dict[str, PolicyReport] = {}
    sweeps: dict[str, list[RunMetrics]] = {}
    infos: dict[str, dict[str, Any]] = {}
    for name in config.policies:
        rep.stage(f"{name}: load sweep", base.n * len(loads))
        sweeps[name], infos[name] = _sweep(runner, name, loads, config.extend_steps)
    flat = sweeps["flat-lb"]
    passing = [m.offered_qps for m in flat if runner.passes(m)]
    reference = max(passing) if passing else loads[0]
    for name in config.policies:
        rep.stage(f"{name}: capacity", base.n * config.refine_steps)
        cap = _capacity(runner, name, sweeps[name], config.refine_steps)
        ref = next((m for m in sweeps[name] if m.offered_qps == reference), None)
        if ref is None:
            ref = runner.run(name, reference)
        served = [m for m in sweeps[name] if runner.passes(m)]
        top = max(served, key=lambda m: m.offered_qps) if served else None
        reports[name] = PolicyReport(
            name,
            tuple(sweeps[name]),
            cap,
            ref,
            infos.get(name, {}),
            at_capacity=top,
            capacity_is_lower_bound=runner.passes(sweeps[name][-1]),
        )
    rep.stage("diagnostic", 1)
    diag = diagnose(runner.at(reference), r, config.sim.service)
    rep.advance(1)
    cr, fl = reports["cacheroute"], reports["flat-lb"]
    ratio = cr.slo_capacity_qps / fl.slo_capacity_qps if fl.slo_capacity_qps > 0 else math.inf
    metric = config.slo_metric
    p99_ratio = cr.at_reference.p99_ms(metric) / max(1e-9, fl.at_reference.p99_ms(metric))
    verdict: Verdict = "win" if ratio >= 1.10 else "lose" if ratio <= 0.90 else "tie"
    better = ratio >= 1 + config.margin and p99_ratio <= 1 - config.margin
    cluster = _cluster_sweep(runner, config, reference) if config.cluster_sizes else []
    info = dict(workload_info or {})
    info.update(base.stats())
    info["base_rate_qps"] = base.rate
    return Evaluation(
        workload=info,
        config=config,
        knee_qps=knee,
        q_cap=runner.q_cap,
        loads_qps=loads,
        reference_qps=reference,
        policies=reports,
        diagnostic=diag,
        simulation_verdict=verdict,
        capacity_ratio=ratio,
        p99_ratio=p99_ratio,
        recommendation="deploy" if better else "keep flat-lb",
        cluster_sweep=cluster,
        sim_requests=runner.simulated,
    )


def _cluster_sweep(runner: _Runner, config: EvalConfig, reference: float) -> list[dict[str, Any]]:
    """Flat-LB vs CacheRoute at each R: figures at one fixed load, and capacities."""
    load = config.cluster_load_qps or reference
    r0 = config.sim.destinations
    out: list[dict[str, Any]] = []
    for r in config.cluster_sizes:
        row: dict[str, Any] = {"destinations": r, "offered_qps": load}
        scale = r / r0
        for name in ("flat-lb", "cacheroute"):
            runner.reporter.stage(f"cluster R={r}: {name}", runner.base.n * 8)
            fixed = runner.run(name, load, destinations=r)
            grid = [f * load * scale for f in (0.5, 0.75, 1.0, 1.3, 1.7, 2.2)]
            sweep: list[RunMetrics] = []
            for g in grid:
                m = runner.run(name, g, destinations=r)
                sweep.append(m)
                if not runner.passes(m):
                    break
            cap = _cluster_capacity(runner, name, sweep, r)
            row[name] = {
                "hit_rate": fixed.hit_rate,
                "p99_ms": fixed.p99_ms(config.slo_metric),
                "max_over_mean": fixed.max_over_mean,
                "slo_capacity_qps": cap,
            }
        f, c = row["flat-lb"], row["cacheroute"]
        row["capacity_ratio"] = (
            c["slo_capacity_qps"] / f["slo_capacity_qps"] if f["slo_capacity_qps"] else math.inf
        )
        row["p99_ratio"] = f["p99_ms"] / max(1e-9, c["p99_ms"])
        out.append(row)
    return out


def _cluster_capacity(runner: _Runner, name: str, sweep: list[RunMetrics], r: int) -> float:
    lo = max((m.offered_qps for m in sweep if runner.passes(m)), default=0.0)
    fails = [m.offered_qps for m in sweep if not runner.passes(m)]
    if not fails:
        return lo
    hi = min(fails)
    low = lo if lo > 0 else hi / 4
    for _ in range(runner.cfg.refine_steps):
        mid = math.sqrt(low * hi)
        if runner.passes(runner.run(name, mid, destinations=r)):
            lo = low = mid
        else:
            hi = mid
    return lo


def describe_config(config: EvalConfig) -> dict[str, Any]:
    """The config as a plain dict (for reports)."""
    out = asdict(config)
    out["sim"]["service"] = config.sim.service.to_dict()
    return out
