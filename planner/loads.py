"""Destination loads: the cold tail a plan starts from, and a plan's loads under other rates."""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import repeat

import numpy as np

from cacheroute.planner.errors import PlannerError
from cacheroute.planner.inputs import PlanInputs
from cacheroute.planner.kernels import Kernels
from cacheroute.planner.plan import BoolArray, FloatArray, Plan

__all__ = ["cold_tail", "exact_sums", "expected_loads"]


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
