"""The plans topic is compacted for real: only the latest value per key survives; tombstones delete.

Kafka compacts only closed segments, so the test uses a 1-second segment.ms and keeps writing a
filler record each second (each write after segment.ms rolls a new segment) until the cleaner — woken
every second by the local broker's `log.cleaner.backoff.ms` — has done its work, or 90 s pass.
"""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Producer

from cacheroute.kafkaio import KafkaRecord, produce_sync, producer_config, read_partition
from cacheroute.settings import Settings
from cacheroute.topics import ensure_topics

pytestmark = pytest.mark.kafka


def _by_key(records: list[KafkaRecord]) -> dict[bytes, list[bytes | None]]:
    out: dict[bytes, list[bytes | None]] = {}
    for r in records:
        out.setdefault(r.key or b"", []).append(r.value)
    return out


def test_plans_topic_actually_compacts(settings: Settings) -> None:
    fast = settings.with_overrides(plans_segment_ms=1000, plans_delete_retention_ms=1000)
    ensure_topics(fast)
    topic = fast.topics["plans"]
    producer = Producer(producer_config(fast))
    for i in range(200):
        producer.produce(topic, key=b"chunk-0000", value=b"v%d" % i)
        producer.produce(topic, key=b"chunk-0001", value=b"gone-%d" % i)
    producer.produce(topic, key=b"chunk-0001", value=None)  # tombstone
    assert producer.flush(30) == 0

    deadline = time.monotonic() + 90
    filler = 0
    while True:
        time.sleep(1.1)
        produce_sync(producer, topic, b"f%d" % filler, key=b"filler")
        filler += 1
        keys = _by_key(read_partition(fast, topic))
        if keys.get(b"chunk-0000") == [b"v199"] and b"chunk-0001" not in keys:
            break
        if time.monotonic() > deadline:
            summary = {k: len(v) for k, v in keys.items()}
            pytest.fail(f"not compacted after 90 s; records per key: {summary}")
    # A fresh consumer sees exactly one record for the live key, none for the deleted one.
    assert keys[b"chunk-0000"] == [b"v199"]
    assert b"chunk-0001" not in keys
