"""The workload-only diagnostic: window counting, horizons, verdicts."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from cacheroute.replay.diagnostic import (
    Diagnosis,
    _judge,
    _plan_moves,
    _tail,
    _window_counts,
    admitted_replicas,
    cold_displacement,
    diagnose,
    planned_imbalance,
)
from cacheroute.replay.service import ServiceModel

from .conftest import TinyFactory, WorkloadFactory


def test_window_counts_per_run() -> None:
    group = np.array([0, 0, 0, 1, 1], dtype=np.int64)
    times = np.array([0.0, 1.0, 5.0, 5.0, 5.5])
    assert _window_counts(group, times, 2.0).tolist() == [0, 1, 0, 0, 1]
    assert _window_counts(group, times, np.inf).tolist() == [0, 1, 2, 0, 1]


def test_a_key_that_recurs_on_one_replica_is_recoverable(tiny_factory: TinyFactory) -> None:
    blocks = [[1, 2, 3, 4]] * 20
    q = tiny_factory(blocks, keys=["a"] * 20, prompt=[65] * 20, output=[1] * 20)
    d = diagnose(q, 8, ServiceModel(cache_tokens=10_000))
    assert d.hit_affinity == pytest.approx(19 * 64 / (20 * 65))
    assert d.hit_spread < d.hit_affinity
    assert d.verdict == "win"
    assert d.predicted_gain > 1.1


def test_workload_verdicts(workload_factory: WorkloadFactory) -> None:
    whale = diagnose(workload_factory("whale", requests=4000), 8, ServiceModel())
    low = diagnose(workload_factory("low-reuse", requests=4000), 8, ServiceModel())
    assert whale.verdict == "win"
    assert low.verdict in ("tie", "lose")
    assert low.recoverable < whale.recoverable
    assert 0 < low.pinned_share < 0.5
    assert set(whale.to_dict()) >= {"verdict", "horizon_affinity_s", "predicted_gain"}


def test_nothing_recurs_is_a_tie_not_a_loss(tiny_factory: TinyFactory) -> None:
    q = tiny_factory([[i] for i in range(50)], keys=[f"u{i}" for i in range(50)])
    d = diagnose(q, 4, ServiceModel())
    assert d.hit_affinity == 0.0
    assert d.verdict == "tie"


def test_pinning_everything_for_no_reuse_is_a_loss(tiny_factory: TinyFactory) -> None:
    # every key recurs, but each request's prompt is new: all pinned, nothing to reuse
    q = tiny_factory([[i] for i in range(60)], keys=[f"k{i % 6}" for i in range(60)])
    d = diagnose(q, 4, ServiceModel())
    assert d.pinned_share == 1.0
    assert d.verdict == "lose"


# --- the deployed policy: admission, the cold path, plan moves, gateways -------------------------


def test_compound_poisson_tail_closed_forms() -> None:
    ones = np.array([0.0, 1.0])  # every item weighs 1: X is Poisson
    assert _tail(1.0, ones, 2) == pytest.approx(1.0 - 2.0 / math.e)
    assert _tail(0.5, ones, 1) == pytest.approx(1.0 - math.exp(-0.5))
    twos = np.array([0.0, 0.0, 1.0, 0.0])  # every item weighs 2: X >= 3 iff N >= 2
    assert _tail(0.5, twos, 3) == pytest.approx(1.0 - 1.5 * math.exp(-0.5))
    assert _tail(0.3, ones, 0) == 1.0


def test_admission_follows_the_planners_walk(tiny_factory: TinyFactory) -> None:
    # 12 requests over 11 s: a 6, b 3, c 2, d 1 -> rates 6/11, 3/11, 2/11, 1/11 req/s
    keys = ["a"] * 6 + ["b"] * 3 + ["c"] * 2 + ["d"]
    q = tiny_factory([[i] for i in range(12)], keys=keys)
    # k_b = 1 for all, C = 2 x 1: the two fastest keys
    assert admitted_replicas(q, 2, 100.0, 1, None).tolist() == [1, 1, 0, 0]
    # q_cap 4/11 < 6/11: a needs 2 replicas and takes the whole budget C = 2
    assert admitted_replicas(q, 2, 4.0 / 11.0 + 1e-9, 1, None).tolist() == [2, 0, 0, 0]
    # fair share at R = 3: cap = (12/11) / 3 = 4/11 -> a 2, b 1, then C = 3 is full
    assert admitted_replicas(q, 3, 100.0, 1, 1.0).tolist() == [2, 1, 0, 0]


def test_cold_displacement_poisson_at_the_bound(tiny_factory: TinyFactory) -> None:
    # 10 cold requests over 9 s, each in flight 0.9 s: 1.0 in flight, all on home 0 of R = 2
    q = tiny_factory([[i] for i in range(10)], keys=["x", "y"] * 5)
    home = np.array([0, 0], dtype=np.int64)
    cold = np.array([1, 1], dtype=np.int64)
    lat = np.full(10, 0.9)
    units = np.ones(10, dtype=np.int64)
    # G = 1: bound ceil(1.25 x (1 + 1) / 2) = 2, P(Poisson(1) >= 2) = 1 - 2/e
    one = cold_displacement(q, home, cold, lat, units, destinations=2, gateways=1, load_factor=1.25)
    assert one == pytest.approx([1.0 - 2.0 / math.e] * 2)
    # G = 2: 0.5 in flight per gateway, bound ceil(1.25 x 1.5 / 2) = 1: P(Poisson(0.5) >= 1)
    two = cold_displacement(q, home, cold, lat, units, destinations=2, gateways=2, load_factor=1.25)
    assert two == pytest.approx([1.0 - math.exp(-0.5)] * 2)
    # a planned key is never displaced
    planned = cold_displacement(
        q, home, np.array([0, 1]), lat, units, destinations=2, gateways=1, load_factor=1.25
    )
    assert planned[0] == 0.0


def test_plan_moves_the_first_request_after_the_keys_first_plan(tiny_factory: TinyFactory) -> None:
    # 9 s, 2 intervals (plans at 4.5 s and 9 s): a (first at 0) moves at its request at 5;
    # c (first at 2) at its request at 9; b (first at 6) is planned at 9, after its last
    keys = ["a", "a", "c", "c", "c", "a", "b", "a", "b", "c"]
    q = tiny_factory([[i] for i in range(10)], keys=keys)
    replicas = np.array([1, 1, 1], dtype=np.int64)  # keys sorted: a, b, c
    assert np.flatnonzero(_plan_moves(q, replicas, 2)).tolist() == [5, 9]
    cold_c = np.array([1, 1, 0], dtype=np.int64)
    assert np.flatnonzero(_plan_moves(q, cold_c, 2)).tolist() == [5]


def test_a_key_on_two_replicas_hits_as_a_coin_flip(tiny_factory: TinyFactory) -> None:
    # one key, 20 requests 1 s apart with the same 4 blocks, R = 8, k_b = 2 (rate 20/19 vs
    # q_cap 0.7). Plans every 0.019 s: request 0 before any plan, request 1 moved to the
    # planned replicas (a block there with 1/8), request i >= 2 finds its blocks with
    # 1 - (1/2)^i (the i earlier requests picked either replica); 64 cacheable tokens each.
    q = tiny_factory([[1, 2, 3, 4]] * 20, keys=["a"] * 20, prompt=[65] * 20, output=[1] * 20)
    d = diagnose(
        q, 8, ServiceModel(cache_tokens=10_000), q_cap=0.7, fair_share=None, intervals=1000
    )
    expected = 64 * (1 / 8 + 17.5 + 2.0**-19) / (20 * 65)
    assert d.hit_affinity == pytest.approx(expected)
    assert d.admitted_keys == 1
    assert d.admitted_share == 1.0


def test_cold_keys_without_cold_affinity_spread_like_flat_lb(tiny_factory: TinyFactory) -> None:
    q = tiny_factory([[1, 2, 3, 4]] * 20, keys=["a"] * 20, prompt=[65] * 20, output=[1] * 20)
    d = diagnose(
        q, 8, ServiceModel(cache_tokens=10_000), q_cap=1.0, warm_slots=0, cold_affinity=False
    )
    assert d.admitted_share == 0.0
    assert d.hit_affinity == pytest.approx(d.hit_spread)
    assert d.predicted_gain == pytest.approx(1.0)
    assert d.verdict != "win"


def test_a_marginal_gain_on_hashed_homes_is_a_tie_not_a_win() -> None:
    base = Diagnosis(
        verdict="tie",
        destinations=30,
        horizon_affinity_s=1.0,
        horizon_spread_s=1.0,
        hit_affinity=0.3,
        hit_spread=0.1,
        recoverable=0.2,
        work_spread_s=1.0,
        work_affinity_s=1 / 1.13,
        predicted_gain=1.13,
        pinned_share=0.9,
        win_gain=1.10,
        tie_gain=1.03,
        reason="",
        hashed_share=0.4,
        required_gain=1.10 * (1 + 0.25 * 0.4),
    )
    assert _judge(base, 0.5).verdict == "tie"
    assert _judge(replace(base, required_gain=1.10), 0.5).verdict == "win"
    assert _judge(replace(base, predicted_gain=1.01), 0.5).verdict == "lose"


def test_a_win_on_hashed_homes_needs_more_with_more_gateways(tiny_factory: TinyFactory) -> None:
    # nothing admitted (W = 0): every request rides on a hashed home
    q = tiny_factory([[1, 2, 3, 4]] * 20, keys=["a"] * 20, prompt=[65] * 20, output=[1] * 20)
    svc = ServiceModel(cache_tokens=10_000)
    one = diagnose(q, 8, svc, q_cap=1.0, warm_slots=0)
    four = diagnose(q, 8, svc, q_cap=1.0, warm_slots=0, gateways=4)
    assert one.hashed_share == 1.0
    assert one.required_gain == pytest.approx(1.10 * 1.25)
    assert four.required_gain == pytest.approx(1.10 * (1 + 0.25 * 1.75))
    assert four.gateways == 4


def test_plan_imbalance_is_the_lpt_packing(tiny_factory: TinyFactory) -> None:
    # rates 6, 3, 2, 1 (/11 req/s)
    keys = ["a"] * 6 + ["b"] * 3 + ["c"] * 2 + ["d"]
    q = tiny_factory([[i] for i in range(12)], keys=keys)
    ones = np.ones(4, dtype=np.int64)
    assert planned_imbalance(q, ones, 2) == pytest.approx(1.0)  # {6}, {3, 2, 1}
    assert planned_imbalance(q, ones, 3) == pytest.approx(1.5)  # {6}, {3}, {2, 1}: 6 / 4
    # d cold (0.5 on each of 2), then 6 | 3, 2: 6.5 vs mean 6
    cold_d = np.array([1, 1, 1, 0], dtype=np.int64)
    assert planned_imbalance(q, cold_d, 2) == pytest.approx(13 / 12)
    # a on two replicas: items 3, 3, 3, 2, 1 on 3 replicas -> {3, 1}, {3}, {3, 2}: 5 / 4
    split_a = np.array([2, 1, 1, 1], dtype=np.int64)
    assert planned_imbalance(q, split_a, 3) == pytest.approx(1.25)
