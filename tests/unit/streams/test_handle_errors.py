"""One message whose handling raises never stops the messages after it (no Kafka).

Acks are manual: an exception escaping `StreamsRuntime.handle` would end the agent loop with the
message unacked, and the partition would stop there. Any exception other than the expected ones
(ClockError, SchemaError, BatchError) dead-letters the message with the reason "error: <type>",
and the worker carries on.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from cacheroute.schemas import KeyRate, RequestBatch, codec_for
from cacheroute.schemas.batch_scan import ScannedBatch
from cacheroute.streams import app as app_module
from cacheroute.streams.app import StreamsRuntime
from cacheroute.streams.state import PartitionState

from .fakes import T0, Producer, event, make_runtime, metric


class _Stream:
    def __init__(self) -> None:
        self.acked: list[int] = []

    async def ack(self, event: object) -> None:
        self.acked.append(event.message.offset)  # type: ignore[attr-defined]


def _runtime() -> tuple[StreamsRuntime, Producer, _Stream]:
    runtime, producer = make_runtime()
    stream = _Stream()
    runtime.stream = stream
    return runtime, producer, stream


def _batch(key: str, t: int, gw: str = "gw-0") -> RequestBatch:
    return RequestBatch(
        gateway_id=gw, seq=0, created_ms=t, keys=[key], event_time_ms=[t], prompt_tokens=[10]
    )


def test_a_message_whose_handling_raises_is_dead_lettered_and_the_next_ones_count(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    real_apply = PartitionState.apply_batch

    def apply_batch(self: PartitionState, batch: RequestBatch, offset: int, **kw: Any) -> Any:
        if batch.gateway_id == "gw-poison":
            raise KeyError("simulated")
        return real_apply(self, batch, offset, **kw)

    real_scanned = PartitionState.apply_scanned

    def apply_scanned(self: PartitionState, batch: ScannedBatch, offset: int, **kw: Any) -> Any:
        if batch.gateway_id == "gw-poison":  # the agent's usual path for such a batch
            raise KeyError("simulated")
        return real_scanned(self, batch, offset, **kw)

    monkeypatch.setattr(PartitionState, "apply_batch", apply_batch)
    monkeypatch.setattr(PartitionState, "apply_scanned", apply_scanned)
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
            runtime.handle(event(runtime, offset, batch))  # does not raise
    assert metric(runtime, "events_accepted") == 4  # all but the poisoned message's event
    assert metric(runtime, "batches_dead_lettered") == 1
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
    assert metric(runtime, "rates_emitted") == 2


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
        runtime.handle(event(runtime, 0, _batch("a", T0 + 100)))
        runtime.handle(event(runtime, 1, _batch("b", T0 + 200)))
    state = runtime.states[0]
    assert state.counts(T0)["a"] == 1
    assert state.counts(T0)["b"] == 1
    assert metric(runtime, "events_accepted") == 1  # the second message's report ran
    assert metric(runtime, "batches_dead_lettered") == 0
    assert not [s for s in producer.sent if s.topic == "unit.dead-letter"]
    assert "reporting its bad or late events failed" in caplog.text


def test_late_events_of_a_batch_read_from_its_bytes_are_dead_lettered_as_a_batch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A good batch takes the compiled reader's path; its late events still reach the dead-letter
    topic as a RequestBatch of just those events (the batch is decoded for that alone)."""

    def decoded_path(*args: Any, **kw: Any) -> Any:
        raise AssertionError("a good ASCII batch must not need the decoded path")

    monkeypatch.setattr(PartitionState, "apply_batch", decoded_path)
    runtime, producer, _ = _runtime()
    runtime.handle(event(runtime, 0, _batch("a", T0 + 100)))
    runtime.handle(event(runtime, 1, _batch("b", T0 + 9000)))  # the watermark passes T0's grace
    mixed = RequestBatch(
        gateway_id="gw-7",
        seq=1,
        created_ms=T0 + 9100,
        keys=["old", "new"],
        event_time_ms=[T0 + 200, T0 + 9050],
        prompt_tokens=[10, 20],
    )
    runtime.handle(event(runtime, 2, mixed))
    assert metric(runtime, "events_late") == 1
    assert metric(runtime, "events_accepted") == 3
    (dead,) = [s for s in producer.sent if s.topic == "unit.dead-letter"]
    late = codec_for(RequestBatch).decode(dead.value)
    assert (late.gateway_id, late.keys, late.event_time_ms) == ("gw-7", ["old"], [T0 + 200])
    assert b"late event(s) of gateway gw-7" in dead.headers["cacheroute.reason"]
