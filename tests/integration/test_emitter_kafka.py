"""The gateway emitter against the real broker: placement, completeness, heartbeats, failures."""

from __future__ import annotations

import logging
import random
import time
from collections import Counter

import pytest
from confluent_kafka import KafkaError, Message, Producer

from cacheroute.dispatcher.emitter.config import EmitterConfig
from cacheroute.dispatcher.emitter.emitter import Emitter
from cacheroute.dispatcher.emitter.partitioner import partition_for
from cacheroute.errors import CacheRouteError
from cacheroute.kafkaio import KafkaRecord, producer_config, read_partition
from cacheroute.schemas import RequestBatch, RequestSummary, decode_any
from cacheroute.settings import Settings
from cacheroute.topics import ensure_topics

pytestmark = pytest.mark.kafka

LOGGER = "cacheroute.dispatcher.emitter"

Sent = tuple[str, int, int, int | None, str | None, int | None, tuple[int, ...] | None]


def _read_all(
    settings: Settings,
) -> dict[int, list[tuple[KafkaRecord, RequestBatch | RequestSummary]]]:
    """Every record of the requests topic, decoded, by partition."""
    topic = settings.topics["requests"]
    out: dict[int, list[tuple[KafkaRecord, RequestBatch | RequestSummary]]] = {}
    for p in range(settings.requests_partitions):
        out[p] = []
        for rec in read_partition(settings, topic, p):
            value = decode_any(
                rec.value, topic=rec.topic, partition=rec.partition, offset=rec.offset
            )
            assert isinstance(value, RequestBatch | RequestSummary)
            out[p].append((rec, value))
    return out


def _events_on_topic(settings: Settings) -> list[tuple[int, Sent]]:
    """(partition, event) for every event in every batch on the requests topic."""
    return _events_in(_read_all(settings))


def _events_in(
    read: dict[int, list[tuple[KafkaRecord, RequestBatch | RequestSummary]]],
) -> list[tuple[int, Sent]]:
    """(partition, event) for every event in every batch of a `_read_all` result."""
    got: list[tuple[int, Sent]] = []
    for p, records in read.items():
        for _, batch in records:
            assert isinstance(batch, RequestBatch)
            got.extend(
                (
                    p,
                    (
                        e.key,
                        e.event_time_ms,
                        e.prompt_tokens,
                        e.prefix_tokens,
                        e.destination,
                        e.cached_tokens,
                        tuple(e.prefix_block_hashes) if e.prefix_block_hashes else None,
                    ),
                )
                for e in batch.events()
            )
    return got


def _emit_random(emitter: Emitter, n: int, keys: int, seed: int) -> list[Sent]:
    rng = random.Random(seed)
    sent: list[Sent] = []
    for i in range(n):
        key = f"conv-{rng.randrange(keys)}"
        prefix = rng.randrange(4000) if i % 3 == 0 else None
        dest = f"d{rng.randrange(4)}" if i % 5 == 0 else None
        cached = rng.randrange(2000) if i % 7 == 0 else None
        hashes = tuple(rng.getrandbits(63) for _ in range(3)) if i % 11 == 0 else None
        t = 1_700_000_000_000 + i
        prompt = rng.randrange(1, 8000)
        assert emitter.emit(
            key,
            prompt,
            prefix_tokens=prefix,
            destination=dest,
            cached_tokens=cached,
            prefix_block_hashes=hashes,
            event_time_ms=t,
        )
        sent.append((key, t, prompt, prefix, dest, cached, hashes))
    return sent


def test_every_accepted_event_arrives_once_on_the_partition_kafka_would_choose(
    settings: Settings,
) -> None:
    ensure_topics(settings)
    emitter = Emitter(settings, "gw-it", EmitterConfig(max_batch_events=500))
    assert emitter.partitions == settings.requests_partitions == 8
    sent = _emit_random(emitter, 20_000, keys=3_000, seed=1)
    assert emitter.close(30)
    # the emitter's own account first: a failure below then says whether records were not
    # delivered (counted here) or delivered and not read back (seen once in a CI run: a
    # partition's batches began at seq 2, and nothing else told which)
    stats = emitter.stats()
    assert stats.delivery_errors == stats.dropped == stats.rejected == 0, stats
    assert stats.accepted == stats.events_sent == 20_000, stats

    records = _read_all(settings)
    seqs = {p: [b.seq for _, b in recs] for p, recs in records.items()}
    first_offsets = {p: recs[0][0].offset if recs else None for p, recs in records.items()}
    assert all(s == list(range(len(s))) for s in seqs.values()), (seqs, first_offsets)
    assert all(rec.key == b"gw-it" for recs in records.values() for rec, _ in recs)
    got = _events_in(records)  # the same read as the seqs above
    assert all(p == partition_for(e[0], 8) for p, e in got)
    assert Counter(e for _, e in got) == Counter(sent)  # every event exactly once, intact


