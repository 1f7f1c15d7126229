"""Golden tests: a few literal rates in, the literal plan out (and the reference agrees)."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from cacheroute.planner import (
    Destination,
    PlannerParams,
    build_plan,
    plan_to_dict,
    reference_build_plan,
)


def test_paper_walk_with_skips_and_split_keys() -> None:
    # k: a=ceil(9/4)=3, b=2, c=2, d=1, e=1, f=1; C = 3 * 2 = 6.
    # Walk: a (used 3), b (5), c skipped (7 > 6), d (6), e and f skipped: budget full.
    # Cold tail: (5 + 2 + 1) / 3 on each destination. LPT: a on all three; b on the two
    # least loaded (equal: d0, d1); d on d2.
    keys = ["a", "b", "c", "d", "e", "f"]
    rates = [9.0, 7.0, 5.0, 3.0, 2.0, 1.0]
    params = PlannerParams(q_cap=4.0, warm_slots=2)
    plan = build_plan(keys, rates, ["d0", "d1", "d2"], params, created_ms=1234)
    plan.validate()
    assert plan.assignments() == {"a": (0, 1, 2), "b": (0, 1), "d": (2,)}
    tail = 8.0 / 3
    assert plan.loads.tolist() == [tail + 3.0 + 3.5, tail + 3.0 + 3.5, tail + 3.0 + 3.0]
    assert plan.cold_rate == 8.0
    assert plan.total_rate == 27.0
    assert plan.slots_used == 6
    assert plan.version == 1
    assert plan.created_ms == 1234
    assert plan.stats.keys == 6
    assert plan.stats.cutoff == 3.0
    assert reference_build_plan(keys, rates, ["d0", "d1", "d2"], params, created_ms=1234) == plan


def test_json_form_of_the_golden_plan() -> None:
    plan = build_plan(["x", "y", "z"], [3.0, 2.0, 1.0], ["left", "right"], PlannerParams(4.0, 1))
    data = plan_to_dict(plan)
    assert data["assignments"] == {"x": ["left"], "y": ["right"]}
    assert data["loads"] == {"left": 3.5, "right": 2.5}
    assert data["rates"] == {"x": 3.0, "y": 2.0}


def test_equal_rates_go_by_key_then_equal_loads_by_destination_index() -> None:
    plan = build_plan(["b", "c", "a"], [1.0, 1.0, 1.0], ["d0", "d1"], PlannerParams(10.0, 1))
    assert plan.keys == ("a", "b")  # c is cold: a and b come first in key order
    assert plan.assignments() == {"a": (0,), "b": (1,)}
    assert plan.loads.tolist() == [1.5, 1.5]


def test_replicas_are_capped_at_the_destination_count_and_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="cacheroute.planner"):
        plan = build_plan(["whale", "minnow"], [100.0, 0.5], ["d0", "d1"], PlannerParams(1.0, 4))
    assert plan.assignments() == {"whale": (0, 1), "minnow": (0,)}
    assert plan.loads.tolist() == [50.5, 50.0]
    assert plan.stats.capped_keys == 1
    assert "capped" in caplog.text


def test_byte_aware_admission_prefers_big_prefixes_per_slot() -> None:
    keys, rates, tokens = ["short", "long"], [10.0, 5.0], [100.0, 1000.0]
    by_rate = build_plan(keys, rates, ["d0"], PlannerParams(100.0, 1), prefix_tokens=tokens)
    by_bytes = build_plan(
        keys, rates, ["d0"], PlannerParams(100.0, 1, admission="bytes"), prefix_tokens=tokens
    )
    assert by_rate.keys == ("short",)
    assert by_bytes.keys == ("long",)
    assert by_bytes.stats.cutoff == 5000.0  # rate x tokens / k_b
    assert by_bytes.loads.tolist() == [15.0]


def test_no_key_admissible_is_a_valid_all_cold_plan() -> None:
    plan = build_plan(["a", "b"], [4.0, 2.0], ["d0", "d1", "d2"], PlannerParams(1.0, 0))
    plan.validate()
    assert plan.n_admitted == 0
    assert plan.loads.tolist() == [2.0, 2.0, 2.0]
    assert plan.stats.cutoff == 0.0


def test_capacity_weighted_destinations() -> None:
    dests = [Destination("small", 1.0), Destination("big", 3.0)]
    plan = build_plan(["a", "b", "c"], [4.0, 4.0, 2.0], dests, PlannerParams(10.0, 2))
    # levels load/capacity: a -> small (tie, lower index); b -> big (4/3 < 4); c -> big (2 < 4)
    assert plan.assignments() == {"a": (0,), "b": (1,), "c": (1,)}
    assert plan.loads.tolist() == [4.0, 6.0]
    assert plan.max_over_mean() == pytest.approx(4.0 / (10.0 / 4.0))
    ref = reference_build_plan(["a", "b", "c"], [4.0, 4.0, 2.0], dests, PlannerParams(10.0, 2))
    assert ref == plan


def test_equal_capacities_are_algorithm_1_bit_for_bit() -> None:
    keys = [f"k{i}" for i in range(50)]
    rates = np.random.default_rng(3).lognormal(0, 1, 50)
    params = PlannerParams(0.8, 5)
    plain = build_plan(keys, rates, ["a", "b", "c"], params)
    weighted = build_plan(keys, rates, [Destination(n, 3.0) for n in "abc"], params)
    assert weighted.keys == plain.keys
    assert np.array_equal(weighted.targets, plain.targets)
    assert np.array_equal(weighted.loads, plain.loads)
