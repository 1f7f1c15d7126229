"""The publish advisor weighs staleness against re-warm cost and says why."""

from __future__ import annotations

import numpy as np

from cacheroute.planner import PlannerParams, advise, build_plan

from .conftest import RatesFactory, fixed_plan


def test_no_live_plan_publishes() -> None:
    cand = build_plan(["a"], [1.0], ["d0"], PlannerParams(5.0, 1))
    advice = advise(None, cand, ["a"], np.array([1.0]))
    assert advice.publish
    assert advice.reasons == ("no live plan",)


def test_same_plan_is_not_worth_publishing(rates_factory: RatesFactory) -> None:
    keys, rates = rates_factory(400)
    params = PlannerParams(q_cap=20.0, warm_slots=40)
    live = build_plan(keys, rates, ["d0", "d1", "d2"], params)
    cand = build_plan(keys, rates, ["d0", "d1", "d2"], params, prev=live)
    advice = advise(live, cand, keys, rates)
    assert not advice.publish
    assert advice.staleness_cost == 0.0
    assert advice.rewarm_cost == 0.0
    assert "keep the live plan" in advice.reasons[0]
    assert advice.to_dict()["publish"] is False


def test_big_newcomers_outweigh_a_small_move() -> None:
    params = PlannerParams(q_cap=100.0, warm_slots=2, control_interval_s=60.0)
    keys = ["a", "b", "c", "new"]
    live = build_plan(keys[:3], [5.0, 4.0, 1.0], ["d0"], params)
    rates = np.array([5.0, 4.0, 1.0, 50.0])  # a hot key appeared
    cand = build_plan(keys, rates, ["d0"], params)
    tokens = np.array([1000.0, 1000.0, 1000.0, 1000.0])
    advice = advise(live, cand, keys, rates, prefix_tokens=tokens, rewarm_s=10.0)
    assert advice.publish
    assert advice.off_plan_rate == 50.0
    assert advice.lost_value == 4000.0  # b drops out of the 2-slot budget
    assert advice.staleness_cost == (50_000.0 - 4000.0) * 60.0
    assert advice.unit == "prefix tokens"
    assert any("staleness" in r for r in advice.reasons)


def test_moving_hot_keys_for_little_gain_is_not_worth_it() -> None:
    params = PlannerParams(q_cap=100.0, warm_slots=1, imbalance_tolerance=10.0)
    keys = ["hot", "warm", "x"]
    live = build_plan(keys, [10.0, 9.0, 0.0], ["d0", "d1"], params)
    cand = build_plan(keys, [10.0, 9.0, 0.0], ["d1", "d0"], params)  # same keys, swapped homes
    advice = advise(live, cand, keys, np.array([10.0, 9.0, 0.0]))
    assert not advice.publish
    assert advice.moved_keys == 2
    assert advice.rewarm_cost == 19.0 * advice.rewarm_s


def test_imbalance_and_destination_changes_force_publication(rates_factory: RatesFactory) -> None:
    keys, rates = rates_factory(300, seed=4)
    params = PlannerParams(q_cap=50.0, warm_slots=60)
    live = build_plan(keys, rates, ["d0", "d1", "d2"], params)
    skewed = rates.copy()
    on_d0 = [keys.index(k) for k, t in live.assignments().items() if 0 in t]
    skewed[on_d0] *= 3.0  # everything live put on d0 got hotter
    cand = build_plan(keys, skewed, ["d0", "d1", "d2"], params, prev=live)
    advice = advise(live, cand, keys, skewed)
    assert advice.live_max_over_mean > 1.05
    assert advice.publish
    assert any("imbalanced" in r for r in advice.reasons)
    moved = build_plan(keys, rates, ["d0", "d1"], params, prev=live)
    assert "destinations changed" in advise(live, moved, keys, rates).reasons


def test_rewarm_cost_counts_only_the_replicas_a_key_did_not_have() -> None:
    # hot (rate 2 = two replicas at q_cap 1) trades d1 for d2: half its traffic goes cold;
    # warm shrinks from three replicas to two of them: none of its traffic goes cold
    live = fixed_plan({"hot": ("d0", "d1"), "warm": ("d1", "d2", "d3")}, {"hot": 2.0, "warm": 3.0})
    cand = fixed_plan({"hot": ("d0", "d2"), "warm": ("d1", "d2")}, {"hot": 2.0, "warm": 2.0})
    advice = advise(live, cand, ["hot", "warm"], np.array([2.0, 2.0]), rewarm_s=10.0)
    assert advice.moved_keys == 2
    assert advice.moved_rate == 1.0
    assert advice.moved_value == 1.0  # no prefix tokens: a request's value is 1
    assert advice.rewarm_cost == 10.0
