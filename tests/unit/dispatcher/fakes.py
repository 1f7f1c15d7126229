"""Test doubles: for the emitter, a producer that keeps what it is given and a settable clock; for
the dispatcher, a plan with just the parts `Dispatcher.apply_plan` and `table_from_plan` read."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np
from confluent_kafka import KafkaError, Message

from cacheroute.schemas import RequestBatch, RequestSummary, decode_any

__all__ = ["FakeClock", "FakePlan", "FakeProducer", "Produced", "fake_plan"]

DeliveryCallback = Callable[[KafkaError | None, Message], None]


@dataclass
class FakeClock:
    """Milliseconds that move only when a test says so."""

    now: int = 1_700_000_000_000

    def __call__(self) -> int:
        return self.now

    def advance(self, ms: int) -> int:
        self.now += ms
        return self.now


@dataclass(frozen=True)
class Produced:
    """One record the emitter produced."""

    topic: str
    partition: int
    key: bytes | None
    value: bytes

    def decode(self) -> RequestBatch | RequestSummary:
        record = decode_any(self.value)
        assert isinstance(record, RequestBatch | RequestSummary)
        return record


@dataclass
class FakeProducer:
    """Stands in for confluent-kafka's Producer.

    Delivery reports are held until `poll`/`flush`, like librdkafka's; `fail_with` makes them
    errors, `buffer_errors` makes the next N `produce` calls raise BufferError (queue full), and
    `produce_error` makes `produce` raise it (e.g. a KafkaException for an unknown partition).
    """

    fail_with: KafkaError | None = None
    buffer_errors: int = 0
    produce_error: Exception | None = None
    produced: list[Produced] = field(default_factory=list)
    _reports: list[tuple[DeliveryCallback | None, KafkaError | None]] = field(default_factory=list)

    def produce(
        self,
        topic: str,
        *,
        value: bytes | None = None,
        key: bytes | None = None,
        partition: int = -1,
        on_delivery: DeliveryCallback | None = None,
    ) -> None:
        if self.buffer_errors > 0:
            self.buffer_errors -= 1
            raise BufferError("Local: Queue full")
        if self.produce_error is not None:
            raise self.produce_error
        assert value is not None
        self.produced.append(Produced(topic, partition, key, value))
        self._reports.append((on_delivery, self.fail_with))

    def poll(self, timeout: float = -1) -> int:
        reports, self._reports = self._reports, []
        for callback, err in reports:
            if callback is not None:
                callback(err, None)  # type: ignore[arg-type]  # the emitter ignores the message
        return len(reports)

    def flush(self, timeout: float = -1) -> int:
        self.poll(0)
        return 0

    def records(self) -> list[RequestBatch | RequestSummary]:
        return [p.decode() for p in self.produced]

    def __len__(self) -> int:
        return len(self._reports)


@dataclass
class FakePlan:
    """The parts of a planner Plan that `Dispatcher.apply_plan` reads."""

    version: int
    created_ms: int
    keys: tuple[str, ...]
    offsets: np.ndarray
    targets: np.ndarray
    destinations: tuple[SimpleNamespace, ...]
    params: SimpleNamespace


def fake_plan(
    version: int, pairs: list[tuple[str, list[int]]], names: list[str], sep: str | None = "/"
) -> FakePlan:
    """A plan admitting `pairs` (key, destination indices into `names`) with sibling separator
    `sep` (None: no sibling groups)."""
    sizes = [len(d) for _, d in pairs]
    return FakePlan(
        version,
        int(time.time() * 1000),
        tuple(k for k, _ in pairs),
        np.concatenate(([0], np.cumsum(sizes))).astype(np.int64),
        np.array([t for _, d in pairs for t in d], dtype=np.int64),
        tuple(SimpleNamespace(name=n) for n in names),
        SimpleNamespace(group_separator=sep, control_interval_s=60.0),
    )
