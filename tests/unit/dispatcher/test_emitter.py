"""The emitter's rules on a fake producer and clock: sealing, heartbeats, bounds, failures, lifecycle."""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from typing import Any

import numpy as np
import pytest
from confluent_kafka import KafkaError, KafkaException
from prometheus_client import CollectorRegistry

from cacheroute.dispatcher.emitter.config import EmitterConfig
from cacheroute.dispatcher.emitter.emitter import Emitter
from cacheroute.dispatcher.emitter.partitioner import partition_for
from cacheroute.dispatcher.errors import DispatchError
from cacheroute.schemas import RequestBatch
from tests.unit.dispatcher.fakes import FakeClock, FakeProducer
from tests.unit.dispatcher.helpers import (
    SETTINGS,
    TOPIC,
    batches,
    keys_on,
    make_emitter,
)

LOGGER = "cacheroute.dispatcher.emitter"


def _accounted(emitter: Emitter) -> None:
    s = emitter.stats()
    assert s.accepted == s.events_sent + s.events_failed + s.buffered


def test_batches_go_to_the_key_partition_with_gateway_key_and_per_partition_seq() -> None:
    emitter, producer, clock = make_emitter()
    keys = [f"conv-{i}" for i in range(40)]
    for round_ in range(3):
        for key in keys:
            assert emitter.emit(key, 100 + round_, destination="d0")
        clock.advance(50)
        emitter.pump()
    assert {p.topic for p in producer.produced} == {TOPIC}
    assert {p.key for p in producer.produced} == {b"gw-1"}
    seqs: dict[int, list[int]] = {}
    for sent in producer.produced:
        batch = sent.decode()
        assert isinstance(batch, RequestBatch)
        assert batch.gateway_id == "gw-1"
        assert {partition_for(k, 4) for k in batch.keys} == {sent.partition}
        seqs.setdefault(sent.partition, []).append(batch.seq)
    assert all(s == list(range(len(s))) for s in seqs.values())
    assert sorted(k for b in batches(producer) for k in b.keys) == sorted(keys * 3)
    assert emitter.stats().events_sent == 120
    _accounted(emitter)


def test_a_buffer_is_sealed_after_linger_ms_and_not_before() -> None:
    emitter, producer, clock = make_emitter(linger_ms=50)
    (key,) = keys_on(0, 4, 1)
    emitter.emit(key, 10)
    clock.advance(30)
    emitter.emit(key, 11)  # a second event does not restart the linger clock
    clock.advance(19)
    emitter.pump()
    assert producer.produced == []
    clock.advance(1)
    emitter.pump()
    (batch,) = batches(producer)
    assert batch.prompt_tokens == [10, 11]
    assert batch.event_time_ms == [clock.now - 50, clock.now - 20]
    assert batch.created_ms == clock.now


def test_a_full_buffer_is_sealed_at_once_in_chunks_of_max_batch_events() -> None:
    emitter, producer, _ = make_emitter(max_batch_events=10, linger_ms=50)
    keys = keys_on(2, 4, 25)
    for i, key in enumerate(keys):
        emitter.emit(key, i)
    assert emitter._wake.is_set()  # the thread would be woken instead of waiting for its poll
    emitter.pump()  # no time has passed: only the count rule applies
    sent = batches(producer)
    assert [len(b) for b in sent] == [10, 10, 5]
    assert [b.seq for b in sent] == [0, 1, 2]
    assert [p for b in sent for p in b.prompt_tokens] == list(range(25))


def test_idle_partitions_get_heartbeats_and_busy_ones_do_not() -> None:
    emitter, producer, clock = make_emitter(heartbeat_ms=1000, linger_ms=50)
    clock.advance(999)
    emitter.pump()
    assert producer.produced == []
    clock.advance(1)
    emitter.emit(keys_on(1, 4, 1)[0], 5)  # partition 1 holds an event: no heartbeat for it
    emitter.pump()
    beats = batches(producer, heartbeats=True)
    assert sorted(p.partition for p in producer.produced) == [0, 2, 3]
    assert all(len(b) == 0 and b.created_ms == clock.now and b.seq == 0 for b in beats)
    assert emitter.stats().heartbeats_sent == 3
    clock.advance(50)
    emitter.pump()  # partition 1's batch now goes out; it counts as sending for partition 1
    clock.advance(950)
    emitter.pump()
    assert sorted(p.partition for p in producer.produced[4:]) == [0, 2, 3]
    clock.advance(50)
    emitter.pump()
    assert [p.partition for p in producer.produced[7:]] == [1]
    assert producer.produced[-1].decode().seq == 1


