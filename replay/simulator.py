"""One replay through the simulated cluster under one policy: route, serve, measure.

The loop is the gateways' view in time order: at each arrival the gateway the request was dealt to
routes it (it has already been told of every completion of its own requests before that instant),
the engine serves (numba, engine.py), and every control interval the planner may re-plan
(fleet.py: G gateways, each with its own policy state). Deterministic for a given seed; no clock
is read.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cacheroute.replay.engine import Engine
from cacheroute.replay.errors import ReplayError
from cacheroute.replay.fleet import Fleet, FleetConfig
from cacheroute.replay.metrics import RunMetrics, run_metrics
from cacheroute.replay.policy import PlanConfig, PolicyContext
from cacheroute.replay.requestset import FloatArray, IntArray, RequestSet
from cacheroute.replay.service import ServiceModel

__all__ = ["RunResult", "SimConfig", "simulate"]

_PROGRESS_EVERY = 4096


@dataclass(frozen=True, slots=True)
class SimConfig:
    """Cluster shape and measurement settings of a run."""

    destinations: int = 30
    service: ServiceModel = field(default_factory=ServiceModel)
    warmup_fraction: float = 0.2
    seed: int = 0

    def __post_init__(self) -> None:
        if self.destinations < 1:
            raise ReplayError("need at least one destination")
        if not 0.0 <= self.warmup_fraction < 1.0:
            raise ReplayError("warmup_fraction must be in [0, 1)")


@dataclass(frozen=True, slots=True)
class RunResult:
    """Metrics of a run, per-request outcomes and the policy's own counters."""

    metrics: RunMetrics
    dest: IntArray
    cached: IntArray
    ttft: FloatArray
    e2e: FloatArray
    policy_info: dict[str, Any]


def simulate(
    requests: RequestSet,
    policy: str,
    config: SimConfig,
    plan: PlanConfig,
    *,
    context: PolicyContext | None = None,
    fleet: FleetConfig | None = None,
    on_progress: Callable[[int], None] | None = None,
) -> RunResult:
    """Replay `requests` through R simulated replicas routed by `policy` in each gateway.

    `fleet` sets the gateways (default: one, plans in effect at once). `context` may be passed
    to reuse per-workload precomputation (key hashes) across runs; it must describe the same
    requests. `on_progress(n)` is called with batches of routed requests.
    """
    ctx = context or PolicyContext(
        requests=requests,
        destinations=config.destinations,
        seed=config.seed,
        service=config.service,
        plan=plan,
    )
    if ctx.requests is not requests or ctx.destinations != config.destinations:
        raise ReplayError("the policy context describes another replay or cluster")
    pol = Fleet(policy, ctx, fleet or FleetConfig())
    engine = Engine.create(requests, config.service, config.destinations)
    pol.report_usage(engine.out_i[:, 1])  # what each answer's usage says: its cached tokens
    times: list[float] = requests.times.tolist()
    n = len(times)
    interval = plan.control_interval_s
    next_tick = times[0] + interval
    route, release, first_token, step = pol.route, pol.release, pol.first_token, engine.step
    comp, first = engine.comp, engine.first
    firsts = pol.wants_first_tokens
    for i in range(n):
        t = times[i]
        while t >= next_tick:
            pol.tick(next_tick, i)
            next_tick += interval
        d = route(i, t)
        done = step(i, d, times[i + 1] if i + 1 < n else math.inf)
        if firsts and first[0]:  # before completions: a request's first token precedes its end
            for c in engine.first_tokens():
                first_token(c)
        if done:
            for c in comp[:done].tolist():
                release(c)
        if on_progress is not None and (i + 1) % _PROGRESS_EVERY == 0:
            on_progress(_PROGRESS_EVERY)
    if on_progress is not None:
        on_progress(n % _PROGRESS_EVERY)
    out_f, out_i = engine.out_f, engine.out_i
    metrics = run_metrics(
        policy=policy,
        requests=requests,
        destinations=config.destinations,
        dest=out_i[:, 0],
        cached=out_i[:, 1],
        t_start=out_f[:, 0],
        t_first=out_f[:, 1],
        t_done=out_f[:, 2],
        warmup_fraction=config.warmup_fraction,
    )
    return RunResult(
        metrics=metrics,
        dest=out_i[:, 0].copy(),
        cached=out_i[:, 1].copy(),
        ttft=out_f[:, 1] - requests.times,
        e2e=out_f[:, 2] - requests.times,
        policy_info=pol.describe(),
    )
