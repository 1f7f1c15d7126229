"""Destination loads: the cold tail a plan starts from, and a plan's loads under other rates."""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import repeat

import numpy as np

from cacheroute.planner.errors import PlannerError
from cacheroute.planner.inputs import PlanInputs
from cacheroute.planner.kernels import Kernels
from cacheroute.planner.params import PlannerParams
from cacheroute.planner.plan import BoolArray, FloatArray, Plan

__all__ = ["cold_tail", "exact_sums", "expected_loads", "load_bound", "sizing_cap"]

# The bound is enforced with a hair of slack so that rounding in the final max/mean (which sums
# the loads in another order) can never report 1.05000000001 for a plan held at 1.05.
_BOUND_SLACK = 1e-9


def expected_loads(plan: Plan, keys: Sequence[str], rates: FloatArray) -> FloatArray:
    """Per-destination load if `plan` stays in force while keys arrive at `rates`.

    Admitted keys follow the plan (rate / k_b on each of their destinations; a key absent from
    `keys` counts as rate 0); every other key is cold and spread by capacity, as in a fresh plan.
    """
    n = len(keys)
    index = {key: i for i, key in enumerate(keys)}
    where = np.fromiter(map(index.get, plan.keys, repeat(-1, plan.n_admitted)), np.int64)
    new_rates: FloatArray = np.zeros(plan.n_admitted, dtype=np.float64)
    if n:
        found = where >= 0
        new_rates[found] = rates[where[found]]
    admitted = math.fsum(new_rates.tolist())
    cold = max(0.0, math.fsum(rates.tolist()) - admitted)
    k = plan.replicas()
    shares = np.repeat(new_rates / k, k) if k.size else np.zeros(0)
    caps = plan.capacities
    loads: FloatArray = np.bincount(plan.targets, weights=shares, minlength=len(caps)).astype(
        np.float64
    )
    loads += cold * caps / caps.sum()
    return loads


def exact_sums(rates: FloatArray, admitted: BoolArray, kernels: Kernels) -> tuple[float, float]:
    """(total rate, cold rate), each exactly rounded: identical in any summation order."""
    total, cold, overflow = kernels.fsum_split(rates, admitted)
    if overflow:
        raise PlannerError("the total rate overflows a double; rates are far too large")
    return float(total), float(cold)


def cold_tail(cold: float, inp: PlanInputs) -> FloatArray:
    """Starting loads: the non-admitted rate spread evenly (by capacity, when capacities differ)."""
    r = len(inp.destinations)
    if inp.capacities is None:
        return np.full(r, cold / r, dtype=np.float64)
    loads: FloatArray = cold * inp.capacities / inp.capacity_total
    return loads


def sizing_cap(rates: FloatArray, params: PlannerParams, r: int, kernels: Kernels) -> float:
    """The per-replica rate k_b is sized against (q_cap, or less with `fair_share`).

    Uses the exactly rounded total, the same number the plan stores as `total_rate`, so that
    `Plan.validate` on a gateway recomputes the same cap bit for bit.
    """
    if params.fair_share is None:
        return params.q_cap
    total, _ = exact_sums(rates, np.zeros(rates.shape[0], dtype=np.bool_), kernels)
    return params.sizing_cap(total, r)


def load_bound(params: PlannerParams, total: float, caps: FloatArray) -> FloatArray:
    """Per destination: `imbalance_tolerance` x the mean load (capacity-weighted), a hair lower."""
    mean = total / float(caps.sum())
    out: FloatArray = params.imbalance_tolerance * (1.0 - _BOUND_SLACK) * mean * caps
    return out
