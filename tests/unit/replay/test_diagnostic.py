"""The workload-only diagnostic: window counting, horizons, verdicts."""

from __future__ import annotations

import numpy as np
import pytest

from cacheroute.replay.diagnostic import _window_counts, diagnose
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
