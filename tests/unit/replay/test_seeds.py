"""Combining seeds: means with their spread, and verdicts from the means (hand-set inputs)."""

from __future__ import annotations

from typing import Any

import pytest

from cacheroute.replay.errors import ReplayError
from cacheroute.replay.seeds import combine


def run(flat: float, ours: float, p99_ratio: float, verdict: str) -> dict[str, Any]:
    return {
        "workload": {"source": "hand-made"},
        "policies": {
            "flat-lb": {"slo_capacity_qps": flat, "slo_capacity_is_lower_bound": False},
            "cacheroute": {"slo_capacity_qps": ours, "slo_capacity_is_lower_bound": ours > 150},
        },
        "simulation": {"verdict": verdict, "p99_ratio_at_reference": p99_ratio},
        "diagnostic": {"verdict": "win"},
        "sim_requests": 1000,
    }


def test_capacities_are_averaged_with_their_spread() -> None:
    out = combine([run(100.0, 121.0, 0.5, "win"), run(120.0, 143.0, 0.7, "win")])
    ours = out["policies"]["cacheroute"]
    assert ours["slo_capacity_qps"] == pytest.approx(132.0)
    assert (ours["slo_capacity_qps_min"], ours["slo_capacity_qps_max"]) == (121.0, 143.0)
    assert ours["slo_capacity_qps_by_seed"] == [121.0, 143.0]
    assert out["policies"]["flat-lb"]["slo_capacity_qps"] == pytest.approx(110.0)
    # 132 / 110 = 1.2 -> win; mean p99 ratio 0.6 <= 0.9 -> deploy
    assert out["simulation"]["capacity_ratio"] == pytest.approx(1.2)
    assert out["simulation"]["verdict"] == "win"
    assert out["recommendation"] == "deploy"
    assert out["agree"] is True
    assert (out["seeds"], out["sim_requests"]) == (2, 2000)


def test_the_verdict_follows_the_mean_not_one_lucky_seed() -> None:
    # seed 0 alone would say win (1.2x), seed 1 lose (0.85x); the means give 205 / 200 = 1.025
    out = combine([run(100.0, 120.0, 0.8, "win"), run(100.0, 85.0, 1.1, "lose")])
    assert out["simulation"]["capacity_ratio"] == pytest.approx(1.025)
    assert out["simulation"]["verdict"] == "tie"
    assert out["simulation"]["verdicts_by_seed"] == ["win", "lose"]
    assert out["recommendation"] == "keep flat-lb"
    assert out["agree"] is False


def test_a_lower_bound_in_any_seed_is_reported() -> None:
    out = combine([run(100.0, 160.0, 0.5, "win"), run(100.0, 140.0, 0.5, "win")])
    assert out["policies"]["cacheroute"]["slo_capacity_is_lower_bound"] is True


def test_runs_must_compare_the_same_policies() -> None:
    a = run(100.0, 120.0, 0.5, "win")
    b = run(100.0, 120.0, 0.5, "win")
    b["policies"]["preble"] = {"slo_capacity_qps": 1.0}
    with pytest.raises(ReplayError):
        combine([a, b])
    with pytest.raises(ReplayError):
        combine([])