def test_flush_and_close_lose_nothing_accepted(settings: Settings) -> None:
    ensure_topics(settings)
    emitter = Emitter(settings, "gw-flush", EmitterConfig(linger_ms=60_000))  # only flush seals
    for i in range(5_000):
        emitter.emit(f"k{i % 500}", i)
    assert emitter.flush(30)
    assert len(_events_on_topic(settings)) == 5_000
    for i in range(5_000, 8_000):
        emitter.emit(f"k{i % 500}", i)
    assert emitter.close(30)
    assert emitter.close(30)  # idempotent
    assert not emitter.emit("late", 1)
    got = sorted(e[2] for _, e in _events_on_topic(settings))
    assert got == list(range(8_000))
    stats = emitter.stats()
    assert (stats.accepted, stats.events_sent, stats.dropped) == (8_000, 8_000, 1)


def test_idle_partitions_receive_heartbeats(settings: Settings) -> None:
    ensure_topics(settings)
    busy = [f"busy-{i}" for i in range(2000) if partition_for(f"busy-{i}", 8) == 0][:20]
    start = int(time.time() * 1000)
    with Emitter(settings, "gw-hb", EmitterConfig(heartbeat_ms=200)) as emitter:
        for _ in range(8):
            for key in busy:
                emitter.emit(key, 1)
            time.sleep(0.1)
    records = _read_all(settings)
    assert Counter(p for p, _ in _events_in(records)) == {0: 8 * len(busy)}
    for p in range(1, 8):
        beats = [b for _, b in records[p]]
        assert len(beats) >= 2, p  # ~800 ms at one per 200 ms, minus start-up
        assert all(isinstance(b, RequestBatch) and len(b) == 0 for b in beats)
        created = [b.created_ms for b in beats]
        assert created == sorted(created)
        assert created[0] >= start + 200
    assert emitter.stats().heartbeats_sent >= 14


def test_confluent_murmur2_random_places_keys_where_partition_for_says(settings: Settings) -> None:
    ensure_topics(settings)
    producer = Producer(producer_config(settings, partitioner="murmur2_random"))
    topic = settings.topics["requests"]
    placed: dict[str, int] = {}

    def on_delivery(err: KafkaError | None, msg: Message) -> None:
        assert err is None
        placed[(msg.key() or b"").decode()] = msg.partition() or 0

    keys = [f"conv-{random.Random(i).getrandbits(64):x}-é" for i in range(400)]
    for key in keys:
        producer.produce(topic, value=b"x", key=key.encode(), on_delivery=on_delivery)
    assert producer.flush(30) == 0
    assert placed == {k: partition_for(k, 8) for k in keys}
    assert len(set(placed.values())) == 8


def test_delivery_errors_are_counted_and_logged_rate_limited_never_raised(
    settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    ensure_topics(settings)  # 8 partitions; the emitter believes there are 12
    emitter = Emitter(settings, "gw-err", EmitterConfig(partitions=12, max_batch_events=50))
    keys = [f"k{i}" for i in range(400)]
    for _ in range(5):
        for key in keys:
            assert emitter.emit(key, 1)
        time.sleep(0.06)
    emitter.close(30)
    on_missing = sum(5 for k in keys if partition_for(k, 12) >= 8)
    stats = emitter.stats()
    assert on_missing > 0
    assert stats.events_failed == on_missing
    assert stats.events_sent == 5 * len(keys) - on_missing
    assert stats.delivery_errors >= 4
    assert stats.buffered == 0
    lines = [r.getMessage() for r in caplog.records if "not delivered" in r.getMessage()]
    kinds = Counter(line.split(": ")[2] for line in lines)  # "... not delivered: <kind>: <text>"
    assert kinds, lines
    assert all(count == 1 for count in kinds.values()), lines  # one line per kind in 10 s
    suppressed = [
        r.getMessage() for r in caplog.records if "not logged (rate limit)" in r.getMessage()
    ]
    assert suppressed  # the rest is summarised at close
    assert len(_events_on_topic(settings)) == stats.events_sent


def test_a_missing_topic_is_a_clear_error(settings: Settings) -> None:
    with pytest.raises(CacheRouteError, match="cacheroute topics ensure"):
        Emitter(settings, "gw-none")


def test_an_event_reaches_kafka_within_the_latency_budget(settings: Settings) -> None:
    ensure_topics(settings)
    with Emitter(settings, "gw-lat") as emitter:
        emitter.emit("warm-up", 1)  # the first record waits for the producer's connection
        assert emitter.flush(30)
        start = time.monotonic()
        emitter.emit("k", 1)
        while emitter.stats().events_sent < 2 and time.monotonic() - start < 5:
            time.sleep(0.002)
        elapsed = time.monotonic() - start
    assert emitter.stats().events_sent == 2
    assert elapsed < 0.5, elapsed  # typically ~60 ms (50 ms linger); generous on a busy machine


def test_summary_mode_end_to_end(settings: Settings) -> None:
    ensure_topics(settings)
    with Emitter(settings, "gw-sum", EmitterConfig(mode="summary", tick_ms=200)) as emitter:
        for i in range(3_000):
            emitter.emit(f"k{i % 300}", 2)
            if i % 1000 == 999:
                time.sleep(0.25)
    summaries = [
        (p, b)
        for p, recs in _read_all(settings).items()
        for _, b in recs
        if isinstance(b, RequestSummary)
    ]
    assert sum(sum(s.counts) for _, s in summaries) == 3_000
    assert sum(sum(s.prompt_tokens_sum) for _, s in summaries) == 6_000
    assert all(partition_for(k, 8) == p for p, s in summaries for k in s.keys)
    assert emitter.stats().events_sent == 3_000
