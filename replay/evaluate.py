"""Shadow evaluation: every policy over a load sweep, SLO capacity, the diagnostic and a verdict.

Steps (all deterministic for a seed; no clock - the shell times it):
  0. **SLO** - given (`slo_auto=False`, `--slo-ms X`), or auto (the default): measure the p99 of
     the SLO metric on an *idle* replica - the workload on one replica, its arrivals spaced so
     that each finds the replica empty (pure service time, cache hits included) - and the knee's
     slice on its R/5 replicas at the lowest load the knee search may use (each replica busy 0.1%
     of the time; a trace's simultaneous arrivals still queue there); with `idle` the larger,
         SLO = slo_ms (2000 ms)                      if 2.5 x idle <= slo_ms,
         SLO = 2.5 x idle, rounded UP to two significant figures (20,750 -> 21,000 ms) otherwise.
     Why 2.5x: the knee is where queueing pushes p99 past the SLO, so the multiple is how much
     queueing the SLO allows on top of the pure service tail - at 2.5x, 1.5 idle p99s. At 2x or
     less one long prompt queued behind another already breaks it (the knee then measures burst
     luck, not capacity); at the ~5-6x the 2 s default gives the synthetic workloads (idle p99
     0.34-0.41 s) a long-context trace would get SLOs of a minute or more. The same factor is
     the headroom test, so the rule is continuous: SLO = max(2000 ms, 2.5 x idle, rounded up).
     The Mooncake arXiv trace (85k-token prefills take ~8 s) gets 22-23 s instead of "no load
     meets the SLO"; the knee search never halves below the slice's measured load, which passes by
     construction, so with auto it always finds a load.
  1. **knee** - the capacity of one replica: an affinity-like slice of the workload (the keys whose
     rendezvous home is one of the first R/5 replicas, none heavier than a replica's share; by
     conversation instead when the keys are too coarse for that, e.g. one system prompt shared
     by every conversation of a trace keyed by its leading blocks; by request as a last resort)
     on R/5 replicas, load raised until p99 leaves the SLO. It is `q_cap` unless one is given (the paper
     measures q_cap the same way: the QPS where tail latency explodes). `evaluate(knee_requests=)`
     measures it on held-out requests (the CLI: the same source with seed + 1000) so that q_cap
     is not tuned on the requests it is evaluated on; without them it is measured on the
     evaluated requests, and `plan.q_cap_source` says which.
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
offered load (and their capacities there: grid 0.5-2.2x the load scaled to R, extended past a
passing top in x1.2 steps as the main sweep is; a capacity still passing after them is a lower
bound, `slo_capacity_is_lower_bound`).
"""

from __future__ import annotations

import logging
import math
import multiprocessing
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal, Protocol

import numpy as np

from cacheroute.dispatcher.routing import DEFAULT_SPILL_MIN_INFLIGHT
from cacheroute.planner.params import DEFAULT_FAIR_SHARE, PlannerParams
from cacheroute.planner.smoothing import SmoothingParams
from cacheroute.replay.diagnostic import Diagnosis, Verdict, diagnose
from cacheroute.replay.errors import ReplayError
from cacheroute.replay.fleet import FleetConfig
from cacheroute.replay.metrics import RunMetrics, SloMetric
from cacheroute.replay.planned import rendezvous_order
from cacheroute.replay.policies import POLICY_NAMES
from cacheroute.replay.policy import WARM_SLOTS, PlanConfig, PolicyContext, key_hashes
from cacheroute.replay.requestset import RequestSet
from cacheroute.replay.service import ServiceModel
from cacheroute.replay.simulator import RunResult, SimConfig, simulate
from cacheroute.replay.traces import session_hints

__all__ = [
    "Calibration",
    "EvalConfig",
    "Evaluation",
    "PolicyReport",
    "Reporter",
    "calibrate",
    "evaluate",
    "find_knee",
    "gather",
    "servable",
]

