"""Column buffers, the seal and heartbeat rules, and the batch records built from columns."""

from __future__ import annotations

from array import array

from cacheroute.dispatcher.emitter.columns import (
    NO_HASHES,
    ColumnBuffer,
    Columns,
    batch_from,
    heartbeat_due,
    seal_due,
)
from cacheroute.schemas import RequestBatch, RequestEvent, codec_for


def _fill(buf: ColumnBuffer, n: int, *, t0: int = 1000) -> None:
    for i in range(n):
        buf.keys.append(f"k{i}")
        buf.event_time_ms.append(t0 + i)
        buf.prompt_tokens.append(10 + i)
        buf.prefix_tokens.append(-1)
        buf.cached_tokens.append(-1)
        buf.destinations.append("")
        buf.hashes.append(NO_HASHES)


def test_seal_due_by_count_or_linger_never_when_empty() -> None:
    rule = {"max_events": 100, "linger_ms": 50}
    assert not seal_due(0, 0, 10_000, **rule)
    assert not seal_due(99, 1000, 1049, **rule)
    assert seal_due(99, 1000, 1050, **rule)
    assert seal_due(100, 1000, 1000, **rule)
    assert seal_due(250, 1000, 1000, **rule)
    assert seal_due(1, 1000, 990, **rule)  # the clock stepped back: do not hold events


def test_heartbeat_only_for_idle_partitions_that_hold_nothing() -> None:
    assert not heartbeat_due(1000, 1999, heartbeat_ms=1000, holding=False)
    assert heartbeat_due(1000, 2000, heartbeat_ms=1000, holding=False)
    assert not heartbeat_due(1000, 5000, heartbeat_ms=1000, holding=True)


def test_take_hands_over_the_lists_and_leaves_an_empty_buffer() -> None:
    buf = ColumnBuffer()
    _fill(buf, 3)
    keys = buf.keys
    cols = buf.take()
    assert cols.keys is keys
    assert len(cols) == 3
    assert len(buf) == 0
    assert buf.keys is not keys
    _fill(buf, 1)
    assert len(cols) == 3  # later appends do not reach what was taken


def test_batch_without_optional_values_sends_null_columns() -> None:
    buf = ColumnBuffer()
    _fill(buf, 4)
    batch = batch_from("gw", 7, 5000, buf.take())
    assert batch == RequestBatch(
        gateway_id="gw",
        seq=7,
        created_ms=5000,
        keys=["k0", "k1", "k2", "k3"],
        event_time_ms=[1000, 1001, 1002, 1003],
        prompt_tokens=[10, 11, 12, 13],
    )


def test_batch_with_some_optional_values_keeps_sentinels_and_round_trips() -> None:
    cols = Columns(
        keys=["a", "b", "c"],
        event_time_ms=[1, 2, 3],
        prompt_tokens=[5, 6, 7],
        prefix_tokens=[-1, 4, -1],
        cached_tokens=[-1, -1, 2],
        destinations=["", "d1", ""],
        hashes=[NO_HASHES, array("q", [2**63 - 1, -(2**63)]), (5,)],
    )
    batch = batch_from("gw", 0, 10, cols)
    assert batch.prefix_tokens == [-1, 4, -1]
    assert batch.cached_tokens == [-1, -1, 2]
    assert batch.destinations == ["", "d1", ""]
    assert batch.prefix_block_hashes == [[], [2**63 - 1, -(2**63)], [5]]
    codec = codec_for(RequestBatch)
    decoded = codec.decode(codec.encode(batch))
    assert decoded == batch
    assert decoded.events()[1] == RequestEvent(
        key="b",
        event_time_ms=2,
        gateway_id="gw",
        prompt_tokens=6,
        prefix_tokens=4,
        prefix_block_hashes=[2**63 - 1, -(2**63)],
        destination="d1",
        cached_tokens=None,
    )


def test_created_ms_is_never_older_than_an_event_in_the_batch() -> None:
    buf = ColumnBuffer()
    _fill(buf, 3, t0=9000)  # event times ahead of the emitter clock
    assert batch_from("gw", 0, 5000, buf.take()).created_ms == 9002
    empty = Columns([], [], [], [], [], [], [])
    heartbeat = batch_from("gw", 3, 5000, empty)
    assert heartbeat.created_ms == 5000
    assert len(heartbeat) == 0


def test_slice_copies_one_range_of_every_column() -> None:
    buf = ColumnBuffer()
    _fill(buf, 5)
    part = buf.take().slice(1, 3)
    assert part.keys == ["k1", "k2"]
    assert part.event_time_ms == [1001, 1002]
    assert part.hashes == [NO_HASHES, NO_HASHES]
