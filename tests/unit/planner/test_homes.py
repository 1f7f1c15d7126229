"""Homes: newly admitted keys start where their traffic goes, within the load bound (hand-derived)."""

from __future__ import annotations

import numpy as np
import pytest

from cacheroute.planner import PlannerParams, build_plan
from cacheroute.planner.errors import PlannerError
from cacheroute.planner.homes import keep_homes

# every key admitted (W large), one replica each (q_cap large), plain LPT (no siblings)
PARAMS = PlannerParams(q_cap=100.0, warm_slots=10, imbalance_tolerance=1.05)
KEYS = ["a", "b", "c", "d"]
RATES = [4.0, 3.0, 2.0, 1.0]


def _where(plan: object) -> dict[str, tuple[int, ...]]:
    return dict(plan.assignments())  # type: ignore[attr-defined]


def test_keep_homes_places_first_replicas_in_order_while_they_fit() -> None:
    # shares 3, 2, 1; bound 4 on both: key 0 fits at 0 (3), key 1 would make 5 > 4, key 2 fits at 1
    offsets = np.array([0, 1, 2, 3])
    kept = np.zeros(3, dtype=np.int64)
    targets = np.full(3, -1, dtype=np.int64)
    loads = np.zeros(2)
    placed = keep_homes(
        np.array([0, 0, 1]),
        shares=np.array([3.0, 2.0, 1.0]),
        offsets=offsets,
        kept=kept,
        targets=targets,
        loads=loads,
        bound=np.array([4.0, 4.0]),
    )
    assert placed == 2
    assert kept.tolist() == [1, 0, 1]
    assert targets.tolist() == [0, -1, 1]
    assert loads.tolist() == [3.0, 1.0]


def test_a_fresh_plan_puts_keys_at_home_and_lpt_places_the_rest() -> None:
    # without homes, LPT: a(4)->0, b(3)->1, c(2)->1, d(1)->0 (loads 5, 5)
    assert _where(build_plan(KEYS, RATES, ["x", "y"], PARAMS)) == {
        "a": (0,),
        "b": (1,),
        "c": (1,),
        "d": (0,),
    }
    # a and d live on y now; the bound is 1.05 x mean 5 = 5.25: a (4) then d (1) fit there (5);
    # LPT then puts b and c on x (3, then 5)
    plan = build_plan(KEYS, RATES, ["x", "y"], PARAMS, homes=[1, -1, -1, 1])
    assert _where(plan) == {"a": (1,), "b": (0,), "c": (0,), "d": (1,)}
    assert plan.loads.tolist() == [5.0, 5.0]


def test_a_home_that_would_break_the_bound_is_not_used() -> None:
    # every key lives on y: a (4) fits, b would make 7 > 5.25 and goes by LPT to x, c would make
    # 6 > 5.25 (LPT: x, 5), d fits on y (5)
    plan = build_plan(KEYS, RATES, ["x", "y"], PARAMS, homes=[1, 1, 1, 1])
    assert _where(plan) == {"a": (1,), "b": (0,), "c": (0,), "d": (1,)}


def test_a_replan_keeps_admitted_keys_and_homes_only_new_ones() -> None:
    loose = PlannerParams(q_cap=100.0, warm_slots=10, imbalance_tolerance=1.5)
    first = build_plan(["a", "b"], [4.0, 3.0], ["x", "y"], loose)
    assert _where(first) == {"a": (0,), "b": (1,)}
    # new c (2): LPT would take y (3 < 4); its home is x, and 4 + 2 = 6 is within 1.5 x 4.5
    without = build_plan(["a", "b", "c"], [4.0, 3.0, 2.0], ["x", "y"], loose, prev=first)
    assert _where(without) == {"a": (0,), "b": (1,), "c": (1,)}
    # a and b keep their destinations whatever their homes say (their caches are there)
    homed = build_plan(
        ["a", "b", "c"], [4.0, 3.0, 2.0], ["x", "y"], loose, prev=first, homes=[1, 0, 0]
    )
    assert _where(homed) == {"a": (0,), "b": (1,), "c": (0,)}
    assert homed.loads.tolist() == [6.0, 3.0]


def test_bad_homes_are_refused_with_a_clear_error() -> None:
    with pytest.raises(PlannerError, match="one entry per key"):
        build_plan(KEYS, RATES, ["x", "y"], PARAMS, homes=[0, 1])
    with pytest.raises(PlannerError, match="destination index"):
        build_plan(KEYS, RATES, ["x", "y"], PARAMS, homes=[0, 1, 2, -1])
    with pytest.raises(PlannerError, match="destination index"):
        build_plan(KEYS, RATES, ["x", "y"], PARAMS, homes=[0, 1, -2, -1])
