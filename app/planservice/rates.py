"""Reading the `rates` topic for the planner: every partition, from a look-back point in time.

The planner needs *all* keys, so it assigns every partition to itself instead of joining a group
(a group would split the partitions between the active planner and its standbys). Each instance,
active or standby, reads the whole stream and keeps its own smoothed rates, so a standby that takes
over plans at once from warm state. On start it seeks to `now - lookback` by record timestamp
(enough closed windows to prime the averages) rather than replaying the topic's whole retention.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from confluent_kafka import (
    OFFSET_END,
    TIMESTAMP_NOT_AVAILABLE,
    Consumer,
    KafkaError,
    KafkaException,
    TopicPartition,
)

from cacheroute.dispatcher.reader import drain
from cacheroute.errors import CacheRouteError
from cacheroute.kafkaio import consumer_config
from cacheroute.schemas import KeyRate, SchemaError, codec_for
from cacheroute.schemas.errors import format_location
from cacheroute.settings import Settings

__all__ = ["RatesBatch", "RatesSource"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RatesBatch:
    """Decoded records of one poll as (partition, record, Kafka timestamp ms or -1), and the
    undecodable ones (value, key, reason, where)."""

    rates: list[tuple[int, KeyRate, int]]
    garbage: list[tuple[bytes | None, bytes | None, str, str]]


class RatesSource:
    """All partitions of `rates`, read from `start_ms` on (see the module docstring)."""

    def __init__(self, settings: Settings, *, start_ms: int, client_id: str) -> None:
        self.topic = settings.topics["rates"]
        self._consumer = Consumer(
            consumer_config(
                settings,
                group_id="cacheroute-planner-rates",  # never joined or committed: assign only
                **{"enable.partition.eof": False, "client.id": client_id},
            )
        )
        try:
            meta = self._consumer.list_topics(self.topic, timeout=30)
        except KafkaException as exc:
            self._consumer.close()
            raise CacheRouteError(
                f"cannot read metadata of {self.topic} at {settings.bootstrap}: {exc}",
                retriable=True,
            ) from exc
        topic_meta = meta.topics.get(self.topic)
        if topic_meta is None or topic_meta.error is not None or not topic_meta.partitions:
            self._consumer.close()
            raise CacheRouteError(
                f"topic {self.topic} does not exist; create the topics with `cacheroute topics "
                "ensure`"
            )
        self.partitions = len(topic_meta.partitions)
        wanted = [TopicPartition(self.topic, p, start_ms) for p in range(self.partitions)]
        found = self._consumer.offsets_for_times(wanted, timeout=30)
        start = [
            TopicPartition(self.topic, tp.partition, tp.offset if tp.offset >= 0 else OFFSET_END)
            for tp in found
        ]
        self._consumer.assign(start)
        self._codec = codec_for(KeyRate)
        self._closed = False

    def poll(self, max_records: int, timeout: float) -> RatesBatch:
        """Up to `max_records` records, waiting at most `timeout` seconds for the first."""
        rates: list[tuple[int, KeyRate, int]] = []
        garbage: list[tuple[bytes | None, bytes | None, str, str]] = []
        for msg in drain(self._consumer, max_records, timeout):
            err = msg.error()
            if err is not None:
                if err.fatal():
                    raise CacheRouteError(f"reading {self.topic} failed: {err}")
                if err.code() != KafkaError._PARTITION_EOF:
                    log.debug("rates consumer: %s", err)
                continue
            partition = msg.partition() or 0
            offset = msg.offset() or 0
            try:
                rate = self._codec.decode(
                    msg.value(), topic=self.topic, partition=partition, offset=offset
                )
            except SchemaError as exc:
                where = format_location(self.topic, partition, offset)
                garbage.append((msg.value(), msg.key(), str(exc), where))
                continue
            kind, stamp = msg.timestamp()
            rates.append((partition, rate, stamp if kind != TIMESTAMP_NOT_AVAILABLE else -1))
        return RatesBatch(rates, garbage)

    def lag(self) -> int:
        """Records between the read position and the (cached) end of every partition."""
        total = 0
        positions = self._consumer.position(
            [TopicPartition(self.topic, p) for p in range(self.partitions)]
        )
        for tp in positions:
            _, high = self._consumer.get_watermark_offsets(tp, cached=True)
            if tp.offset >= 0 and high >= 0:
                total += max(0, high - tp.offset)
        return total

    def close(self) -> None:
        """Close the consumer."""
        if not self._closed:
            self._closed = True
            self._consumer.close()
