"""Shared set-up for the emitter's unit tests: a manually pumped emitter on fakes."""

from __future__ import annotations

from typing import Any

from cacheroute.dispatcher.emitter.config import EmitterConfig
from cacheroute.dispatcher.emitter.emitter import Emitter
from cacheroute.dispatcher.emitter.partitioner import partition_for
from cacheroute.schemas import RequestBatch, RequestSummary
from cacheroute.settings import Settings
from tests.unit.dispatcher.fakes import FakeClock, FakeProducer

__all__ = ["TOPIC", "batches", "keys_on", "make_emitter", "summaries"]

SETTINGS = Settings(topic_prefix="unit.")
TOPIC = "unit.requests"


def make_emitter(
    producer: FakeProducer | None = None, clock: FakeClock | None = None, **config: Any
) -> tuple[Emitter, FakeProducer, FakeClock]:
    """An emitter without its thread (the test calls `pump`), on a fake producer and clock."""
    producer = producer if producer is not None else FakeProducer()
    clock = clock if clock is not None else FakeClock()
    config.setdefault("partitions", 4)
    emitter = Emitter(
        SETTINGS,
        "gw-1",
        EmitterConfig(background=False, **config),
        producer=producer,
        clock_ms=clock,
    )
    return emitter, producer, clock


def keys_on(partition: int, partitions: int, n: int, prefix: str = "key") -> list[str]:
    """`n` distinct keys that Kafka's partitioner puts on `partition`."""
    out: list[str] = []
    i = 0
    while len(out) < n:
        key = f"{prefix}-{i}"
        if partition_for(key, partitions) == partition:
            out.append(key)
        i += 1
    return out


def batches(producer: FakeProducer, *, heartbeats: bool = False) -> list[RequestBatch]:
    """The RequestBatch records produced so far (heartbeats left out unless asked for)."""
    out = [r for r in producer.records() if isinstance(r, RequestBatch)]
    return out if heartbeats else [b for b in out if len(b)]


def summaries(producer: FakeProducer) -> list[RequestSummary]:
    return [r for r in producer.records() if isinstance(r, RequestSummary)]