Recommendation = Literal["deploy", "keep flat-lb"]
DEFAULT_FACTORS = (0.25, 0.4, 0.55, 0.7, 0.85, 1.0, 1.2, 1.45)
EXTEND_FACTOR = 1.2
"""A policy that still serves the top sweep load is run at x1.2 steps until it fails."""
DEFAULT_SLO_MS = 2000.0
PLANNER_INTERVAL_S = PlannerParams(q_cap=1.0, warm_slots=1).control_interval_s
"""The planner service's control interval (seconds), which is also its rate window."""
PLANNER_ALPHA = SmoothingParams().alpha
"""The weight of the newest window in the planner service's per-key rate EWMA."""
AUTO_SLO_MULTIPLE = 2.5
"""Auto SLO = this x the idle replica's p99 when that exceeds the default (module docstring)."""
IDLE_UTILISATION = 0.001
"""The auto SLO's knee-slice run (the knee search's floor): each replica busy this fraction of
the time by its service-time estimate."""
CLUSTER_GRID = (0.5, 0.75, 1.0, 1.3, 1.7, 2.2)
"""Cluster-size sweep loads, x the fixed load scaled to R (then x1.2 steps past a passing top)."""


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
    slo_ms: float = DEFAULT_SLO_MS
    """p99 SLO of `slo_metric` in ms: with `slo_auto` the default that is kept when an idle
    replica meets it with headroom (else raised, see the module docstring); without, as given."""
    slo_auto: bool = True
    """Derive the SLO from an idle replica when `slo_ms` is out of its reach; False: use `slo_ms`
    exactly (`--slo-ms X`). `Evaluation.config` carries the SLO that was used in `slo_ms`."""
    slo_metric: SloMetric = "ttft"
    load_factors: tuple[float, ...] = DEFAULT_FACTORS
    extend_steps: int = 6
    """At most this many x1.2 steps beyond the sweep for a policy that still serves its top (a
    capacity that is still the top of the sweep after them is a lower bound, shown as such)."""
    refine_steps: int = 3
    q_cap: float | None = None
    q_cap_factor: float = 1.0
    """Without `q_cap`: q_cap = this x the measured knee."""
    warm_slots: int = WARM_SLOTS
    intervals: int = 15
    """At least this many control intervals per replay (the interval is the replay's duration /
    this, or `control_interval_s` where that is shorter)."""
    control_interval_s: float | None = PLANNER_INTERVAL_S
    """The planner service's control interval (`planner run`, 60 s), in replay seconds: a
    replay re-plans this often, or `intervals` times if that is more often (synthetic replays
    last minutes, and a plan must come early). None: `intervals` times per replay only."""
    max_intervals: int = 256
    """At most this many control intervals per replay: a replay stretched to a low load (the knee
    search, the bottom of a sweep) would otherwise re-plan once a minute for days of replay time."""
    oracle: bool = False
    rate_decay: float | None = None
    """Per-interval weight of older rate counts: 1.0 = all requests so far, d < 1 = a recent
    window. None: what the planner service does - its per-key EWMA folds one 60 s window per
    interval with alpha 0.5, so counts halve every `PLANNER_INTERVAL_S` of replay time
    (`rate_decay_for`)."""
    fair_share: float | None = DEFAULT_FAIR_SHARE
    """cacheroute's fair-share sizing (None: the paper's k_b rule only)."""
    group_separator: str | None = "/"
    """cacheroute's sibling co-location (None: plain LPT)."""
    spill_factor: float | None = 2.0
    """cacheroute's dispatcher overload spill (None: the paper's dispatch rule)."""
    spill_min_inflight: int = DEFAULT_SPILL_MIN_INFLIGHT
    """...once the destination holds at least this many load units from the gateway."""
    work_unit_tokens: int | None = 512
    """cacheroute's gateways weigh a request 1 + uncached prompt tokens // this until its first
    token, then 1 (None: 1 throughout)."""
    plan_on_work: bool = True
    """cacheroute plans on work: each key's rate weighted by its mean request cost (False: on
    request counts, Algorithm 1's rates; an ablation)."""
    context_slack: bool = True
    """cacheroute's gateways let a key stay over the load bounds where its context is cached by
    what recomputing it would cost (False: the plain bounds; an ablation)."""
    cold_load_factor: float = 1.25
    """cacheroute's cold-path bound (CHWBL's c) on this gateway's in-flight load."""
    keep_homes: bool = False
    """cacheroute's planner places newly admitted keys where their latest request went
    (`PlanConfig.keep_homes`; off by default, an option)."""
    cold_affinity: bool = True
    """cacheroute's cold path: bounded-load consistent hashing (False: P2C, the paper's rule)."""
    spill_home: bool | None = None
    """cacheroute's gateways balance a planned key between its planned destination and its spill
    home (`Router.spill_home`); None: when there is one gateway (the only case it is for)."""
    context_home: bool | None = None
    """cacheroute's gateways send a key new in the live plan where its context is cached while
    that is the cheaper choice (`Router.context_home`); None: when there is one gateway (the
    only case it is for, as `spill_home`)."""
    reported_cost: bool = True
    """cacheroute's planner weighs keys by the uncached tokens the engines reported for their
    finished requests (`PlanConfig.reported_cost`); False: by the declared reusable prefix."""
    cache_aware: bool | None = None
    """cacheroute's gateways estimate what of a key's context is still cached from each
    replica's KV capacity (`PlanConfig.cache_aware`); False: cached until the key moves; None:
    when there is one gateway (the only case it is for, as `spill_home`)."""
    prefix_affinity: bool | None = None
    """cacheroute's gateways send a key new to their cold path where its prompt's leading blocks
    went (`PlanConfig.prefix_affinity`); None: when there is one gateway (as `spill_home`)."""
    cold_cost: bool | None = None
    """cacheroute's gateways place cold keys by missing blocks and cache churn
    (`PlanConfig.cold_cost`); None: when there is one gateway. Only with prefix affinity."""
    session_hints: bool = False
    """cacheroute's gateways also know each request's conversation (`traces.session_hints`),
    for sources whose keys are coarser than conversations (block traces keyed by leading
    blocks); the CLI sets it for those."""
    margin: float = 0.10
    """Deploy only if capacity is >= (1 + margin)x and p99 <= (1 - margin)x Flat-LB's: the same
    +-10% band the verdicts call a tie, so a tie never deploys."""
    cluster_sizes: tuple[int, ...] = ()
    cluster_load_qps: float | None = None
    """Offered load of the cluster-size sweep (default: the reference load)."""
    jobs: int = 1
    """Worker processes for the policies' sweeps (1: all in this process). Same results."""
    fleet: FleetConfig = field(default_factory=FleetConfig)
    """Gateways every policy runs in (each with its own state; plans shared), and the deal."""

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
        if self.jobs < 1:
            raise ReplayError("jobs must be >= 1")
        if self.spill_factor is not None and not self.spill_factor >= 1.0:
            raise ReplayError("spill_factor must be >= 1 (or None: never spill)")
        if self.fair_share is not None and not self.fair_share > 0.0:
            raise ReplayError("fair_share must be > 0 (or None: the paper's k_b rule)")
        if not 1 <= self.intervals <= self.max_intervals:
            raise ReplayError("intervals must be >= 1 and <= max_intervals")
        if self.control_interval_s is not None and not self.control_interval_s > 0.0:
            raise ReplayError("control_interval_s must be > 0 (or None: `intervals` per replay)")
        if self.rate_decay is not None and not 0.0 < self.rate_decay <= 1.0:
            raise ReplayError("rate_decay must be in (0, 1] (or None: the planner service's EWMA)")

    def _sole_gateway_rule(self, setting: bool | None) -> bool:
        """A rule that needs a gateway's view to be the whole cluster's: as set, else on at one
        gateway only."""
        return setting if setting is not None else self.fleet.gateways == 1

    def interval_s(self, requests: RequestSet) -> float:
        """The replay's control interval on `requests`: duration / `intervals`, or
        `control_interval_s` where that is shorter, but not below duration / `max_intervals`."""
        duration = max(requests.duration, 1e-6)
        interval = duration / self.intervals
        cap = self.control_interval_s
        return interval if cap is None else max(min(interval, cap), duration / self.max_intervals)

    def rate_decay_for(self, requests: RequestSet) -> float:
        """The per-interval decay of the rate counts on `requests`: `rate_decay` as set, else the
        planner service's EWMA over replay time (old counts weigh 1 - alpha per planner window),
        at the replay's interval."""
        if self.rate_decay is not None:
            return self.rate_decay
        decay = (1.0 - PLANNER_ALPHA) ** (self.interval_s(requests) / PLANNER_INTERVAL_S)
        return max(float(decay), 1e-12)  # > 0: an interval of hours keeps ~only its own counts

    def intervals_for(self, requests: RequestSet) -> int:
        """How many control intervals a replay of `requests` has."""
        return max(1, math.ceil(max(requests.duration, 1e-6) / self.interval_s(requests) - 1e-9))

    @property
    def resolved_spill_home(self) -> bool:
        """Whether cacheroute's gateways use their spill homes: as set, else at one gateway."""
        return self._sole_gateway_rule(self.spill_home)

    @property
    def resolved_context_home(self) -> bool:
        """Whether cacheroute's gateways use context homes: as set, else at one gateway."""
        return self._sole_gateway_rule(self.context_home)

    @property
    def resolved_prefix_affinity(self) -> bool:
        """Whether cacheroute's gateways follow prompts' blocks: as set, else at one gateway."""
        return self._sole_gateway_rule(self.prefix_affinity)

    @property
    def resolved_cold_cost(self) -> bool:
        """Whether cacheroute's gateways place cold keys by cost: as set, else at one gateway;
        never without prefix affinity (it reads the prefix index)."""
        return self._sole_gateway_rule(self.cold_cost) and self.resolved_prefix_affinity

    @property
    def resolved_cache_aware(self) -> bool:
        """Whether cacheroute's gateways estimate eviction: as set, else at one gateway."""
        return self._sole_gateway_rule(self.cache_aware)


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
class SloChoice:
    """The SLO an evaluation used and where it came from (see the module docstring's step 0)."""

    ms: float
    auto: bool
    """Chosen by the auto rule (False: given with `slo_auto=False` / `--slo-ms X`)."""
    idle_p99_ms: float | None = None
    """Auto: p99 of the SLO metric of the evaluated workload on one idle replica."""
    knee_idle_p99_ms: float | None = None
    """Auto: the same for the knee's slice on its R/5 replicas (the rule uses the larger)."""
    default_ms: float = DEFAULT_SLO_MS

    @property
    def derived(self) -> bool:
        """True if the auto rule raised the SLO above the default."""
        return self.auto and self.ms != self.default_ms

    @property
    def rule(self) -> str:
        """One line for reports."""
        if not self.auto:
            return "given"
        idle, knee = self.idle_p99_ms or 0.0, self.knee_idle_p99_ms or 0.0
        what = (
            f"the idle replica's p99 {idle:.0f} ms"
            if idle >= knee
            else f"the knee slice's p99 at its lowest load {knee:.0f} ms (idle replica "
            f"{idle:.0f} ms)"
        )
        if self.derived:
            return (
                f"auto, derived: {AUTO_SLO_MULTIPLE:g} x {what}, rounded up to two significant "
                "figures"
            )
        return f"auto, default kept: {AUTO_SLO_MULTIPLE:g} x {what} fits in {self.default_ms:g} ms"