def test_memory_bound_drops_and_counts_then_recovers_after_delivery() -> None:
    emitter, _producer, clock = make_emitter(max_buffered_events=100)
    accepted = [emitter.emit(f"k{i}", 1) for i in range(150)]
    assert accepted == [True] * 100 + [False] * 50
    stats = emitter.stats()
    assert (stats.accepted, stats.dropped, stats.buffered) == (100, 50, 100)
    clock.advance(50)
    emitter.pump()  # sealed, produced and delivered: memory released
    assert emitter.stats().buffered == 0
    assert emitter.emit("k-again", 1)
    _accounted(emitter)


def test_queue_full_keeps_sealed_batches_and_retries_them_in_order() -> None:
    producer = FakeProducer(buffer_errors=3)
    emitter, producer, _clock = make_emitter(producer=producer, max_batch_events=5)
    keys = keys_on(3, 4, 20)
    for i, key in enumerate(keys):
        emitter.emit(key, i)
    emitter.pump()
    assert producer.produced == []
    assert emitter.stats().buffered == 20
    emitter.pump()
    emitter.pump()
    assert producer.produced == []
    emitter.pump()  # librdkafka takes records again
    sent = batches(producer)
    assert [b.seq for b in sent] == [0, 1, 2, 3]
    assert [p for b in sent for p in b.prompt_tokens] == list(range(20))
    assert emitter.stats().events_sent == 20
    _accounted(emitter)


