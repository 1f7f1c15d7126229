"""Factories for planner tests: seeded rates and plans built from them (quix-style fixtures)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pytest

from cacheroute.planner import (
    Destination,
    Plan,
    PlannerParams,
    build_plan,
    plan_from_dict,
    plan_to_dict,
)
from cacheroute.planner.plan import FloatArray

RatesFactory = Callable[..., tuple[list[str], FloatArray]]
PlanFactory = Callable[..., Plan]


def fixed_plan(
    assignments: dict[str, tuple[str, ...]],
    rates: dict[str, float],
    names: tuple[str, ...] = ("d0", "d1", "d2", "d3"),
) -> Plan:
    """A valid plan with exactly these destination sets (by name, in this order) and rates
    (q_cap 1: a key's k_b is ceil(rate)), each key's rate split evenly over its set."""
    data = plan_to_dict(
        build_plan(["k"], [1.0], list(names), PlannerParams(q_cap=1.0, warm_slots=4))
    )
    order = sorted(assignments, key=lambda k: (-rates[k], k))  # placement order, as plans list
    data["assignments"] = {k: list(assignments[k]) for k in order}
    data["rates"] = {k: rates[k] for k in order}
    loads = dict.fromkeys(names, 0.0)
    for key, dests in assignments.items():
        for d in dests:
            loads[d] += rates[key] / len(dests)
    data["loads"] = loads
    data["total_rate"] = sum(rates.values())
    data["cold_rate"] = 0.0
    data["stats"]["keys"] = len(rates)
    return plan_from_dict(data)


def make_rates(n: int = 300, *, seed: int = 0, sigma: float = 1.2) -> tuple[list[str], FloatArray]:
    """n keys `k00000`.. with seeded log-normal rates (mean 1)."""
    rng = np.random.default_rng(seed)
    rates = rng.lognormal(-0.5 * sigma**2, sigma, n)
    return [f"k{i:05d}" for i in range(n)], rates


@pytest.fixture
def rates_factory() -> RatesFactory:
    return make_rates


@pytest.fixture
def plan_factory() -> PlanFactory:
    def make(
        n: int = 300,
        *,
        seed: int = 0,
        destinations: Sequence[str | Destination] = ("d0", "d1", "d2", "d3"),
        q_cap: float = 10.0,
        warm_slots: int = 50,
        **params: float,
    ) -> Plan:
        keys, rates = make_rates(n, seed=seed)
        p = PlannerParams(q_cap=q_cap, warm_slots=warm_slots, **params)  # type: ignore[arg-type]
        return build_plan(keys, rates, destinations, p)

    return make
