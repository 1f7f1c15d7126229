"""Stand-ins for what Faust hands `StreamsRuntime.handle` (no Kafka): a message, its event, the
table, a producer that records what was sent, and the source stream that acks."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cacheroute.schemas import RequestBatch, codec_for
from cacheroute.settings import Settings
from cacheroute.streams.app import StreamsOptions, StreamsRuntime
from cacheroute.streams.config import StreamConfig
from cacheroute.streams.metrics import StreamMetrics

CFG = StreamConfig(window_ms=1000, grace_ms=200, reorder_ms=100, buckets=4)
T0 = 1_700_000_000_000  # a window start, in the past of any worker clock


@dataclass
class Message:
    partition: int
    offset: int
    topic: str
    timestamp: float
    key: bytes = b"gw-0"
    timestamp_type: int = 0


@dataclass
class Event:
    message: Message
    value: bytes


CHANGELOG = "unit-streams-rate-windows-changelog"


@dataclass
class Topic:
    name: str

    def get_topic_name(self) -> str:
        return self.name


@dataclass
class Table:
    data: dict[bytes, bytes] = field(default_factory=dict)
    changelog_topic: Topic = field(default_factory=lambda: Topic(CHANGELOG))


@dataclass
class Sent:
    topic: str
    value: bytes | None
    headers: dict[str, bytes]
    key: bytes | None = None
    partition: int | None = None


@dataclass
class Delivered:
    """A delivery report's message (what `on_delivery` reads)."""

    raw_key: bytes | None

    def key(self) -> bytes | None:
        return self.raw_key


class Producer:
    """Records what was produced; a key in `fail` is reported undelivered once, at a flush."""

    def __init__(self) -> None:
        self.sent: list[Sent] = []
        self.fail: set[bytes] = set()
        self.undelivered: list[int] = []
        """What the next flushes return (records still queued), in order; then 0."""
        self._reports: list[tuple[Callable[[Any, Any], None], bytes | None]] = []
        self.flushes = 0
        """How many times `flush` waited for the broker."""
        self.gate: threading.Event | None = None
        """If set, `flush` waits for it (a broker that is slow to acknowledge)."""
        self.waiting = threading.Event()
        """Set while a `flush` waits at the gate."""

    def produce(
        self,
        topic: str,
        value: bytes | None = None,
        key: bytes | None = None,
        headers: list[tuple[str, bytes]] | None = None,
        *,
        partition: int | None = None,
        on_delivery: Callable[[Any, Any], None] | None = None,
    ) -> None:
        self.sent.append(Sent(topic, value, dict(headers or []), key, partition))
        if on_delivery is not None:
            self._reports.append((on_delivery, key))

    def poll(self, timeout: float) -> int:
        return 0

    def flush(self, timeout: float) -> int:
        self.flushes += 1
        if self.gate is not None:
            self.waiting.set()
            self.gate.wait(10)
            self.waiting.clear()
        reports, self._reports = self._reports, []
        for callback, key in reports:
            failed = key in self.fail
            self.fail.discard(key)  # each listed key fails once
            callback("delivery failed" if failed else None, Delivered(key))
        return self.undelivered.pop(0) if self.undelivered else 0

    def outside_changelog(self) -> list[Sent]:
        """What went anywhere but the table's changelog (rates, dead letters)."""
        return [s for s in self.sent if s.topic != CHANGELOG]

    def changelog(self) -> list[tuple[bytes | None, bytes | None]]:
        """(key, value) of every changelog record, in order."""
        return [(s.key, s.value) for s in self.sent if s.topic == CHANGELOG]


def make_runtime() -> tuple[StreamsRuntime, Producer]:
    """A runtime over `CFG` with a fresh table, metrics and recording producer."""
    producer = Producer()
    runtime = StreamsRuntime(
        settings=Settings(topic_prefix="unit."),
        config=CFG,
        options=StreamsOptions(),
        table=Table(),
        metrics=StreamMetrics.create(),
        producer=producer,  # type: ignore[arg-type]
    )
    return runtime, producer


def event(runtime: StreamsRuntime, offset: int, batch: RequestBatch, partition: int = 0) -> Event:
    """The message of `partition` (0 unless told) at `offset` holding `batch`."""
    message = Message(partition, offset, runtime.source_topic, timestamp=T0 / 1000 + 5)
    return Event(message, codec_for(RequestBatch).encode(batch))


def metric(runtime: StreamsRuntime, name: str) -> float:
    """A streams counter's value (0 if never incremented)."""
    return runtime.metrics.registry.get_sample_value(f"cacheroute_streams_{name}_total") or 0.0


def gw0_batch(events: list[tuple[str, int]], created: int) -> RequestBatch:
    """A batch of gateway `gw-0` sealed at `created`: (key, event time) each, prompts of 10."""
    return RequestBatch(
        gateway_id="gw-0",
        seq=0,
        created_ms=created,
        keys=[k for k, _ in events],
        event_time_ms=[t for _, t in events],
        prompt_tokens=[10] * len(events),
    )
