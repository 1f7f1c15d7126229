"""One message whose handling raises never stops the messages after it (no Kafka).

Acks are manual: an exception escaping `StreamsRuntime.handle` would end the agent loop with the
message unacked, and the partition would stop there. Any exception other than the expected ones
(ClockError, SchemaError, BatchError) dead-letters the message with the reason "error: <type>",
and the worker carries on.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

import pytest

from cacheroute.schemas import KeyRate, RequestBatch, codec_for
from cacheroute.settings import Settings
from cacheroute.streams import app as app_module
from cacheroute.streams.app import StreamsOptions, StreamsRuntime
from cacheroute.streams.config import StreamConfig
from cacheroute.streams.metrics import StreamMetrics
from cacheroute.streams.state import PartitionState

CFG = StreamConfig(window_ms=1000, grace_ms=200, reorder_ms=100, buckets=4)
T0 = 1_700_000_000_000  # a window start, in the past of any worker clock


@dataclass
class _Message:
    partition: int
    offset: int
    topic: str
    timestamp: float
    key: bytes = b"gw-0"
    timestamp_type: int = 0


@dataclass
class _Event:
    message: _Message
    value: bytes


@dataclass
class _Table:
    data: dict[bytes, bytes] = field(default_factory=dict)

    def send_changelog(self, *args: Any, **kwargs: Any) -> None:
        pass


@dataclass
class _Sent:
    topic: str
    value: bytes | None
    headers: dict[str, bytes]


class _Producer:
    def __init__(self) -> None:
        self.sent: list[_Sent] = []

    def produce(
        self,
        topic: str,
        value: bytes | None = None,
        key: bytes | None = None,
        headers: list[tuple[str, bytes]] | None = None,
    ) -> None:
        self.sent.append(_Sent(topic, value, dict(headers or [])))

    def poll(self, timeout: float) -> int:
        return 0

    def flush(self, timeout: float) -> int:
        return 0


class _Stream:
    def __init__(self) -> None:
        self.acked: list[int] = []

    async def ack(self, event: _Event) -> None:
        self.acked.append(event.message.offset)


def _runtime() -> tuple[StreamsRuntime, _Producer, _Stream]:
    producer = _Producer()
    runtime = StreamsRuntime(
        settings=Settings(topic_prefix="unit."),
        config=CFG,
        options=StreamsOptions(),
        table=_Table(),
        metrics=StreamMetrics.create(),
        producer=producer,  # type: ignore[arg-type]
    )
    stream = _Stream()
    runtime.stream = stream
    return runtime, producer, stream


def _batch(key: str, t: int, gw: str = "gw-0") -> RequestBatch:
    return RequestBatch(
        gateway_id=gw, seq=0, created_ms=t, keys=[key], event_time_ms=[t], prompt_tokens=[10]
    )


def _event(runtime: StreamsRuntime, offset: int, batch: RequestBatch) -> _Event:
    message = _Message(0, offset, runtime.source_topic, timestamp=T0 / 1000 + 5)
    return _Event(message, codec_for(RequestBatch).encode(batch))


def _metric(runtime: StreamsRuntime, name: str) -> float:
    return runtime.metrics.registry.get_sample_value(f"cacheroute_streams_{name}_total") or 0.0


def test_a_message_whose_handling_raises_is_dead_lettered_and_the_next_ones_count(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    real_apply = PartitionState.apply_batch

    def apply_batch(self: PartitionState, batch: RequestBatch, offset: int, **kw: Any) -> Any:
        if batch.gateway_id == "gw-poison":
            raise KeyError("simulated")
        return real_apply(self, batch, offset, **kw)

    monkeypatch.setattr(PartitionState, "apply_batch", apply_batch)
    runtime, producer, stream = _runtime()
    messages = [
        _batch("a", T0 + 100),
        _batch("x", T0 + 200, gw="gw-poison"),
        _batch("b", T0 + 300),
        _batch("a", T0 + 400),
        _batch("c", T0 + 1300),  # the watermark passes window T0 + grace: it closes
    ]
    with caplog.at_level(logging.ERROR, logger=app_module.__name__):
        for offset, batch in enumerate(messages):
            runtime.handle(_event(runtime, offset, batch))  # does not raise
    assert _metric(runtime, "events_accepted") == 4  # all but the poisoned message's event
    assert _metric(runtime, "batches_dead_lettered") == 1
    (dead,) = [s for s in producer.sent if s.topic == "unit.dead-letter"]
    assert dead.headers["cacheroute.reason"] == b"error: KeyError: 'simulated'"
    assert dead.headers["cacheroute.stage"] == b"streams"
    assert dead.value == codec_for(RequestBatch).encode(messages[1])  # the message as it came
    assert "handling it raised KeyError" in caplog.text
    # the flush emits window T0's rates without the poisoned event and acks every message
    asyncio.run(runtime.flush(0))
    assert stream.acked == [0, 1, 2, 3, 4]
    decode = codec_for(KeyRate).decode
    rates = [decode(s.value) for s in producer.sent if s.topic == "unit.rates" and s.value]
    assert {(r.key, r.window_start_ms, r.count) for r in rates} == {("a", T0, 2), ("b", T0, 1)}
    assert _metric(runtime, "rates_emitted") == 2


def test_a_failure_while_reporting_an_applied_message_does_not_stop_the_next(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The events of the message are counted already; it is logged, not dead-lettered."""
    runtime, producer, _ = _runtime()
    real_report = StreamsRuntime._report
    calls = 0

    def report(self: StreamsRuntime, *args: Any) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("simulated")
        real_report(self, *args)

    monkeypatch.setattr(StreamsRuntime, "_report", report)
    with caplog.at_level(logging.ERROR, logger=app_module.__name__):
        runtime.handle(_event(runtime, 0, _batch("a", T0 + 100)))
        runtime.handle(_event(runtime, 1, _batch("b", T0 + 200)))
    state = runtime.states[0]
    assert state.windows[T0]["a"].count == 1
    assert state.windows[T0]["b"].count == 1
    assert _metric(runtime, "events_accepted") == 1  # the second message's report ran
    assert _metric(runtime, "batches_dead_lettered") == 0
    assert not [s for s in producer.sent if s.topic == "unit.dead-letter"]
    assert "reporting its bad or late events failed" in caplog.text
