"""The benchmark runs on a small workload without a broker and reports what the CLI prints."""

from __future__ import annotations

import pytest

from cacheroute.benchmarks.emitter import bench_emitter, workload


def test_workload_is_seeded_and_skewed() -> None:
    pairs = workload(20_000, 1_000, seed=3)
    assert pairs == workload(20_000, 1_000, seed=3)
    counts = sorted(
        (sum(1 for k, _ in pairs if k == key) for key in {k for k, _ in pairs[:50]}), reverse=True
    )
    assert counts[0] > 10 * counts[-1]  # a few hot keys, a long cold tail
    assert all(1 <= p < 2**31 for _, p in pairs)


def test_bench_reports_emit_cost_against_a_same_run_baseline() -> None:
    result = bench_emitter(events=3_000, keys=300, rounds=2)
    assert result["emit_ns"] > 0
    assert result["baseline_ns"] > 0
    # ratio comes from unrounded figures and is rounded to 2 decimals; emit_ns is rounded too
    assert result["ratio"] == pytest.approx(
        result["emit_ns"] / result["baseline_ns"], rel=0.02, abs=0.02
    )
    assert len(result["emit_ns_rounds"]) == 2
    assert result["emit_only_ns"] > 0
    assert result["accepted"] == result["events_sent"] == 6_000
    assert "events_per_s" not in result  # no broker given
