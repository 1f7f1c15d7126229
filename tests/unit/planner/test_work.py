"""Planning on work: rates weighted by request cost, hand-derived answers."""

from __future__ import annotations

import numpy as np
import pytest

from cacheroute.dispatcher.routing import DEFAULT_UNIT_TOKENS
from cacheroute.planner import PlannerError, PlannerParams, build_plan
from cacheroute.planner.smoothing import RateSmoother, SmoothingParams
from cacheroute.planner.work import (
    DEFAULT_WORK_UNIT_TOKENS,
    planning_rates,
    request_cost,
    uncached_tokens,
    work_rates,
)
from cacheroute.schemas import KeyRate


def test_two_keys_equal_in_requests_three_to_one_in_work() -> None:
    # costs 1 + 0/512 = 1 and 1 + 1024/512 = 3; mean cost over 2 req/s = 2; total stays 2
    out = work_rates(np.array([1.0, 1.0]), np.array([0.0, 1024.0]), 512)
    assert out.tolist() == [0.5, 1.5]


def test_equal_costs_plan_exactly_as_request_counts() -> None:
    rates = np.array([3.0, 1.0, 0.25])
    assert work_rates(rates, np.full(3, 700.0), 512).tolist() == pytest.approx(rates.tolist())


def test_zero_rates_come_back_unchanged_and_bad_input_is_an_error() -> None:
    assert work_rates(np.zeros(2), np.array([5.0, 9.0]), 512).tolist() == [0.0, 0.0]
    with pytest.raises(PlannerError, match="rates but"):
        work_rates(np.ones(2), np.ones(3), 512)
    with pytest.raises(PlannerError, match="finite"):
        work_rates(np.ones(2), np.array([1.0, -1.0]), 512)
    with pytest.raises(PlannerError, match="unit_tokens"):
        request_cost(np.ones(1), 0)


def test_uncached_is_prompt_less_prefix_never_negative() -> None:
    assert uncached_tokens(np.array([100.0, 50.0]), np.array([30.0, 80.0])).tolist() == [70, 0]


def test_the_expensive_key_gets_the_replicas() -> None:
    # 10 req/s each; costs 1 and 3 -> work rates 5 and 15; q_cap 5 -> k_b = 1 and 3
    keys = ["light", "heavy"]
    rates = work_rates(np.array([10.0, 10.0]), np.array([0.0, 1024.0]), 512)
    plan = build_plan(keys, rates, [f"d{i}" for i in range(4)], PlannerParams(5.0, 8))
    assert dict(zip(plan.keys, plan.replicas().tolist(), strict=True)) == {"light": 1, "heavy": 3}


def test_planner_and_gateways_use_one_unit() -> None:
    assert DEFAULT_WORK_UNIT_TOKENS == DEFAULT_UNIT_TOKENS


def test_planning_rates_from_the_smoothed_token_sums() -> None:
    sm = RateSmoother(SmoothingParams(alpha=1.0), partitions=1)
    # a: 10 requests, prompts 5,120 tokens in all, 0 reusable -> 512 uncached each, cost 2
    # b: 10 requests, 5,120 prompt tokens of which 5,120 reusable -> cost 1
    # c: an older gateway's record without token sums -> cost 1
    sm.add(KeyRate("a", 0, 60_000, 10, 1.0, prompt_tokens_sum=5_120), 0, 0)
    sm.add(KeyRate("b", 0, 60_000, 10, 1.0, prompt_tokens_sum=5_120, prefix_tokens_sum=5_120), 0, 0)
    sm.add(KeyRate("c", 0, 60_000, 10, 1.0), 0, 0)
    sm.advance(10_000)
    snap = sm.snapshot()
    assert snap.prompt_tokens.tolist() == [512.0, 512.0, 0.0]
    # work 2 + 1 + 1 = 4 over 3 req/s: a = 2 * 3/4, b = c = 3/4
    assert planning_rates(snap, 512).tolist() == [1.5, 0.75, 0.75]
    assert planning_rates(snap, None).tolist() == [1.0, 1.0, 1.0]


def test_planning_rates_use_the_engines_cached_tokens_when_they_report_them() -> None:
    sm = RateSmoother(SmoothingParams(alpha=1.0), partitions=1)
    # a: declares 5,120 reusable of 5,120 but the engines served only 2,560 from cache: 256
    #    uncached each, cost 1.5; b: nothing reported cached -> all 512 uncached, cost 2
    # (its declared prefix no longer counts once engines report); c: no token sums, cost 1.
    sm.add(
        KeyRate(
            "a",
            0,
            60_000,
            10,
            1.0,
            prompt_tokens_sum=5_120,
            prefix_tokens_sum=5_120,
            cached_tokens_sum=2_560,
        ),
        0,
        0,
    )
    sm.add(KeyRate("b", 0, 60_000, 10, 1.0, prompt_tokens_sum=5_120, prefix_tokens_sum=5_120), 0, 0)
    sm.add(KeyRate("c", 0, 60_000, 10, 1.0), 0, 0)
    sm.advance(10_000)
    snap = sm.snapshot()
    assert snap.cached_tokens is not None
    assert snap.cached_tokens.tolist() == [256.0, 0.0, 0.0]
    # work 1.5 + 2 + 1 = 4.5 over 3 req/s: a = 1.5 * 3 / 4.5 = 1, b = 2 * 3 / 4.5, c = 3 / 4.5
    assert planning_rates(snap, 512).tolist() == pytest.approx([1.0, 4 / 3, 2 / 3])


def test_negative_cached_tokens_are_malformed() -> None:
    sm = RateSmoother(SmoothingParams(alpha=1.0), partitions=1)
    bad = KeyRate("a", 0, 60_000, 10, 1.0, prompt_tokens_sum=100, cached_tokens_sum=-1)
    assert sm.add(bad, 0, 0) == "invalid"
    assert sm.rejections["malformed"] == 1
