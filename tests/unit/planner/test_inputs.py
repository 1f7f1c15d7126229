"""Bad input is rejected with a PlannerError naming the key; degenerate but legal input works."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from cacheroute.planner import (
    Destination,
    Plan,
    PlannerError,
    PlannerParams,
    build_plan,
    reference_build_plan,
)

PARAMS = PlannerParams(q_cap=2.0, warm_slots=2)
Builder = Callable[..., Plan]
BUILDERS = [pytest.param(build_plan, id="fast"), pytest.param(reference_build_plan, id="reference")]


@pytest.mark.parametrize("build", BUILDERS)
def test_no_keys_is_an_error(build: Builder) -> None:
    with pytest.raises(PlannerError, match="no keys"):
        build([], [], ["d0"], PARAMS)


@pytest.mark.parametrize("build", BUILDERS)
@pytest.mark.parametrize("bad", [math.nan, -1.0, math.inf, -math.inf])
def test_bad_rate_names_the_key(build: Builder, bad: float) -> None:
    with pytest.raises(PlannerError, match="'k2'") as info:
        build(["k1", "k2", "k3"], [1.0, bad, 2.0], ["d0"], PARAMS)
    assert info.value.key == "k2"
    assert not info.value.retriable


@pytest.mark.parametrize("build", BUILDERS)
def test_duplicate_key_names_the_key(build: Builder) -> None:
    with pytest.raises(PlannerError, match=r"duplicate key 'b' at positions 1 and 3"):
        build(["a", "b", "c", "b"], [1.0, 2.0, 3.0, 4.0], ["d0"], PARAMS)


@pytest.mark.parametrize("build", BUILDERS)
@pytest.mark.parametrize("key", ["", 7, None])
def test_keys_must_be_non_empty_strings(build: Builder, key: Any) -> None:
    with pytest.raises(PlannerError, match="position 1"):
        build(["a", key], [1.0, 2.0], ["d0"], PARAMS)


@pytest.mark.parametrize("build", BUILDERS)
def test_bad_prefix_tokens_name_the_key(build: Builder) -> None:
    with pytest.raises(PlannerError, match="'b' has prefix_tokens nan"):
        build(["a", "b"], [1.0, 2.0], ["d0"], PARAMS, prefix_tokens=[1.0, math.nan])


@pytest.mark.parametrize("build", BUILDERS)
def test_byte_admission_needs_prefix_tokens(build: Builder) -> None:
    with pytest.raises(PlannerError, match="prefix_tokens"):
        build(["a"], [1.0], ["d0"], PlannerParams(2.0, 2, admission="bytes"))


@pytest.mark.parametrize("build", BUILDERS)
def test_mismatched_lengths(build: Builder) -> None:
    with pytest.raises(PlannerError):
        build(["a", "b"], [1.0], ["d0"], PARAMS)


@pytest.mark.parametrize(
    "dests",
    [[], ["d0", "d0"], [""], [Destination("d0", 0.0)], [Destination("d0", math.nan)]],
    ids=["none", "duplicate", "empty-name", "zero-capacity", "nan-capacity"],
)
def test_bad_destinations(dests: Sequence[str | Destination]) -> None:
    with pytest.raises(PlannerError):
        build_plan(["a"], [1.0], dests, PARAMS)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"q_cap": 0.0, "warm_slots": 1},
        {"q_cap": math.nan, "warm_slots": 1},
        {"q_cap": 1.0, "warm_slots": -1},
        {"q_cap": 1.0, "warm_slots": 1, "hysteresis": 1.0},
        {"q_cap": 1.0, "warm_slots": 1, "imbalance_tolerance": 0.9},
        {"q_cap": 1.0, "warm_slots": 1, "admission": "bits"},
    ],
)
def test_bad_params(kwargs: dict[str, Any]) -> None:
    with pytest.raises(PlannerError):
        PlannerParams(**kwargs)


@pytest.mark.parametrize("build", BUILDERS)
def test_one_destination_is_a_legal_degenerate_cluster(build: Builder) -> None:
    # Decision: R = 1 is accepted. Algorithm 1 still works (every k_b caps at 1, everything
    # admitted lands on the one destination, the cold tail too); rejecting it would only break
    # single-replica dev and canary setups.
    plan = build(["a", "b", "c"], [5.0, 3.0, 1.0], ["only"], PARAMS)
    plan.validate()
    assert plan.assignments() == {"a": (0,), "b": (0,)}
    assert plan.loads.tolist() == [9.0]
    assert plan.stats.capped_keys == 2  # a needs ceil(5/2) = 3 replicas, b 2; both get 1


def test_nothing_is_dropped_silently() -> None:
    keys = [f"k{i}" for i in range(100)]
    rates = [float(i % 13) for i in range(100)]
    plan = build_plan(keys, rates, ["d0", "d1"], PlannerParams(3.0, 10))
    assert plan.stats.keys == 100
    assert math.isclose(plan.admitted_rate + plan.cold_rate, math.fsum(rates))
    assert math.isclose(float(plan.loads.sum()), math.fsum(rates))


def test_huge_rates_that_overflow_the_total_are_an_error() -> None:
    with pytest.raises(PlannerError, match="overflow"):
        build_plan(["a", "b"], [1.7e308, 1.7e308], ["d0"], PARAMS)


def test_validate_catches_a_tampered_plan() -> None:
    plan = build_plan(["a", "b"], [2.0, 1.0], ["d0", "d1"], PlannerParams(5.0, 1))
    broken = Plan(
        version=plan.version,
        created_ms=plan.created_ms,
        params=plan.params,
        destinations=plan.destinations,
        keys=plan.keys,
        rates=plan.rates,
        offsets=plan.offsets,
        targets=plan.targets,
        loads=plan.loads + 1.0,
        total_rate=plan.total_rate,
        cold_rate=plan.cold_rate,
        stats=plan.stats,
    )
    with pytest.raises(PlannerError, match="loads"):
        broken.validate()
