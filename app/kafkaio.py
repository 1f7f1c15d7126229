"""Thin confluent-kafka adapters shared by every CacheRoute process.

Client configs are built in one place so every producer is idempotent and compressed, and
confluent-kafka's `Message` is converted to our own frozen `KafkaRecord` at the edge, so code
further in never depends on the vendor type.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from cacheroute.errors import CacheRouteError
from cacheroute.settings import Settings

__all__ = [
    "KafkaRecord",
    "consumer_config",
    "produce_sync",
    "producer_config",
    "read_partition",
    "to_record",
]


@dataclass(frozen=True, slots=True)
class KafkaRecord:
    """One Kafka record, free of vendor types."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp_ms: int
    headers: tuple[tuple[str, bytes], ...] = ()

    def header(self, name: str) -> bytes | None:
        """The first header called `name`, or None."""
        return next((v for k, v in self.headers if k == name), None)

    @property
    def where(self) -> str:
        """`topic[partition]@offset`, the form every log line and error uses."""
        return f"{self.topic}[{self.partition}]@{self.offset}"


def to_record(msg: Message) -> KafkaRecord:
    """Convert a confluent-kafka message (that carries no error) to a KafkaRecord."""
    _, ts = msg.timestamp()
    return KafkaRecord(
        topic=msg.topic() or "",
        partition=msg.partition() or 0,
        offset=msg.offset() or 0,
        key=msg.key(),
        value=msg.value(),
        timestamp_ms=ts,
        headers=_headers(msg),
    )


def _headers(msg: Message) -> tuple[tuple[str, bytes], ...]:
    raw = msg.headers() or []
    pairs = list(raw.items()) if isinstance(raw, dict) else list(raw)
    return tuple((k, v if isinstance(v, bytes) else (v or "").encode()) for k, v in pairs)


def producer_config(settings: Settings, **extra: Any) -> dict[str, Any]:
    """Idempotent (no duplicates or reordering on retry), zstd-compressed, small linger."""
    config: dict[str, Any] = {
        "bootstrap.servers": settings.bootstrap,
        "enable.idempotence": True,
        "acks": "all",
        "compression.type": "zstd",
        "linger.ms": 5,
        "log_level": 3,
    }
    config.update(extra)
    return config


def consumer_config(
    settings: Settings, group_id: str | None = None, **extra: Any
) -> dict[str, Any]:
    """A consumer that reads from the earliest offset and commits only when told to."""
    config: dict[str, Any] = {
        "bootstrap.servers": settings.bootstrap,
        "group.id": group_id or "cacheroute-reader",
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "enable.partition.eof": True,
        "log_level": 3,
    }
    config.update(extra)
    return config


def produce_sync(
    producer: Producer,
    topic: str,
    value: bytes | None,
    key: bytes | None = None,
    timeout: float = 30,
) -> KafkaRecord:
    """Produce one record and wait for its delivery report; return where it landed."""
    result: list[Message] = []
    errors: list[KafkaError] = []

    def on_delivery(err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            errors.append(err)
        else:
            result.append(msg)

    producer.produce(topic, value=value, key=key, on_delivery=on_delivery)
    remaining = producer.flush(timeout)
    if errors:
        raise CacheRouteError(f"delivery to {topic} failed: {errors[0]}", retriable=True)
    if remaining or not result:
        raise CacheRouteError(f"delivery to {topic} not confirmed in {timeout}s", retriable=True)
    return to_record(result[0])


def read_partition(
    settings: Settings,
    topic: str,
    partition: int = 0,
    *,
    start: int = 0,
    timeout: float = 30.0,
) -> list[KafkaRecord]:
    """Every record of one partition from `start` to the current end (for tools and tests)."""
    consumer = Consumer(consumer_config(settings, group_id=f"cacheroute-reader-{time.time_ns()}"))
    records: list[KafkaRecord] = []
    try:
        low, high = consumer.get_watermark_offsets(
            TopicPartition(topic, partition), timeout=timeout
        )
        if high <= max(low, start):
            return records
        consumer.assign([TopicPartition(topic, partition, max(start, low))])
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    break
                raise KafkaException(err)
            records.append(to_record(msg))
            if msg.offset() is not None and (msg.offset() or 0) >= high - 1:
                break
        else:
            raise CacheRouteError(f"reading {topic}[{partition}] timed out", retriable=True)
    finally:
        consumer.close()
    return records
