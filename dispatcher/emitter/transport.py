"""The emitter's contact surface with Kafka: the producer it needs, and the topic's partition count.

Typed against a small Protocol so tests and benchmarks can stand in a fake producer; only the
methods the emitter calls are named.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from confluent_kafka import KafkaError, KafkaException, Message

from cacheroute.errors import CacheRouteError
from cacheroute.settings import Settings
from cacheroute.topics import make_admin

__all__ = ["DeliveryCallback", "ProducerLike", "discover_partitions"]

DeliveryCallback = Callable[[KafkaError | None, Message], None]
"""librdkafka's delivery report: (error or None, message)."""


class ProducerLike(Protocol):
    """The part of confluent-kafka's Producer the emitter uses."""

    def produce(
        self,
        topic: str,
        *,
        value: bytes | None = None,
        key: bytes | None = None,
        partition: int = -1,
        on_delivery: DeliveryCallback | None = None,
    ) -> None: ...

    def poll(self, timeout: float = -1) -> int: ...

    def flush(self, timeout: float = -1) -> int: ...


def discover_partitions(settings: Settings, topic: str, *, timeout: float = 10.0) -> int:
    """Partition count of `topic` from cluster metadata; a clear CacheRouteError if it is missing.

    Reads the metadata of all topics (never of just this one, which could auto-create it on a
    broker that allows that), so a missing topic is reported instead of silently created with the
    broker's default partition count — which would map keys differently from the streams agent.
    """
    admin = make_admin(settings)
    try:
        meta = admin.list_topics(timeout=timeout)
    except KafkaException as exc:
        raise CacheRouteError(
            f"no Kafka broker answers at {settings.bootstrap} ({exc}); start one with "
            "`cacheroute kafka start` or set CACHEROUTE_BOOTSTRAP, or give "
            "EmitterConfig(partitions=...)",
            retriable=True,
        ) from exc
    found = meta.topics.get(topic)
    if found is None or found.error is not None or not found.partitions:
        raise CacheRouteError(
            f"topic {topic!r} does not exist at {settings.bootstrap}; create it with "
            "`cacheroute topics ensure`"
        )
    return len(found.partitions)
