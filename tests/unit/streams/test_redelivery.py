"""A message delivered twice to the same worker is applied once (no Kafka).

Faust (0.15) resumes a partition after a rebalance by seeking it to its committed offset while its
consumer is already running, so the agent can get records it has already applied again. Seen in
tests/reliability/test_skewed_clocks.py: re-delivered events of closed windows counted as late,
and records cleared from Faust's buffers after the seek never counted at all.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from cacheroute.schemas import RequestBatch
from cacheroute.settings import Settings
from cacheroute.streams.app import StreamsOptions, create_app
from cacheroute.streams.state import PartitionState

from .fakes import CFG, T0, event, make_runtime, metric

Y2100 = 4_102_444_800_000


def test_first_delivery_is_true_once_per_offset_in_order() -> None:
    s = PartitionState(0, CFG)
    assert [s.first_delivery(o) for o in (5, 6, 6, 4, 7, 9, 8, 9)] == [
        True,
        True,
        False,
        False,
        True,
        True,
        False,
        False,
    ]


def test_a_restored_state_still_takes_the_replay_path_for_old_offsets() -> None:
    s = PartitionState(0, CFG)
    s.first_delivery(10)
    s.apply_batch(_batch([("a", T0 + 100)], T0 + 150), 10)
    entries = [(k, v) for k, v in s.flush().writes if v is not None]
    restored = PartitionState.restore(0, CFG, entries)
    assert restored.first_delivery(10)  # first time this object sees it: judged as a replay
    result = restored.apply_batch(_batch([("a", T0 + 100)], T0 + 150), 10)
    assert (result.accepted, result.replayed) == (0, 1)


def _batch(events: list[tuple[str, int]], created: int, gw: str = "gw-0") -> RequestBatch:
    return RequestBatch(
        gateway_id=gw,
        seq=0,
        created_ms=created,
        keys=[k for k, _ in events],
        event_time_ms=[t for _, t in events],
        prompt_tokens=[10] * len(events),
    )


def test_a_redelivered_message_is_skipped_whole_and_acked() -> None:
    runtime, producer = make_runtime()
    messages = [
        _batch([("a", T0 + 100), ("b", T0 + 200)], T0 + 250),
        _batch([], Y2100, gw="gw-hostile"),  # dead-lettered once, not once per delivery
        _batch([("a", T0 + 900)], T0 + 950),
        _batch([], T0 + 1300),  # closes window T0
    ]
    for offset, batch in enumerate(messages):
        runtime.handle(event(runtime, offset, batch))
    asyncio.run(runtime.flush(0))
    first = [(s.topic, s.value) for s in producer.outside_changelog()]
    assert metric(runtime, "events_accepted") == 3
    # a consumer seek re-delivers all of them: nothing counts again, nothing is late
    for offset, batch in enumerate(messages):
        runtime.handle(event(runtime, offset, batch))
    assert len(runtime.pending[0]) == len(messages)  # re-deliveries are acked too
    asyncio.run(runtime.flush(0))
    assert metric(runtime, "messages_redelivered") == len(messages)
    assert metric(runtime, "batches") == len(messages)
    assert metric(runtime, "events_accepted") == 3
    assert metric(runtime, "events_late") == 0
    assert metric(runtime, "events_replayed") == 0
    assert metric(runtime, "batches_dead_lettered") == 1
    assert [
        (s.topic, s.value) for s in producer.outside_changelog()
    ] == first  # no second dead letter, no second rate
    # the next new message counts as usual
    runtime.handle(event(runtime, 4, _batch([("a", T0 + 1400)], T0 + 1450)))
    assert metric(runtime, "events_accepted") == 4


def test_an_open_window_does_not_count_a_redelivered_message_twice() -> None:
    runtime, _ = make_runtime()
    batch = _batch([("a", T0 + 100)], T0 + 150)
    runtime.handle(event(runtime, 0, batch))
    runtime.handle(event(runtime, 0, batch))
    state = runtime.states[0]
    assert state.counts(T0)["a"] == 1
    assert (state.accepted_total, state.replayed_total, state.late_total) == (1, 0, 0)


def test_stream_delivery_waits_while_faust_resumes_partitions(tmp_path: Path) -> None:
    """`on_rebalance_complete` (sent before Faust resumes and seeks the source partitions)
    suspends flow control; Faust resumes it itself after the seek, clearing its buffers first."""
    settings = Settings(topic_prefix="unit.", home=tmp_path)
    app, _ = create_app(settings, CFG, StreamsOptions(datadir=tmp_path / "data"))

    async def rebalance() -> tuple[bool, bool]:
        app.flow_control.resume()  # as Faust's recovery leaves it, having read the changelog
        before = app.flow_control.is_active()
        await app.on_rebalance_complete.send()
        return before, app.flow_control.is_active()

    assert asyncio.run(rebalance()) == (True, False)