def auto_slo_ms(idle_p99_ms: float, default_ms: float = DEFAULT_SLO_MS) -> float:
    """The auto rule: `default_ms` if AUTO_SLO_MULTIPLE x idle p99 fits in it, else that product
    rounded up to two significant figures (8,300 ms idle -> 20,750 -> 21,000 ms)."""
    want = AUTO_SLO_MULTIPLE * idle_p99_ms
    if not want > default_ms:
        return default_ms
    e = math.floor(math.log10(want)) - 1
    digits = math.ceil(want / 10.0**e - 1e-9)  # 1e-9: float dust must not round 25.0 up to 26
    return float(digits * 10**e) if e >= 0 else digits / 10.0**-e


@dataclass(frozen=True, slots=True)
class Evaluation:
    """Everything `cacheroute evaluate` reports."""

    workload: dict[str, Any]
    config: EvalConfig
    """The config as run: `slo_ms` is the SLO used (the auto rule's choice; see `slo`)."""
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
    slo: SloChoice | None = None
    """How the SLO in `config.slo_ms` was chosen (None: not recorded - taken as given)."""
    knee_held_out: str | None = None
    """What the knee was measured on when held out (None: on the evaluated requests)."""
    knee_slice_by: KneeSliceBy = "key"
    """How the knee's affinity slice was cut: by routing key (the rule), or by conversation or
    request when the keys were too coarse for one (`_knee_slice`)."""

    @property
    def agree(self) -> bool:
        """Whether the diagnostic's verdict matches the simulation's."""
        return self.diagnostic.verdict == self.simulation_verdict

    def to_dict(self) -> dict[str, Any]:
        """One JSON object (see `cacheroute evaluate --json`)."""
        cfg = self.config
        slo = self.slo or SloChoice(cfg.slo_ms, auto=False)
        knee_on = self.knee_held_out or "the evaluated requests (not held out)"
        if self.knee_slice_by != "key":
            knee_on += f", sliced by {self.knee_slice_by} (the keys were too coarse)"
        return {
            "workload": self.workload,
            "cluster": {
                "destinations": cfg.sim.destinations,
                "service": cfg.sim.service.to_dict(),
                "slo_ms": cfg.slo_ms,
                "slo_auto": slo.auto,
                "slo_derived": slo.derived,
                "slo_idle_p99_ms": slo.idle_p99_ms,
                "slo_knee_slice_idle_p99_ms": slo.knee_idle_p99_ms,
                "slo_rule": slo.rule,
                "slo_metric": cfg.slo_metric,
                "warmup_fraction": cfg.sim.warmup_fraction,
                "seed": cfg.sim.seed,
            },
            "gateways": cfg.fleet.gateways,
            "deal": cfg.fleet.deal,
            "plan_delay_s": cfg.fleet.plan_delay_s,
            "sync_s": cfg.fleet.sync_s,
            "sync_load": cfg.fleet.sync_load,
            "peer_loads_s": cfg.fleet.peer_loads_s,
            "plan": {
                "q_cap": self.q_cap,
                "q_cap_source": "given"
                if cfg.q_cap is not None
                else f"{cfg.q_cap_factor:g} x the knee measured on {knee_on}",
                "knee_held_out": self.knee_held_out is not None,
                "knee_slice_by": self.knee_slice_by,
                "warm_slots": cfg.warm_slots,
                "control_intervals_per_replay": cfg.intervals,
                "control_interval_max_s": cfg.control_interval_s,
                "oracle_rates": cfg.oracle,
                "rate_decay": cfg.rate_decay,
                "rate_half_life_s": PLANNER_INTERVAL_S if cfg.rate_decay is None else None,
                "fair_share": cfg.fair_share,
                "group_separator": cfg.group_separator,
                "spill_factor": cfg.spill_factor,
                "cold_affinity": cfg.cold_affinity,
                "cold_load_factor": cfg.cold_load_factor,
                "spill_min_inflight": cfg.spill_min_inflight,
                "work_unit_tokens": cfg.work_unit_tokens,
                "context_slack": cfg.context_slack,
                "plan_on_work": cfg.plan_on_work,
                "keep_homes": cfg.keep_homes,
                "spill_home": cfg.resolved_spill_home,
                "context_home": cfg.resolved_context_home,
                "plan_cost": "reported" if cfg.reported_cost else "declared",
                "cache_aware": cfg.resolved_cache_aware,
                "prefix_affinity": cfg.resolved_prefix_affinity,
                "cold_cost": cfg.resolved_cold_cost,
                "session_hints": cfg.session_hints,
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

    sessions: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        self.hashes = key_hashes(self.base.keys)
        if self.cfg.session_hints:
            self.sessions = session_hints(self.base)

    def at(self, load: float, base: RequestSet | None = None) -> RequestSet:
        b = base if base is not None else self.base
        return b.compressed(load / b.rate)

    def run(self, policy: str, load: float, destinations: int | None = None) -> RunMetrics:
        result = self.simulate(policy, self.at(load), destinations)
        self.last_info = result.policy_info
        return result.metrics

    def simulate(
        self, policy: str, requests: RequestSet, destinations: int | None = None
    ) -> RunResult:
        """`requests` (this base, rescaled) through `policy` on the configured cluster."""
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
            sessions=self.sessions,
        )
        with _quiet_planner():
            result = simulate(
                requests,
                policy,
                sim,
                plan,
                context=ctx,
                fleet=self.cfg.fleet,
                on_progress=self.reporter.advance,
            )
        self.simulated += requests.n
        return result

    def plan_config(self, requests: RequestSet) -> PlanConfig:
        return PlanConfig(
            q_cap=self.q_cap,
            warm_slots=self.cfg.warm_slots,
            control_interval_s=self.cfg.interval_s(requests),
            oracle=self.cfg.oracle,
            rate_decay=self.cfg.rate_decay_for(requests),
            fair_share=self.cfg.fair_share,
            group_separator=self.cfg.group_separator,
            spill_factor=self.cfg.spill_factor,
            spill_min_inflight=self.cfg.spill_min_inflight,
            work_unit_tokens=self.cfg.work_unit_tokens,
            cold_load_factor=self.cfg.cold_load_factor,
            cold_affinity=self.cfg.cold_affinity,
            context_slack=self.cfg.context_slack,
            plan_on_work=self.cfg.plan_on_work,
            keep_homes=self.cfg.keep_homes,
            spill_home=self.cfg.resolved_spill_home,
            context_home=self.cfg.resolved_context_home,
            cache_aware=self.cfg.resolved_cache_aware,
            prefix_affinity=self.cfg.resolved_prefix_affinity,
            cold_cost=self.cfg.resolved_cold_cost,
            reported_cost=self.cfg.reported_cost,
        )

    def passes(self, m: RunMetrics) -> bool:
        return m.p99_ms(self.cfg.slo_metric) <= self.cfg.slo_ms


def find_knee(
    requests: RequestSet,
    config: EvalConfig,
    *,
    reporter: Reporter | None = None,
    steps: int = 6,
    floor_qps: float | None = None,
) -> tuple[float, int]:
    """Per-replica capacity (requests/s) on an affinity-like slice; returns (knee, requests run).

    Judged against `config.slo_ms` as it is (`evaluate` resolves the auto SLO first). `floor_qps`
    is a load of the slice known to pass (the auto SLO's idle run of the slice): halving down from
    a failure stops there instead of below it, so with the auto SLO a passing load is always found.
    """
    rep = reporter or _Silent()
    sub, g = _knee_slice(requests, config)
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
            nxt = load / 2
            load = floor_qps if floor_qps is not None and nxt < floor_qps < load else nxt
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


def _knee_slice(requests: RequestSet, config: EvalConfig) -> tuple[RequestSet, int]:
    """The knee's affinity-like slice and its replica count g = R/5 (module docstring, step 1);
    how it is cut: `_slice_mask`."""
    keyed, mask, g, _ = _slice_mask(requests, config)
    return keyed.subset(mask, "affinity slice"), g


_KNEE_MIN_REQUESTS = 50

KneeSliceBy = Literal["key", "conversation", "request"]


def knee_slice_by(requests: RequestSet, config: EvalConfig) -> KneeSliceBy:
    """How `_knee_slice` cuts the knee's slice of `requests` (what the report says)."""
    return _slice_mask(requests, config)[3]


def _slice_mask(
    requests: RequestSet, config: EvalConfig
) -> tuple[RequestSet, np.ndarray[Any, np.dtype[np.bool_]], int, KneeSliceBy]:
    """(the requests as keyed for the slice, the slice's mask over them, g = R/5, what keyed them).

    When the routing keys are too coarse to give a slice (a trace keyed by leading blocks whose
    conversations all share one system prompt: a handful of keys, each heavier than a replica's
    share), the slice is taken by conversation instead (`traces.session_hints`, what a gateway
    hashes from system prompt plus first message): the capacity of a replica whose
    conversations stay with it, which is what the knee measures. Failing that too (one
    conversation, or no blocks to find conversations by), by request.
    """
    r = config.sim.destinations
    g = max(1, r // 5)
    by: KneeSliceBy = "key"
    mask = _light_at_home(requests, r, g)
    rekeys: tuple[tuple[Callable[[RequestSet], RequestSet], KneeSliceBy], ...] = (
        (_keyed_by_session, "conversation"),
        (_keyed_by_request, "request"),
    )
    for rekey, kind in rekeys:
        if int(mask.sum()) >= _KNEE_MIN_REQUESTS:
            break
        finer = rekey(requests)
        if len(finer.keys) > len(requests.keys):
            requests, by = finer, kind
            mask = _light_at_home(requests, r, g)
    if int(mask.sum()) < _KNEE_MIN_REQUESTS:
        raise ReplayError(
            f"the workload is too small to measure a replica's knee: fewer than "
            f"{_KNEE_MIN_REQUESTS} of its {requests.n} requests fall on {g} of {r} replicas; "
            "pass more requests (--requests, or a longer trace)"
        )
    return requests, mask, g, by


def _light_at_home(requests: RequestSet, r: int, g: int) -> np.ndarray[Any, np.dtype[np.bool_]]:
    """Per request: its key is at most a replica's share and its rendezvous home is < g."""
    home = rendezvous_order(key_hashes(requests.keys), r)[:, 0]
    counts = requests.key_counts()
    light = counts <= counts.sum() / r
    out: np.ndarray[Any, np.dtype[np.bool_]] = ((home < g) & light)[requests.key_index]
    return out


def _keyed_by_request(requests: RequestSet) -> RequestSet:
    """The same requests, each its own key: the last resort of the knee's slice (a workload of
    one conversation has no affinity slice; the knee is then a replica's capacity without one)."""
    return replace(
        requests,
        keys=tuple(f"request-{i}" for i in range(requests.n)),
        key_index=np.arange(requests.n, dtype=np.int64),
        notes=(*requests.notes, "each request its own key"),
    )


def _keyed_by_session(requests: RequestSet) -> RequestSet:
    """The same requests with each conversation (`session_hints`) as its key."""
    if not requests.block_ids.size and requests.conversations is None:
        return requests
    index: dict[str, int] = {}
    sessions = session_hints(requests)
    key_index = np.fromiter(
        (index.setdefault(s, len(index)) for s in sessions), dtype=np.int64, count=requests.n
    )
    return replace(
        requests,
        keys=tuple(index),
        key_index=key_index,
        notes=(*requests.notes, "keyed by conversation"),
    )


def _idle_p99(
    requests: RequestSet,
    config: EvalConfig,
    destinations: int,
    reporter: Reporter,
    *,
    spaced: bool,
) -> tuple[float, float, int]:
    """p99 (ms, of the SLO metric) of `requests` routed by `sticky` to idle replicas.

    `spaced`: arrivals re-timed one every (longest service time) seconds, so each request finds
    its replica empty - pure service time, no queueing at all. Else the replay is time-compressed
    until each replica is busy IDLE_UTILISATION of the time (as the knee search runs it: a trace's
    simultaneous arrivals still queue). Service time per request, uncached: prefill + decode alone.
    Returns (p99 ms, the load run, requests run).
    """
    s = config.sim.service
    p = requests.prompt_tokens.astype(np.float64)
    o = requests.output_tokens.astype(np.float64)
    step = s.decode_base_s + s.decode_per_seq_s + s.decode_per_ctx_token_s * (p + o)
    serve = s.prefill_seconds(p, np.zeros_like(p)) + (o - 1.0) * step
    if spaced:
        gap = 1.01 * float(serve.max()) + 1e-3
        t0 = float(requests.times[0]) if requests.n else 0.0
        times = t0 + gap * np.arange(requests.n, dtype=np.float64)
        requests = replace(requests, times=times, notes=(*requests.notes, "spaced: idle replica"))
        load = requests.rate
    else:
        load = IDLE_UTILISATION * destinations / max(float(serve.mean()), 1e-9)
    cfg = replace(config, sim=replace(config.sim, destinations=destinations))
    runner = _Runner(requests, cfg, reporter)
    m = runner.run("sticky", load)
    return m.p99_ms(config.slo_metric), load, runner.simulated


def _choose_slo(
    base: RequestSet, knee_base: RequestSet, config: EvalConfig, reporter: Reporter
) -> tuple[SloChoice, float | None, int]:
    """The SLO to use (module docstring, step 0); returns (choice, knee floor load, requests run)."""
    if not config.slo_auto:
        return SloChoice(config.slo_ms, auto=False, default_ms=config.slo_ms), None, 0
    sub, g = _knee_slice(knee_base, config)
    reporter.stage("SLO: idle replica", base.n + sub.n)
    idle, _, n_base = _idle_p99(base, config, 1, reporter, spaced=True)
    slice_idle, floor, n_slice = _idle_p99(sub, config, g, reporter, spaced=False)
    ms = auto_slo_ms(max(idle, slice_idle), config.slo_ms)
    choice = SloChoice(ms, True, idle, slice_idle, default_ms=config.slo_ms)
    return choice, floor, n_base + n_slice


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


DESCEND_STEPS = 4
"""A policy that fails the sweep's lowest load is tried at 1/4, 1/16, ... of it, this many times,
before its capacity is called 0."""


def _capacity(runner: _Runner, policy: str, sweep: Sequence[RunMetrics], refine: int) -> float:
    """Highest passing load: last pass before the first failure, refined by bisection.

    A policy that fails even the lowest sweep load is run at a quarter of it, then a quarter of
    that, until it passes (at most `DESCEND_STEPS` times), and bisected from there. Before, the
    bisection assumed a quarter passed without running it, so a baseline that herds (SGLang's
    router on long prompts) was reported at 0.0 req/s while it serves a real, small load."""
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
    if lo <= 0:
        for _ in range(DESCEND_STEPS):
            if runner.passes(runner.run(policy, hi / 4)):
                lo = hi / 4
                break
            hi /= 4
        else:
            return 0.0
    for _ in range(refine):
        mid = math.sqrt(lo * hi)
        if runner.passes(runner.run(policy, mid)):
            lo = mid
        else:
            hi = mid
    return lo


@dataclass(frozen=True, slots=True)
class _PolicyRun:
    """One policy's sweep and capacity search (what a worker process sends back)."""

    sweep: list[RunMetrics]
    info: dict[str, Any]
    capacity: float
    simulated: int


def _policy_run(runner: _Runner, name: str, loads: tuple[float, ...]) -> _PolicyRun:
    before = runner.simulated
    sweep, info = _sweep(runner, name, loads, runner.cfg.extend_steps)
    capacity = _capacity(runner, name, sweep, runner.cfg.refine_steps)
    return _PolicyRun(sweep, info, capacity, runner.simulated - before)


_WORKER: list[Any] = []
"""The worker process's runner and loads (set once by `_init_worker`)."""


@contextmanager
def _quiet_planner() -> Iterator[None]:
    """Mute the planner's warnings below ERROR while a replay runs.

    A sweep re-plans every control interval of every run (thousands of plans); the planner's
    per-plan warnings (keys capped at R replicas) are for the planner service's operators, and
    here they would flood `evaluate`'s terminal once per plan. The replay reports its plans in
    its result; errors still show."""
    log = logging.getLogger("cacheroute.planner")
    old = log.level
    log.setLevel(max(old, logging.ERROR))
    try:
        yield
    finally:
        log.setLevel(old)


def _init_worker(runner: _Runner, loads: tuple[float, ...]) -> None:
    _WORKER[:] = [runner, loads]


def _in_worker(name: str) -> _PolicyRun:
    runner, loads = _WORKER
    return _policy_run(runner, name, loads)


def _policy_runs(runner: _Runner, loads: tuple[float, ...]) -> dict[str, _PolicyRun]:
    """Every policy's sweep and capacity: in this process, or in `cfg.jobs` worker processes.

    Policies are independent once the knee and the loads are known, so they run in parallel;
    each simulation stays deterministic (its seeds do not depend on the process), and the
    results are the same as in one process.
    """
    cfg, rep = runner.cfg, runner.reporter
    names = list(cfg.policies)
    per_policy = runner.base.n * (len(loads) + cfg.refine_steps)
    out: dict[str, _PolicyRun] = {}
    jobs = min(cfg.jobs, len(names))
    if jobs <= 1:
        for name in names:
            rep.stage(f"{name}: load sweep and capacity", per_policy)
            out[name] = _policy_run(runner, name, loads)
        return out
    rep.stage(f"{len(names)} policies in {jobs} processes", per_policy * len(names))
    quiet = replace(runner, reporter=_Silent())
    # spawn, not fork: the parent may run threads (progress bars, Kafka clients)
    ctx = multiprocessing.get_context("spawn")

    def done(name: str, run: _PolicyRun) -> None:
        out[name] = run
        runner.simulated += run.simulated
        rep.advance(per_policy)

    with ProcessPoolExecutor(jobs, ctx, _init_worker, (quiet, loads)) as pool:
        gather(pool, _in_worker, names, done)
    return {name: out[name] for name in names}


def gather(
    pool: ProcessPoolExecutor,
    fn: Callable[[str], Any],
    names: Sequence[str],
    done: Callable[[str, Any], None],
) -> None:
    """`done(name, fn(name))` for every name, as `pool`'s workers finish them.

    A worker that dies (killed, or out of memory: each holds its own copy of the workload) breaks
    the pool; that becomes a ReplayError saying what to do instead of a traceback.
    """
    futures = {pool.submit(fn, name): name for name in names}
    try:
        for future in as_completed(futures):
            done(futures[future], future.result())
    except BrokenProcessPool as exc:
        raise ReplayError(
            f"a worker process died while simulating ({exc}); if it ran out of memory, "
            "re-run with fewer --jobs (each holds a copy of the workload) or -j 1"
        ) from None


def servable(requests: RequestSet, service: ServiceModel) -> RequestSet:
    """`requests` as the replicas can serve them: without those whose prompt exceeds a replica's
    KV capacity (`service.cache_tokens`), and with outputs cut where prompt + output reaches it,
    each with a note saying how many and why.

    Why: an engine refuses a prompt over its `max_model_len` (and vLLM will not start with a
    `max_model_len` its KV cache cannot hold), and stops generating when the sequence reaches
    it; the simulator would run either for simulated hours and queue its replica behind it. A
    single 10M-token prompt in a 2,000-request trace took every policy's SLO capacity to 0; a
    single 10M-token output took a quarter off Flat-LB's. Raises if no request is left.
    """
    cap = service.cache_tokens
    prompt = requests.prompt_tokens
    over = prompt > cap
    count = int(over.sum())
    out = requests
    if count:
        longest = int(prompt.max())
        if count == requests.n:
            raise ReplayError(
                f"every request's prompt is longer than a replica's KV capacity "
                f"({cap:,} tokens; the longest {longest:,}); no engine could serve them: raise "
                "--cache-tokens to what your replicas hold"
            )
        out = requests.subset(
            ~over,
            f"left out {count:,} of {requests.n:,} requests whose prompt exceeds a replica's "
            f"KV capacity ({cap:,} tokens, --cache-tokens; the longest {longest:,}): an "
            "engine refuses them",
        )
    room = np.maximum(cap - out.prompt_tokens, 1)
    cut = out.output_tokens > room
    if cut.any():
        out = replace(
            out,
            output_tokens=np.minimum(out.output_tokens, room),
            notes=(
                *out.notes,
                f"cut {int(cut.sum()):,} outputs where prompt + output reaches a replica's KV "
                f"capacity ({cap:,} tokens; the longest asked {int(out.output_tokens.max()):,}): "
                "an engine stops there",
            ),
        )
    return out


def evaluate(
    base: RequestSet,
    config: EvalConfig,
    *,
    workload_info: dict[str, Any] | None = None,
    reporter: Reporter | None = None,
    knee_requests: RequestSet | None = None,
    knee_note: str = "held-out requests",
) -> Evaluation:
    """Run the whole comparison on `base` (any offered load; it is rescaled).

    `knee_requests`: held-out requests of the same workload (another seed; for a trace, another
    tiling) to measure the knee - hence q_cap and the sweep loads - on, described by `knee_note`
    in `plan.q_cap_source`. Without them the knee is measured on `base` itself.
    """
    rep = reporter or _Silent()
    base = servable(base, config.sim.service)
    knee_requests = None if knee_requests is None else servable(knee_requests, config.sim.service)
    knee_base = knee_requests if knee_requests is not None else base
    slo, floor, slo_run = _choose_slo(base, knee_base, config, rep)
    config = replace(config, slo_ms=slo.ms)
    runner = _Runner(base, config, rep)
    runner.simulated += slo_run
    knee, knee_run = find_knee(knee_base, config, reporter=rep, floor_qps=floor)
    runner.simulated += knee_run
    runner.q_cap = config.q_cap if config.q_cap is not None else config.q_cap_factor * knee
    r = config.sim.destinations
    loads = tuple(float(f * r * knee) for f in sorted(config.load_factors))
    reports: dict[str, PolicyReport] = {}
    runs = _policy_runs(runner, loads)
    sweeps = {name: run.sweep for name, run in runs.items()}
    flat = sweeps["flat-lb"]
    passing = [m.offered_qps for m in flat if runner.passes(m)]
    reference = max(passing) if passing else loads[0]
    for name in config.policies:
        cap = runs[name].capacity
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
            runs[name].info,
            at_capacity=top,
            capacity_is_lower_bound=runner.passes(sweeps[name][-1]),
        )
    rep.stage("diagnostic", 1)
    diag = diagnose(
        runner.at(reference),
        r,
        config.sim.service,
        q_cap=runner.q_cap,
        warm_slots=config.warm_slots,
        fair_share=config.fair_share,
        gateways=config.fleet.gateways,
        cold_affinity=config.cold_affinity,
        cold_load_factor=config.cold_load_factor,
        work_unit_tokens=config.work_unit_tokens,
        intervals=config.intervals_for(runner.at(reference)),
    )
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
        slo=slo,
        knee_held_out=knee_note if knee_requests is not None else None,
        knee_slice_by=knee_slice_by(knee_base, config),
    )