def test_delivery_errors_are_counted_and_logged_rate_limited(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    producer = FakeProducer(fail_with=KafkaError(KafkaError._MSG_TIMED_OUT))
    emitter, producer, clock = make_emitter(
        producer=producer, log_interval_ms=10_000, heartbeat_ms=60_000
    )
    for _ in range(30):  # 3 s of failures, one record per cycle
        assert emitter.emit("k", 1)
        clock.advance(100)
        emitter.pump()
    stats = emitter.stats()
    assert stats.delivery_errors == 30
    assert stats.events_failed == 30
    assert stats.buffered == 0
    lines = [r.getMessage() for r in caplog.records if "_MSG_TIMED_OUT" in r.getMessage()]
    assert len(lines) == 1
    clock.advance(10_000)
    producer.fail_with = KafkaError(KafkaError._MSG_TIMED_OUT)
    emitter.emit("k", 1)
    clock.advance(50)
    emitter.pump()
    lines = [r.getMessage() for r in caplog.records if "_MSG_TIMED_OUT" in r.getMessage()]
    assert len(lines) == 2
    assert "29 similar suppressed" in lines[1]


def test_produce_time_errors_fail_the_record_not_the_caller() -> None:
    producer = FakeProducer(produce_error=KafkaException(KafkaError(KafkaError._UNKNOWN_PARTITION)))
    emitter, producer, clock = make_emitter(producer=producer)
    assert emitter.emit("k", 1)
    clock.advance(50)
    emitter.pump()
    stats = emitter.stats()
    assert (stats.delivery_errors, stats.events_failed, stats.buffered) == (1, 1, 0)
    producer.produce_error = None
    assert emitter.emit("k", 2)
    clock.advance(50)
    emitter.pump()
    (batch,) = batches(producer)
    assert batch.seq == 1  # the lost record leaves a visible gap in seq
    assert emitter.stats().events_sent == 1


BAD_EVENTS: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = [
    ("None key", (None, 10), {}),
    ("empty key", ("", 10), {}),
    ("key over max_key_bytes", ("é" * 513, 10), {}),
    ("bytes key", (b"k", 10), {}),
    ("surrogate key", ("\udc80", 10), {}),
    ("negative tokens", ("k", -1), {}),
    ("tokens over int32", ("k", 2**31), {}),
    ("float tokens", ("k", 1.5), {}),
    ("bool tokens", ("k", True), {}),
    ("None tokens", ("k", None), {}),
    ("negative prefix", ("k", 10), {"prefix_tokens": -5}),
    ("string cached", ("k", 10), {"cached_tokens": "3"}),
    ("int destination", ("k", 10), {"destination": 3}),
    ("surrogate destination", ("k", 10), {"destination": "d\udc80"}),
    ("float hashes", ("k", 10), {"prefix_block_hashes": [1.5]}),
    ("hash over int64", ("k", 10), {"prefix_block_hashes": [2**63]}),
    ("string hashes", ("k", 10), {"prefix_block_hashes": "abc"}),
    ("negative event time", ("k", 10), {"event_time_ms": -1}),
    ("float event time", ("k", 10), {"event_time_ms": 1.0}),
]


@pytest.mark.parametrize(("case", "args", "kwargs"), BAD_EVENTS, ids=[c for c, _, _ in BAD_EVENTS])
def test_invalid_events_are_rejected_never_raised(
    case: str, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    emitter, producer, _clock = make_emitter()
    assert emitter.emit(*args, **kwargs) is False, case
    stats = emitter.stats()
    assert (stats.rejected, stats.accepted, stats.buffered) == (1, 0, 0)
    emitter.flush()
    assert batches(producer) == []


def test_unusual_but_valid_events_are_accepted_and_arrive_intact() -> None:
    emitter, producer, _ = make_emitter()
    assert emitter.emit("z" * 1024, 0)  # zero tokens and a key of exactly max_key_bytes
    # numpy integers are accepted at run time (the annotations say int for the common case)
    assert emitter.emit("k", np.int64(7), cached_tokens=np.int32(3))  # type: ignore[arg-type]
    assert emitter.emit("k", 1, prefix_block_hashes=(1, -2), destination="", event_time_ms=5)
    hashes = np.array([9, 8], dtype=np.int64)
    assert emitter.emit("k", 2**31 - 1, prefix_block_hashes=hashes)  # type: ignore[arg-type]
    assert emitter.emit("k", 2**31 - 2, prefix_block_hashes=[])  # empty means unknown
    assert emitter.flush()
    events = sorted(
        (e for b in batches(producer) for e in b.events()), key=lambda e: e.prompt_tokens
    )
    assert [(e.key, e.prompt_tokens, e.cached_tokens) for e in events[:3]] == [
        ("z" * 1024, 0, None),
        ("k", 1, None),
        ("k", 7, 3),
    ]
    assert events[1].prefix_block_hashes == [1, -2]
    assert events[1].destination is None
    assert events[1].event_time_ms == 5
    assert events[3].prefix_block_hashes is None
    assert events[4].prefix_block_hashes == [9, 8]


def test_emit_survives_a_failing_clock_and_rejections_are_logged_by_the_pump(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    clock = FakeClock()

    def broken() -> int:
        if broken.fail:  # type: ignore[attr-defined]
            raise OSError("clock unavailable")
        return clock()

    broken.fail = False  # type: ignore[attr-defined]
    emitter = Emitter(
        SETTINGS,
        "gw-1",
        EmitterConfig(partitions=4, background=False),
        producer=FakeProducer(),
        clock_ms=broken,
    )
    broken.fail = True  # type: ignore[attr-defined]
    assert emitter.emit("k", 1) is False
    broken.fail = False  # type: ignore[attr-defined]
    for _ in range(3):
        emitter.emit(None, 1)  # type: ignore[arg-type]
    emitter.pump()
    emitter.pump()
    lines = [r.getMessage() for r in caplog.records if "rejected" in r.getMessage()]
    assert len(lines) == 1
    assert "rejected 4 events" in lines[0]
    assert "key must be a str" in lines[0]
    assert emitter.stats().rejected == 4


def test_event_times_ahead_of_the_clock_never_make_created_ms_older() -> None:
    emitter, producer, clock = make_emitter()
    emitter.emit("k", 1, event_time_ms=clock.now + 10_000)
    assert emitter.flush()
    (batch,) = batches(producer)
    assert batch.created_ms == clock.now + 10_000


def test_records_over_max_batch_bytes_are_split_with_consecutive_seqs() -> None:
    emitter, producer, clock = make_emitter(max_batch_bytes=2_000)
    keys = keys_on(0, 4, 300, prefix="a-rather-long-conversation-key")
    for key in keys:
        emitter.emit(key, 1)
    clock.advance(50)
    emitter.pump()
    sent = batches(producer)
    assert len(sent) > 4
    assert all(len(p.value) <= 2_000 for p in producer.produced)
    assert [b.seq for b in sent] == list(range(len(sent)))
    assert [k for b in sent for k in b.keys] == keys


def test_flush_seals_everything_and_loses_nothing() -> None:
    emitter, producer, _ = make_emitter(linger_ms=60_000)
    for i in range(1234):
        emitter.emit(f"key-{i % 97}", i)
    emitter.pump()
    assert producer.produced == []  # linger has not passed
    assert emitter.flush() is True
    got = sorted(p for b in batches(producer) for p in b.prompt_tokens)
    assert got == list(range(1234))
    assert emitter.stats().buffered == 0


def test_close_is_idempotent_flushes_and_then_drops() -> None:
    registry = CollectorRegistry()
    producer = FakeProducer()
    emitter = Emitter(
        SETTINGS,
        "gw-1",
        EmitterConfig(partitions=4, background=False),
        producer=producer,
        registry=registry,
    )
    with emitter:
        for i in range(10):
            emitter.emit(f"k{i}", i)
        assert (
            registry.get_sample_value("cacheroute_emitter_accepted_total", {"gateway": "gw-1"})
            == 10
        )
        assert registry.get_sample_value("cacheroute_emitter_buffered", {"gateway": "gw-1"}) == 10
    assert sum(len(b) for b in batches(producer)) == 10
    assert emitter.close() is True
    assert emitter.emit("late", 1) is False
    stats = emitter.stats()
    assert (stats.accepted, stats.dropped, stats.events_sent) == (10, 1, 10)
    # the collector is gone: a new emitter of the same gateway can register in the same registry
    assert (
        registry.get_sample_value("cacheroute_emitter_accepted_total", {"gateway": "gw-1"}) is None
    )
    Emitter(
        SETTINGS,
        "gw-1",
        EmitterConfig(partitions=4, background=False),
        producer=producer,
        registry=registry,
    ).close()


def test_after_close_nothing_is_sealed_or_produced_any_more() -> None:
    emitter, producer, clock = make_emitter()
    emitter.emit("k", 1)
    assert emitter.close()
    produced = len(producer.produced)
    clock.advance(60_000)  # heartbeats would be due
    assert emitter.pump() == 0
    assert emitter.flush() is True
    assert len(producer.produced) == produced


def test_metrics_mirror_stats_in_a_private_registry_per_emitter() -> None:
    first, _, clock = make_emitter()
    second, _, _ = make_emitter()
    assert first.registry is not second.registry
    first.emit("k", 1)
    first.emit(None, 1)  # type: ignore[arg-type]
    clock.advance(50)
    first.pump()
    stats = first.stats()
    sample = first.registry.get_sample_value
    labels = {"gateway": "gw-1"}
    for name in (
        "accepted",
        "rejected",
        "batches_sent",
        "events_sent",
        "dropped",
        "delivery_errors",
    ):
        assert sample(f"cacheroute_emitter_{name}_total", labels) == getattr(stats, name), name
    assert sample("cacheroute_emitter_buffered", labels) == stats.buffered == 0


def test_background_thread_delivers_within_the_linger_budget() -> None:
    producer = FakeProducer()
    emitter = Emitter(SETTINGS, "gw-1", EmitterConfig(partitions=4), producer=producer)
    try:
        start = time.monotonic()
        emitter.emit("k", 1)
        while not producer.produced and time.monotonic() - start < 5:
            time.sleep(0.002)
        waited = time.monotonic() - start
        (batch,) = batches(producer)
        assert batch.keys == ["k"]
        assert waited >= 0.04  # it lingered for more events...
        assert waited < 1.0  # ...but not long (typically 50-60 ms; generous for a busy machine)
    finally:
        assert emitter.close()


def test_concurrent_emitters_threads_lose_and_duplicate_nothing() -> None:
    producer = FakeProducer()
    emitter = Emitter(
        SETTINGS,
        "gw-1",
        EmitterConfig(partitions=4, linger_ms=1, poll_interval_ms=1),
        producer=producer,
    )
    per_thread = 5000

    def work(t: int) -> None:
        for i in range(per_thread):
            emitter.emit(f"k{i % 50}", t * per_thread + i)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert emitter.close()
    got = Counter(p for b in batches(producer) for p in b.prompt_tokens)
    assert got == Counter(range(4 * per_thread))
    assert emitter.stats().events_sent == 4 * per_thread


def test_bad_configuration_fails_at_construction() -> None:
    with pytest.raises(DispatchError, match="linger_ms"):
        EmitterConfig(linger_ms=0)
    with pytest.raises(DispatchError, match="mode"):
        EmitterConfig(mode="rows")  # type: ignore[arg-type]
    with pytest.raises(DispatchError, match="partitions"):
        EmitterConfig(partitions=0)
    with pytest.raises(DispatchError, match="gateway_id"):
        Emitter(
            SETTINGS, "", EmitterConfig(partitions=1, background=False), producer=FakeProducer()
        )
