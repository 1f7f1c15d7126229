"""The worker writes its table changelog itself and acks source messages only once it is durable.

Faust's own changelog path (`Table.send_changelog`) buffers the sends, and its commit waits for that
buffer at most 0.1 s without progress, so a busy worker could commit offsets ahead of its state; a
SIGKILL then lost counts (tests/reliability/test_malformed_flood.py saw a window restored with 202
of its 1018 events on CI). These tests pin the order and the retry rules, with no Kafka.
"""

from __future__ import annotations

import asyncio

from cacheroute.streams.state import PartitionState

from .fakes import CFG, CHANGELOG, T0, event, make_runtime
from .fakes import gw0_batch as _batch


class Acks:
    """A stand-in for Faust's manual-ack stream: remembers which offsets were acked."""

    def __init__(self) -> None:
        self.offsets: list[int] = []

    async def ack(self, ev: object) -> None:
        self.offsets.append(ev.message.offset)  # type: ignore[attr-defined]


def test_the_changelog_gets_the_table_entries_on_the_source_partition_before_any_ack() -> None:
    runtime, producer = make_runtime()
    acks = Acks()
    runtime.stream = acks
    runtime.handle(event(runtime, 0, _batch([("a", T0 + 100), ("b", T0 + 200)], T0 + 250)))
    asyncio.run(runtime.flush(0))
    assert acks.offsets == [0]
    records = [s for s in producer.sent if s.topic == CHANGELOG]
    assert records
    assert all(s.partition == 0 for s in records)
    # what the changelog holds is exactly the worker's table, and restoring it gives the counts
    assert dict(producer.changelog()) == runtime.table.data
    restored = PartitionState.restore(0, CFG, list(runtime.table.data.items()))
    assert restored.counts(T0)["a"] == 1
    assert restored.counts(T0)["b"] == 1


def test_a_closed_window_is_deleted_from_the_changelog_after_its_rates() -> None:
    runtime, producer = make_runtime()
    runtime.stream = Acks()
    runtime.handle(event(runtime, 0, _batch([("a", T0 + 100)], T0 + 150)))
    asyncio.run(runtime.flush(0))
    runtime.handle(event(runtime, 1, _batch([], T0 + 1300)))  # the watermark passes T0's window
    asyncio.run(runtime.flush(0))
    topics = [s.topic for s in producer.sent]
    first_rate = topics.index("unit.rates")
    bucket_keys = [k for k, _ in producer.changelog() if k is not None and k != b"0|meta"]
    deletes = [i for i, s in enumerate(producer.sent) if s.topic == CHANGELOG and s.value is None]
    assert deletes
    assert min(deletes) > first_rate
    assert {producer.sent[i].key for i in deletes} == set(bucket_keys)
    assert set(runtime.table.data) == {b"0|meta"}


def test_a_failed_changelog_write_holds_the_acks_and_is_written_again_with_its_current_value() -> (
    None
):
    runtime, producer = make_runtime()
    acks = Acks()
    runtime.stream = acks
    runtime.handle(event(runtime, 0, _batch([("a", T0 + 100)], T0 + 150)))
    bucket_a = b"0|%d|3" % T0  # key "a" is in bucket crc32("a") % 4 = 3
    producer.fail = {bucket_a}  # the broker never takes this write
    asyncio.run(runtime.flush(0))
    assert acks.offsets == []  # offset 0 is not durable yet: not acked, so not committed
    assert runtime.changelog_failed == {0: {bucket_a}}
    # the next flush changes only key "b" (bucket 1), writes a's bucket again and acks both
    runtime.handle(event(runtime, 1, _batch([("b", T0 + 300)], T0 + 350)))
    before = len(producer.sent)
    asyncio.run(runtime.flush(0))
    assert acks.offsets == [0, 1]
    again = [s.key for s in producer.sent[before:] if s.topic == CHANGELOG]
    assert again == [bucket_a, b"0|%d|1" % T0, b"0|meta"]
    assert dict(producer.changelog()) == runtime.table.data
    assert runtime.changelog_failed == {}
    compacted = {k: v for k, v in producer.changelog() if k is not None and v is not None}
    restored = PartitionState.restore(0, CFG, list(compacted.items()))
    assert restored.counts(T0) == {"a": 1, "b": 1}


def test_changelog_writes_still_queued_after_the_timeout_hold_the_acks_and_go_again() -> None:
    runtime, producer = make_runtime()
    acks = Acks()
    runtime.stream = acks
    runtime.handle(event(runtime, 0, _batch([("a", T0 + 100), ("b", T0 + 200)], T0 + 250)))
    producer.undelivered = [0, 2]  # rates flushed; 2 changelog records still queued after 60 s
    asyncio.run(runtime.flush(0))
    assert acks.offsets == []
    first = set(dict(producer.changelog()))
    assert runtime.changelog_failed == {0: first}  # their late reports reach no one: all again
    runtime.handle(event(runtime, 1, _batch([], T0 + 300)))
    before = len(producer.sent)
    asyncio.run(runtime.flush(0))
    assert acks.offsets == [0, 1]
    again = {s.key for s in producer.sent[before:] if s.topic == CHANGELOG}
    assert again >= first
    assert dict(producer.changelog()) == runtime.table.data
