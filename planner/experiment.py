"""The paper's drift experiment: re-plan every interval from scratch vs from the previous plan.

Each interval multiplies every key's rate by an independent log-normal factor (sigma = 0.3 in the
paper) and builds the next plan two ways: `scratch` (Algorithm 1 from nothing, what the paper does)
and `hysteresis` (churn-aware re-planning from the previous plan). Per interval it records the
share of admitted keys / admitted rate whose destination set changed (a newly admitted key counts:
its new home is cold), the new plan's max/mean expected load and what it admits.

Pure: randomness is the Generator passed in, and `build` is injectable so the shell can time it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from cacheroute.planner.build import build_plan
from cacheroute.planner.diff import plan_diff
from cacheroute.planner.loads import expected_loads
from cacheroute.planner.params import PlannerParams
from cacheroute.planner.plan import Destination, FloatArray, Plan, max_over_mean
from cacheroute.planner.workload import drift

__all__ = ["ChurnSeries", "PlanBuilder", "run_drift_experiment"]


class PlanBuilder(Protocol):
    """`build_plan`'s signature, as far as the experiment uses it."""

    def __call__(
        self,
        keys: Sequence[str],
        rates: FloatArray,
        destinations: Sequence[str | Destination],
        params: PlannerParams,
        *,
        prev: Plan | None = None,
    ) -> Plan: ...


@dataclass(slots=True)
class ChurnSeries:
    """Per-interval churn numbers of one re-planning strategy."""

    moved_keys: list[float] = field(default_factory=list)
    moved_rate: list[float] = field(default_factory=list)
    max_over_mean: list[float] = field(default_factory=list)
    stale_max_over_mean: list[float] = field(default_factory=list)
    admitted_keys: list[float] = field(default_factory=list)
    admitted_rate: list[float] = field(default_factory=list)

    def record(self, prev: Plan, new: Plan, keys: Sequence[str], rates: FloatArray) -> None:
        """Add one interval: `prev` was live, `new` was built from `rates`."""
        diff = plan_diff(prev, new)
        self.moved_keys.append(diff.changed_keys_fraction)
        self.moved_rate.append(diff.changed_rate_fraction)
        self.max_over_mean.append(new.max_over_mean())
        stale = expected_loads(prev, keys, rates)
        self.stale_max_over_mean.append(max_over_mean(stale, prev.capacities))
        self.admitted_keys.append(new.n_admitted / len(keys))
        self.admitted_rate.append(new.admitted_rate / new.total_rate if new.total_rate else 0.0)

    def summary(self) -> dict[str, Any]:
        """Means over intervals (worst interval for max/mean), plus the per-interval series."""
        return {
            "moved_keys_fraction": _mean(self.moved_keys),
            "moved_rate_fraction": _mean(self.moved_rate),
            "max_over_mean": max(self.max_over_mean, default=1.0),
            "admitted_fraction": _mean(self.admitted_keys),
            "admitted_rate_fraction": _mean(self.admitted_rate),
            "stale_max_over_mean": max(self.stale_max_over_mean, default=1.0),
            "per_interval": {
                "moved_keys_fraction": self.moved_keys,
                "moved_rate_fraction": self.moved_rate,
                "max_over_mean": self.max_over_mean,
            },
        }


def run_drift_experiment(
    keys: Sequence[str],
    rates: FloatArray,
    destinations: Sequence[str | Destination],
    params: PlannerParams,
    *,
    intervals: int,
    sigma: float,
    rng: np.random.Generator,
    build: PlanBuilder = build_plan,
    on_interval: Callable[[int], None] | None = None,
) -> dict[str, ChurnSeries]:
    """Run the experiment; returns {"scratch": ..., "hysteresis": ...}."""
    first = build(keys, rates, destinations, params)
    live = {"scratch": first, "hysteresis": first}
    series = {"scratch": ChurnSeries(), "hysteresis": ChurnSeries()}
    for t in range(1, intervals + 1):
        rates = drift(rates, sigma, rng)
        for name in ("scratch", "hysteresis"):
            prev = live[name] if name == "hysteresis" else None
            new = build(keys, rates, destinations, params, prev=prev)
            series[name].record(live[name], new, keys, rates)
            live[name] = new
        if on_interval is not None:
            on_interval(t)
    return series


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0
