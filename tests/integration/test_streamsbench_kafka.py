"""`bench streams` end to end on a small workload: every figure present, both baselines honest."""

from __future__ import annotations

import pytest

from cacheroute.benchmarks.streams import bench_streams
from cacheroute.settings import Settings

pytestmark = pytest.mark.kafka

FIELDS = {
    # the figures `bench streams` always reported
    "events",
    "keys",
    "seed",
    "preload_s",
    "partitions",
    "messages",
    "batch_size",
    "distinct_keys",
    "events_per_s",
    "agent_seconds",
    "raw_events_per_s",
    "raw_seconds",
    "raw_messages",
    "ratio",
    "rates_emitted",
    "events_counted",
    "exact",
    "emit_ns",
    "emit_baseline_ns",
    "emit_ratio",
    "window_ms",
    # added with the honest baselines
    "agent_ingest_seconds",
    "agent_events_before_clock",
    "agent_cpu_seconds",
    "agent_flush_seconds",
    "raw_fetch_seconds",
    "raw_decode_seconds",
    "raw_cpu_seconds",
    "raw_events",
    "numpy_events_per_s",
    "numpy_seconds",
    "numpy_convert_seconds",
    "numpy_keys",
    "numpy_mismatched_keys",
    "ratio_numpy",
}


def test_bench_streams_small_run(kafka_settings: Settings) -> None:
    events = 20_000
    result = bench_streams(kafka_settings, events=events, keys=1_000, seed=1)
    assert set(result) == FIELDS
    assert result["exact"] is True
    assert result["events_counted"] == events
    # the raw baseline read to EOF on every partition: every batch, plus one closer per partition
    assert result["raw_events"] == events
    assert result["raw_messages"] == result["messages"] + result["partitions"]
    # its parts fit inside its clock (3-decimal rounding aside)
    assert (
        result["raw_fetch_seconds"] + result["raw_decode_seconds"] <= result["raw_seconds"] + 2e-3
    )
    # raw_seconds is rounded to 1 ms (a 20k-event read takes ~30 ms): allow that rounding
    raw_s = result["raw_seconds"]
    assert events / (raw_s + 5e-4) <= result["raw_events_per_s"] <= events / max(raw_s - 5e-4, 1e-9)
    # the numpy baseline computed what the agent emitted, for every key
    assert result["numpy_keys"] == result["distinct_keys"] == result["rates_emitted"]
    assert result["numpy_mismatched_keys"] == 0
    assert result["numpy_events_per_s"] > 0
    counted = events - result["agent_events_before_clock"]
    # agent_seconds is rounded to 1 ms (the agent takes ~0.1 s here) and events_per_s to 1/s
    agent_s = result["agent_seconds"]
    low, high = counted / (agent_s + 5e-4) - 1, counted / max(agent_s - 5e-4, 1e-9) + 1
    assert low <= result["events_per_s"] <= high
    assert result["agent_ingest_seconds"] <= result["agent_seconds"]
    assert result["ratio"] == pytest.approx(
        result["events_per_s"] / result["raw_events_per_s"], rel=0.01, abs=1e-3
    )
    assert result["ratio_numpy"] == pytest.approx(
        result["events_per_s"] / result["numpy_events_per_s"], rel=0.01, abs=1e-3
    )