@dataclass(frozen=True, slots=True)
class Calibration:
    """The simulator on recorded traffic, as it was recorded: what it predicts the engines served."""

    policy: str
    destinations: int
    gateways: int
    requests: int
    offered_qps: float
    simulated_hit_rate: float
    """Token-weighted: cached / prompt tokens over every request (no warm-up cut, as served)."""
    left_out: int = 0
    """Recorded requests not simulated: prompts over the modelled KV capacity (`servable`)."""

    def to_dict(self) -> dict[str, Any]:
        """For the JSON report."""
        return asdict(self)


def calibrate(
    requests: RequestSet,
    config: EvalConfig,
    *,
    q_cap: float,
    destinations: int,
    gateways: int,
    policy: str = "cacheroute",
) -> Calibration:
    """Simulate `requests` at their own times (no tiling, no compression) with the cluster that
    served them (`destinations` replicas, `gateways` gateways), routed by `policy`.

    Comparing its hit rate with the one the engines reported for the same requests tells how far
    the service model (cache size, block size, eviction) is from the real replicas: the
    simulator's calibration on this traffic.
    """
    cfg = replace(
        config,
        sim=replace(config.sim, destinations=destinations),
        fleet=replace(config.fleet, gateways=gateways),
    )
    recorded = requests.n
    requests = servable(requests, cfg.sim.service)
    result = _Runner(requests, cfg, _Silent(), q_cap=q_cap).simulate(policy, requests)
    prompt = requests.prompt_tokens
    hit = float(np.minimum(result.cached, prompt).sum()) / max(1.0, float(prompt.sum()))
    return Calibration(
        policy=policy,
        destinations=destinations,
        gateways=gateways,
        requests=requests.n,
        offered_qps=requests.rate,
        simulated_hit_rate=hit,
        left_out=recorded - requests.n,
    )


