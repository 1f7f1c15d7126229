"""`produce_keyed` on the real broker: a queue far smaller than the records loses none, and each
key lands where a plain `produce` call per record puts it."""

from __future__ import annotations

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import NewTopic

from cacheroute.kafkaio import _produce_each, consumer_config, produce_keyed, producer_config
from cacheroute.settings import Settings
from cacheroute.topics import make_admin

pytestmark = pytest.mark.kafka

PARTITIONS = 4


def _topic(settings: Settings, name: str) -> str:
    topic = settings.topic_prefix + name
    admin = make_admin(settings)
    for fut in admin.create_topics([NewTopic(topic, PARTITIONS, 1)]).values():
        fut.result(timeout=30)
    return topic


def _read_all(
    settings: Settings, topic: str, expected: int
) -> list[tuple[bytes | None, bytes | None, int | None]]:
    consumer = Consumer(consumer_config(settings, group_id=topic + "-reader"))
    consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    out: list[tuple[bytes | None, bytes | None, int | None]] = []
    eof: set[int | None] = set()
    try:
        while len(eof) < PARTITIONS:
            for msg in consumer.consume(1000, 0.5):
                if msg.error():
                    eof.add(msg.partition())
                    continue
                out.append((msg.key(), msg.value(), msg.partition()))
    finally:
        consumer.close()
    assert len(out) == expected
    return out


def test_a_small_queue_loses_nothing_and_keys_land_as_with_produce(settings: Settings) -> None:
    keys = [f"tenant{i % 37}/conversation-{i}".encode() for i in range(6000)]
    values = [b"v%d" % i for i in range(6000)]
    small = producer_config(
        settings, partitioner="murmur2_random", **{"queue.buffering.max.messages": 500}
    )
    batched, single, fallback = (_topic(settings, n) for n in ("batched", "single", "fallback"))

    producer = Producer(small)
    produce_keyed(producer, batched, keys, values)  # 12 times the queue: must wait, not drop
    assert producer.flush(30) == 0
    reference = Producer(producer_config(settings, partitioner="murmur2_random"))
    for k, v in zip(keys, values, strict=True):
        reference.produce(single, key=k, value=v)
    assert reference.flush(30) == 0
    older = Producer(small)
    _produce_each(older, fallback, keys, values, 0.1)  # the path without produce_batch
    assert older.flush(30) == 0

    want = dict(zip(keys, values, strict=True))
    where = {k: p for k, _, p in _read_all(settings, single, len(keys))}
    for topic in (batched, fallback):
        got = _read_all(settings, topic, len(keys))
        assert {k: v for k, v, _ in got} == want
        assert {k: p for k, _, p in got} == where
    assert len(set(where.values())) == PARTITIONS
