"""Whole replays on a small cluster: every policy runs, results are deterministic and sane."""

from __future__ import annotations

import numpy as np
import pytest

from cacheroute.replay.policies import POLICY_NAMES
from cacheroute.replay.policy import PlanConfig
from cacheroute.replay.simulator import SimConfig, simulate

from .conftest import WorkloadFactory


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_every_policy_serves_every_request(workload_factory: WorkloadFactory, policy: str) -> None:
    q = workload_factory("whale").compressed(2.0)
    cfg = SimConfig(destinations=6)
    plan = PlanConfig(q_cap=q.rate / 8, control_interval_s=q.duration / 10)
    res = simulate(q, policy, cfg, plan)
    m = res.metrics
    assert np.all(np.isfinite(res.ttft))
    assert np.all(res.e2e >= res.ttft)
    assert np.all((res.dest >= 0) & (res.dest < 6))
    assert 0.0 <= m.hit_rate < 1.0
    assert m.max_over_mean >= 1.0
    assert sum(m.load) == m.measured_requests == q.n - int(0.2 * q.n)
    assert m.ttft_p50_ms <= m.ttft_p99_ms


def test_same_seed_same_result(workload_factory: WorkloadFactory) -> None:
    q = workload_factory("paper")
    cfg = SimConfig(destinations=5, seed=3)
    plan = PlanConfig(q_cap=5.0, control_interval_s=q.duration / 10)
    a = simulate(q, "cacheroute", cfg, plan)
    b = simulate(q, "cacheroute", cfg, plan)
    assert np.array_equal(a.dest, b.dest)
    assert np.array_equal(a.ttft, b.ttft)
    assert a.metrics == b.metrics


def test_affinity_beats_spreading_on_hits_and_pays_in_balance(
    workload_factory: WorkloadFactory,
) -> None:
    q = workload_factory("whale", requests=6000, keys=400)
    cfg = SimConfig(destinations=8)
    plan = PlanConfig(q_cap=q.rate / 12, control_interval_s=q.duration / 15)
    flat = simulate(q, "flat-lb", cfg, plan).metrics
    sticky = simulate(q, "sticky", cfg, plan).metrics
    ours = simulate(q, "cacheroute", cfg, plan).metrics
    assert sticky.hit_rate > flat.hit_rate + 0.1
    assert sticky.max_over_mean > 1.5 > flat.max_over_mean
    assert ours.hit_rate > flat.hit_rate + 0.1
    assert ours.max_over_mean < sticky.max_over_mean