def _cluster_sweep(runner: _Runner, config: EvalConfig, reference: float) -> list[dict[str, Any]]:
    """Flat-LB vs CacheRoute at each R: figures at one fixed load, and capacities.

    Capacities: the grid `CLUSTER_GRID` x the load scaled to R (stopping at the first failure),
    extended past a passing top in x1.2 steps (at most `extend_steps`) as the main sweep is, then
    bisection. A capacity still passing at the end is a lower bound (`slo_capacity_is_lower_bound`)
    and `capacity_ratio_is` says what the ratio is then: exact, a lower bound (CacheRoute's is
    one), an upper bound (Flat-LB's is one) or undetermined (both are).
    """
    load = config.cluster_load_qps or reference
    r0 = config.sim.destinations
    out: list[dict[str, Any]] = []
    for r in config.cluster_sizes:
        row: dict[str, Any] = {"destinations": r, "offered_qps": load}
        scale = r / r0
        for name in ("flat-lb", "cacheroute"):
            runner.reporter.stage(
                f"cluster R={r}: {name}",
                runner.base.n * (2 + len(CLUSTER_GRID) + config.extend_steps),
            )
            fixed = runner.run(name, load, destinations=r)
            grid = [f * load * scale for f in CLUSTER_GRID]
            sweep: list[RunMetrics] = []
            for g in grid:
                m = runner.run(name, g, destinations=r)
                sweep.append(m)
                if not runner.passes(m):
                    break
            top = grid[-1]
            for _ in range(config.extend_steps):  # still serving the top: find where it stops
                if not runner.passes(sweep[-1]):
                    break
                top *= EXTEND_FACTOR
                sweep.append(runner.run(name, top, destinations=r))
            cap = _cluster_capacity(runner, name, sweep, r)
            row[name] = {
                "hit_rate": fixed.hit_rate,
                "p99_ms": fixed.p99_ms(config.slo_metric),
                "max_over_mean": fixed.max_over_mean,
                "slo_capacity_qps": cap,
                "slo_capacity_is_lower_bound": runner.passes(sweep[-1]),
            }
        f, c = row["flat-lb"], row["cacheroute"]
        row["capacity_ratio"] = (
            c["slo_capacity_qps"] / f["slo_capacity_qps"] if f["slo_capacity_qps"] else math.inf
        )
        row["capacity_ratio_is"] = _ratio_kind(
            c["slo_capacity_is_lower_bound"], f["slo_capacity_is_lower_bound"]
        )
        row["p99_ratio"] = f["p99_ms"] / max(1e-9, c["p99_ms"])
        out.append(row)
    return out


def _ratio_kind(ours_lower: bool, flat_lower: bool) -> str:
    """What ours / Flat-LB's capacity is when either capacity may be only a lower bound."""
    if ours_lower and flat_lower:
        return "undetermined"
    return "lower bound" if ours_lower else "upper bound" if flat_lower else "exact"


def _cluster_capacity(runner: _Runner, name: str, sweep: list[RunMetrics], r: int) -> float:
    """Highest passing load of a cluster-size sweep, refined by bisection below its first failure
    (the top of the sweep, a lower bound, if none failed)."""
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
