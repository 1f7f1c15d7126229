"""The faust-streaming rate agent on the real broker: known patterns in, correct KeyRates out.

Each test runs real `cacheroute streams run` worker processes. Events are synthetic with known
truth: key A Poisson 50/s, B periodic 5/s, C bursty (gamma, CV 2) at 10/s, each spread over 3
gateways whose batches interleave and arrive out of order by up to ~180 ms; 60 s of event time in
20 s windows.
"""

from __future__ import annotations

import signal
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Producer

from cacheroute.dispatcher.emitter.partitioner import partition_for
from cacheroute.kafkaio import producer_config, read_partition
from cacheroute.schemas import KeyRate, RequestBatch, codec_for
from cacheroute.settings import Settings
from cacheroute.topics import ensure_topics, make_admin
from tests.integration.streams_support import (
    T0,
    produce_batches,
    read_rates,
    streams_worker,
    synthetic_events,
    truth,
)

pytestmark = pytest.mark.kafka

WINDOW = 20_000
END = T0 + 3 * WINDOW + 2_000 + 500  # past the last window's end + grace


def _app_id(settings: Settings) -> str:
    return settings.topic_prefix.rstrip(".") + "-streams"


def _check(
    rates: dict[tuple[str, int], KeyRate], expected: dict[tuple[str, int], dict[str, float | None]]
) -> None:
    assert set(rates) == set(expected)
    for (key, window), want in expected.items():
        got = rates[(key, window)]
        assert got.count == want["count"], (key, window)
        assert got.window_end_ms - got.window_start_ms == WINDOW
        assert got.rate == pytest.approx(got.count / (WINDOW / 1000))
        assert got.prompt_tokens_sum == 100 * got.count
        assert got.prefix_tokens_sum == 60 * got.count
        if want["cv"] is None:
            assert got.interarrival_cv is None
        else:
            # disorder (<= ~180 ms) is inside the 1 s reorder horizon: the estimate is exact
            assert got.interarrival_cv == pytest.approx(want["cv"], rel=1e-9, abs=1e-12), key


def _nominal(rates: dict[tuple[str, int], KeyRate]) -> None:
    for window in (T0, T0 + WINDOW, T0 + 2 * WINDOW):
        a, b, c = (rates[(k, window)] for k in "ABC")
        assert a.rate == pytest.approx(50, rel=0.15)
        assert a.interarrival_cv == pytest.approx(1.0, abs=0.15)
        assert b.rate == pytest.approx(5, abs=0.051)
        assert b.interarrival_cv == pytest.approx(0.0, abs=1e-9)
        assert c.rate == pytest.approx(10, rel=0.6)
        assert c.interarrival_cv == pytest.approx(2.0, abs=0.8)


def test_known_patterns_give_exact_counts_and_estimates(settings: Settings, tmp_path: Path) -> None:
    ensure_topics(settings)
    events = synthetic_events(seed=1)
    expected = truth(events, WINDOW)
    with streams_worker(settings, _app_id(settings), tmp_path, window_ms=WINDOW) as worker:
        produce_batches(settings, events, settings.requests_partitions, final_heartbeat_ms=END)
        rates = read_rates(settings, set(expected), worker=worker)
        _check(rates, expected)
        _nominal(rates)
        assert rates[("edge", T0)].count == 1  # 19_999 ms: first window
        assert rates[("edge", T0 + WINDOW)].count == 1  # 20_000 ms: second window

        # a late event for the first window: counted as late, dropped, no new rate
        p = partition_for("A", settings.requests_partitions)
        late = RequestBatch("gw-9", 0, END + 1000, ["A"], [T0 + 5], [100])
        producer = Producer(producer_config(settings))
        producer.produce(
            settings.topics["requests"], codec_for(RequestBatch).encode(late), partition=p
        )
        assert producer.flush(10) == 0
        worker.wait_metric("cacheroute_streams_events_late_total", 1)
        assert worker.metric("cacheroute_streams_events_accepted_total") == len(events)


