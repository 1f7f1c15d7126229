"""Stand-ins for what Faust hands `StreamsRuntime.handle` (no Kafka): a message, its event, the
table, a producer that records what was sent, and the source stream that acks."""

from __future__ import annotations

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


@dataclass
class Table:
    data: dict[bytes, bytes] = field(default_factory=dict)

    def send_changelog(self, *args: Any, **kwargs: Any) -> None:
        pass


@dataclass
class Sent:
    topic: str
    value: bytes | None
    headers: dict[str, bytes]


class Producer:
    def __init__(self) -> None:
        self.sent: list[Sent] = []

    def produce(
        self,
        topic: str,
        value: bytes | None = None,
        key: bytes | None = None,
        headers: list[tuple[str, bytes]] | None = None,
    ) -> None:
        self.sent.append(Sent(topic, value, dict(headers or [])))

    def poll(self, timeout: float) -> int:
        return 0

    def flush(self, timeout: float) -> int:
        return 0


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


def event(runtime: StreamsRuntime, offset: int, batch: RequestBatch) -> Event:
    """Partition 0's message at `offset` holding `batch`."""
    message = Message(0, offset, runtime.source_topic, timestamp=T0 / 1000 + 5)
    return Event(message, codec_for(RequestBatch).encode(batch))


def metric(runtime: StreamsRuntime, name: str) -> float:
    """A streams counter's value (0 if never incremented)."""
    return runtime.metrics.registry.get_sample_value(f"cacheroute_streams_{name}_total") or 0.0
