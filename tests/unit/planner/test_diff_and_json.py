"""plan_diff semantics and the dict <-> Plan round trip."""

from __future__ import annotations

import math
from typing import Any

import orjson
import pytest

from cacheroute.planner import (
    PLAN_FORMAT,
    PlannerError,
    PlannerParams,
    build_plan,
    plan_diff,
    plan_from_dict,
    plan_to_dict,
)

from .conftest import PlanFactory, fixed_plan

PARAMS = PlannerParams(q_cap=10.0, warm_slots=1)


def test_diff_counts_moves_additions_and_removals() -> None:
    a = build_plan(["x", "y", "z"], [3.0, 2.0, 1.0], ["d0", "d1"], PARAMS)
    # In b, y is gone, z outranks x and lands first on d0, w is new.
    b = build_plan(["x", "z", "w"], [3.0, 4.0, 0.5], ["d0", "d1"], PARAMS)
    assert a.assignments() == {"x": (0,), "y": (1,)}
    assert b.assignments() == {"z": (0,), "x": (1,)}
    diff = plan_diff(a, b)
    assert diff.moved_keys == ("x",)
    assert diff.added_keys == ("z",)
    assert diff.removed_keys == ("y",)
    assert diff.kept_keys == 0
    assert (diff.moved_rate, diff.added_rate, diff.removed_rate) == (3.0, 4.0, 2.0)
    assert diff.changed_keys_fraction == 1.0
    assert diff.changed_rate_fraction == 1.0


def test_diff_compares_destination_sets_by_name() -> None:
    a = build_plan(["x", "y"], [2.0, 1.0], ["d0", "d1"], PARAMS)
    b = build_plan(["x", "y"], [2.0, 1.0], ["d1", "d0"], PARAMS)  # same names, other indices
    assert plan_diff(a, b).kept_keys == 0  # x sits on d0 in a, on d1 (index 0) in b
    c = build_plan(["x", "y"], [2.0, 1.0], ["d0", "d1"], PARAMS, version=9)
    diff = plan_diff(a, c)
    assert diff.kept_keys == 2
    assert diff.moved_keys == ()
    assert diff.changed_keys_fraction == 0.0


def test_json_round_trip_is_exact(plan_factory: PlanFactory) -> None:
    plan = plan_factory(500, warm_slots=60)
    blob = orjson.dumps(plan_to_dict(plan))
    back = plan_from_dict(orjson.loads(blob))
    assert back == plan
    data = plan_to_dict(plan)
    assert data["format"] == PLAN_FORMAT
    assert list(data["assignments"]) == list(plan.keys)
    assert all(isinstance(v, list) for v in data["assignments"].values())
    assert set(data["loads"]) == {"d0", "d1", "d2", "d3"}
    assert math.isclose(sum(data["loads"].values()), plan.total_rate)


def test_json_round_trip_of_a_re_plan(plan_factory: PlanFactory) -> None:
    prev = plan_factory(200)
    new = build_plan(list(prev.keys), prev.rates, ["d0", "d1", "d2"], prev.params, prev=prev)
    assert plan_from_dict(orjson.loads(orjson.dumps(plan_to_dict(new)))) == new


def _mutations() -> list[tuple[str, Any]]:
    return [
        ("format", "something/else"),
        ("params", "no"),
        ("assignments", []),
        ("loads", {"d0": 1.0}),
        ("total_rate", "many"),
    ]


@pytest.mark.parametrize(("field", "value"), _mutations())
def test_malformed_plans_are_rejected(field: str, value: Any) -> None:
    data = plan_to_dict(build_plan(["x", "y"], [2.0, 1.0], ["d0", "d1"], PARAMS))
    data[field] = value
    with pytest.raises(PlannerError):
        plan_from_dict(data)


def test_plan_routing_to_an_unknown_destination_is_rejected() -> None:
    data = plan_to_dict(build_plan(["x", "y"], [2.0, 1.0], ["d0", "d1"], PARAMS))
    data["assignments"]["x"] = ["nowhere"]
    with pytest.raises(PlannerError, match="nowhere"):
        plan_from_dict(data)


def test_a_plan_file_that_breaks_an_invariant_is_rejected() -> None:
    data = plan_to_dict(build_plan(["x", "y"], [2.0, 1.0], ["d0", "d1"], PARAMS))
    data["assignments"]["x"] = ["d0", "d0"]
    with pytest.raises(PlannerError, match="invalid plan"):
        plan_from_dict(data)


def test_moved_rate_counts_only_traffic_to_replicas_that_were_not_warm() -> None:
    # hand-derived: each key's traffic splits evenly over its set; only new members are cold
    a = fixed_plan(
        {"grow": ("d0",), "swap": ("d0", "d1", "d2"), "shrink": ("d0", "d1", "d2"), "hop": ("d1",)},
        {"grow": 1.0, "swap": 3.0, "shrink": 3.0, "hop": 1.0},
    )
    b = fixed_plan(
        {"grow": ("d0", "d1"), "swap": ("d3", "d1", "d0"), "shrink": ("d1", "d2"), "hop": ("d2",)},
        {"grow": 2.0, "swap": 3.0, "shrink": 2.0, "hop": 1.0},
    )
    diff = plan_diff(a, b)
    assert set(diff.moved_keys) == {"grow", "swap", "shrink", "hop"}
    shares = dict(zip(diff.moved_keys, diff.moved_shares, strict=True))
    # grow: d1 new of {d0, d1}; swap: d3 new of three; shrink: nothing new; hop: all of it
    assert shares == pytest.approx({"grow": 0.5, "swap": 1 / 3, "shrink": 0.0, "hop": 1.0})
    assert diff.moved_rate == pytest.approx(2.0 * 0.5 + 3.0 / 3 + 0.0 + 1.0)
    assert diff.changed_rate_fraction == pytest.approx(3.0 / 8.0)


def test_moved_shares_follow_destinations_by_name() -> None:
    # b lists its names in another order and has no d3: x's {d3} -> {d0} is all new
    a = fixed_plan({"x": ("d3",), "y": ("d0", "d1")}, {"x": 1.0, "y": 2.0})
    b = fixed_plan(
        {"x": ("d0",), "y": ("d0", "d2")}, {"x": 1.0, "y": 2.0}, names=("d1", "d0", "d2")
    )
    diff = plan_diff(a, b)
    assert set(diff.moved_keys) == {"x", "y"}
    shares = dict(zip(diff.moved_keys, diff.moved_shares, strict=True))
    assert shares == pytest.approx({"x": 1.0, "y": 0.5})
    assert diff.moved_rate == pytest.approx(1.0 + 1.0)