def test_dead_letters_bad_batches_and_bad_events_and_keeps_going(
    settings: Settings, tmp_path: Path
) -> None:
    ensure_topics(settings)
    topic = settings.topics["requests"]
    p = partition_for("good", settings.requests_partitions)
    mixed = RequestBatch(
        gateway_id="gw-0",
        seq=0,
        created_ms=T0 + 1000,
        keys=["good", "good", "good", "good", "good"],
        event_time_ms=[T0 + 10, T0 + 20, T0 + 30, T0 + 40, T0 + 50],
        prompt_tokens=[5, -3, 5, 5, 2_000_000_000],  # no model serves the last
    )
    producer = Producer(producer_config(settings))
    producer.produce(topic, b"\x00 definitely not a batch", key=b"gw-x", partition=p)
    producer.produce(topic, codec_for(RequestBatch).encode(mixed, validate=False), partition=p)
    producer.produce(
        topic, codec_for(RequestBatch).encode(RequestBatch("gw-0", 1, END, [], [], [])), partition=p
    )
    assert producer.flush(10) == 0
    with streams_worker(settings, _app_id(settings), tmp_path, window_ms=WINDOW) as worker:
        rates = read_rates(settings, {("good", T0)})
        assert rates[("good", T0)].count == 3
        worker.wait_metric("cacheroute_streams_batches_dead_lettered_total", 1)
        assert worker.metric("cacheroute_streams_events_dead_lettered_total") == 2
    dlq = read_partition(settings, settings.topics["dead_letter"])
    reasons = sorted((r.header("cacheroute.reason") or b"").decode() for r in dlq)
    assert len(dlq) == 3
    assert "negative prompt_tokens" in reasons
    assert "prompt_tokens above max_prompt_tokens" in reasons
    assert any("unknown format marker" in r for r in reasons)
    assert all(r.header("cacheroute.source") for r in dlq)


def test_worker_killed_mid_window_loses_no_counts(settings: Settings, tmp_path: Path) -> None:
    ensure_topics(settings)
    events = synthetic_events(seed=2)
    expected = truth(events, WINDOW)
    first = [e for e in events if e[1] < T0 + 30_000]  # stops in the middle of window 2
    rest = [e for e in events if e[1] >= T0 + 30_000]
    app_id = _app_id(settings)
    # Commits every 5 s: the kill lands after state flushes (every 0.3 s) but before any offset
    # commit, so the next worker must restore the changelog AND skip re-delivered messages.
    with streams_worker(
        settings, app_id, tmp_path, window_ms=WINDOW, commit_interval=5.0
    ) as worker:
        produce_batches(settings, first, settings.requests_partitions)
        worker.wait_metric("cacheroute_streams_events_accepted_total", len(first))
        worker.wait_metric("cacheroute_streams_flush_seconds_count", 2)
        worker.proc.send_signal(signal.SIGKILL)
        worker.proc.wait(timeout=10)
    produce_batches(settings, rest, settings.requests_partitions, final_heartbeat_ms=END)
    with streams_worker(settings, app_id, tmp_path / "second", window_ms=WINDOW) as second:
        rates = read_rates(settings, set(expected), worker=second)
        assert second.metric("cacheroute_streams_events_replayed_total") > 0
    _check(rates, expected)


def test_two_workers_share_partitions_and_agree_with_one(
    settings: Settings, tmp_path: Path
) -> None:
    ensure_topics(settings)
    events = synthetic_events(seed=3)
    expected = truth(events, WINDOW)
    app_id = _app_id(settings)
    admin = make_admin(settings.bootstrap)
    with (
        streams_worker(settings, app_id, tmp_path / "w1", window_ms=WINDOW) as w1,
        streams_worker(settings, app_id, tmp_path / "w2", window_ms=WINDOW) as w2,
    ):
        deadline = time.monotonic() + 60
        while True:
            desc = admin.describe_consumer_groups([app_id])[app_id].result(timeout=10)
            if len(desc.members) == 2 and str(desc.state).endswith("STABLE"):
                break
            assert time.monotonic() < deadline, f"group never had 2 stable members: {desc}"
            time.sleep(0.5)
        produce_batches(settings, events, settings.requests_partitions, final_heartbeat_ms=END)
        rates = read_rates(settings, set(expected))
        _check(rates, expected)
        assert w1.metric("cacheroute_streams_batches_total") > 0
        assert w2.metric("cacheroute_streams_batches_total") > 0


@pytest.fixture(autouse=True)
def _cleanup_faust_topics(settings: Settings) -> object:
    yield None
    admin = make_admin(settings.bootstrap)
    stem = settings.topic_prefix.rstrip(".") + "-streams"
    ours = [t for t in admin.list_topics(timeout=10).topics if t.startswith(stem)]
    if ours:
        for fut in admin.delete_topics(ours, operation_timeout=30).values():
            fut.result(timeout=30)
    return None


_ = uuid  # (kept for ad-hoc app ids when debugging)
