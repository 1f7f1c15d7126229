"""The synthetic workload has the paper's documented shape, and is reproducible."""

from __future__ import annotations

import numpy as np

from cacheroute.planner.workload import default_q_cap, drift, gini, paper_workload, top_share


def test_paper_like_shape_at_a_smaller_size() -> None:
    work = paper_workload(50_000, np.random.default_rng(0))
    stats = work.stats()
    assert abs(stats["gini"] - 0.756) < 0.02
    assert abs(stats["top4_share"] - 0.47) < 0.03
    assert stats["max_share"] <= 0.003
    assert abs(stats["total_rate"] - 176.0) < 1e-9
    k = np.ceil(work.rates / default_q_cap(stats["total_rate"]))
    assert 1 <= int(np.count_nonzero(k > 1)) <= 20  # a few whales
    assert len(set(work.keys)) == 50_000
    assert np.all(work.prefix_tokens >= 0)


def test_same_seed_same_workload() -> None:
    a = paper_workload(2000, np.random.default_rng(5))
    b = paper_workload(2000, np.random.default_rng(5))
    assert a.keys == b.keys
    assert np.array_equal(a.rates, b.rates)
    assert not np.array_equal(a.rates, paper_workload(2000, np.random.default_rng(6)).rates)


def test_gini_and_top_share() -> None:
    assert gini(np.ones(10)) == 0.0
    assert abs(gini(np.array([0.0, 0.0, 0.0, 1.0])) - 0.75) < 1e-12
    assert top_share(np.array([1.0, 1.0, 2.0]), 0.3) == 0.5


def test_drift_multiplies_by_independent_log_normal_factors() -> None:
    rates = np.full(100_000, 2.0)
    out = drift(rates, 0.3, np.random.default_rng(1))
    logs = np.log(out / rates)
    assert abs(float(logs.std()) - 0.3) < 0.01
    assert abs(float(logs.mean())) < 0.01
