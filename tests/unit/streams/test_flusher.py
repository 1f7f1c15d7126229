"""Flushes beside the agent: partitions flushed together, and reading on while the broker acks.

The agent used to await every flush, two broker round trips per partition, before it read the next
message (about half the worker's time in `bench streams`). These tests pin what the pipelined
flusher must keep: per partition, rates before the changelog before the acks; a failure holds back
only its own partition's acks; what the agent applies while a flush waits goes to the next flush.
"""

from __future__ import annotations

import asyncio
import threading

from cacheroute.streams.app import StreamsOptions
from cacheroute.streams.state import PartitionState

from .fakes import CFG, CHANGELOG, T0, event, make_runtime
from .fakes import gw0_batch as _batch


class Acks:
    """A stand-in for Faust's manual-ack stream: remembers (partition, offset) of each ack."""

    def __init__(self) -> None:
        self.acked: list[tuple[int, int]] = []

    async def ack(self, ev: object) -> None:
        msg = ev.message  # type: ignore[attr-defined]
        self.acked.append((msg.partition, msg.offset))


def test_partitions_flushed_together_wait_for_the_broker_once_per_step() -> None:
    runtime, producer = make_runtime()
    acks = Acks()
    runtime.stream = acks
    runtime.handle(event(runtime, 0, _batch([("a", T0 + 100)], T0 + 150), partition=0))
    runtime.handle(event(runtime, 0, _batch([("b", T0 + 200)], T0 + 250), partition=1))
    asyncio.run(runtime.flush_partitions([1, 0]))
    assert producer.flushes == 2  # rates, then the changelog: not two per partition
    assert sorted(acks.acked) == [(0, 0), (1, 0)]
    changelog = [s for s in producer.sent if s.topic == CHANGELOG]
    assert {s.partition for s in changelog} == {0, 1}
    assert all(
        s.key is not None and s.key.startswith(b"%d|" % (s.partition or 0)) for s in changelog
    )
    assert dict(producer.changelog()) == runtime.table.data
    for partition, key in ((0, "a"), (1, "b")):
        entries = [
            (k, v) for k, v in runtime.table.data.items() if k.startswith(b"%d|" % partition)
        ]
        assert PartitionState.restore(partition, CFG, entries).counts(T0) == {key: 1}


def test_a_failed_changelog_write_holds_back_only_the_acks_of_its_partition() -> None:
    runtime, producer = make_runtime()
    acks = Acks()
    runtime.stream = acks
    runtime.handle(event(runtime, 0, _batch([("a", T0 + 100)], T0 + 150), partition=0))
    runtime.handle(event(runtime, 0, _batch([("a", T0 + 100)], T0 + 150), partition=1))
    bucket_a_1 = b"1|%d|3" % T0  # partition 1's bucket of key "a" (crc32("a") % 4 = 3)
    producer.fail = {bucket_a_1}
    asyncio.run(runtime.flush_partitions([0, 1]))
    assert acks.acked == [(0, 0)]
    assert runtime.changelog_failed == {1: {bucket_a_1}}
    assert [ev.message.partition for ev in runtime.pending.get(1, [])] == [1]
    assert not runtime.pending.get(0)
    asyncio.run(runtime.flush_partitions([1]))  # written again, then acked
    assert acks.acked == [(0, 0), (1, 0)]
    assert runtime.changelog_failed == {}


def test_the_agent_reads_on_while_a_flush_waits_and_that_goes_to_the_next_flush() -> None:
    runtime, producer = make_runtime()
    acks = Acks()
    runtime.stream = acks
    gate = threading.Event()

    async def scenario() -> None:
        flusher = asyncio.create_task(runtime.run_flusher())
        runtime.handle(event(runtime, 0, _batch([("a", T0 + 100)], T0 + 150)))
        producer.gate = gate  # the broker is slow to acknowledge
        runtime.request_flush(0)
        while not producer.waiting.is_set():  # the flush is waiting for the broker
            await asyncio.sleep(0.001)
        runtime.handle(event(runtime, 1, _batch([("a", T0 + 300)], T0 + 350)))  # reads on
        assert acks.acked == []
        assert [ev.message.offset for ev in runtime.pending[0]] == [1]
        gate.set()
        while acks.acked != [(0, 0)]:
            await asyncio.sleep(0.001)
        runtime.request_flush(0)
        while acks.acked != [(0, 0), (0, 1)]:
            await asyncio.sleep(0.001)
        flusher.cancel()

    asyncio.run(asyncio.wait_for(scenario(), 10))
    # both messages reached the changelog: the state restored from it counts both
    compacted = {k: v for k, v in producer.changelog() if k is not None and v is not None}
    assert PartitionState.restore(0, CFG, list(compacted.items())).counts(T0) == {"a": 2}


def test_partitions_requested_during_a_flush_are_flushed_together_after_it() -> None:
    runtime, producer = make_runtime()
    runtime.stream = Acks()
    gate = threading.Event()

    async def scenario() -> None:
        flusher = asyncio.create_task(runtime.run_flusher())
        runtime.handle(event(runtime, 0, _batch([("a", T0 + 100)], T0 + 150), partition=0))
        producer.gate = gate
        runtime.request_flush(0)
        while not producer.waiting.is_set():
            await asyncio.sleep(0.001)
        for partition in (1, 2, 3):
            runtime.handle(event(runtime, 0, _batch([("b", T0 + 200)], T0 + 250), partition))
            runtime.request_flush(partition)
        gate.set()
        while len(runtime.stream.acked) < 4:
            await asyncio.sleep(0.001)
        flusher.cancel()

    asyncio.run(asyncio.wait_for(scenario(), 10))
    assert producer.flushes == 4  # partition 0 alone (2 waits), then 1-3 together (2 waits)


def test_the_agent_waits_for_a_flush_only_with_several_flushes_of_unacked_messages() -> None:
    runtime, _ = make_runtime()
    runtime.options = StreamsOptions(flush_max_messages=2)
    for offset in range(7):
        runtime.handle(event(runtime, offset, _batch([("a", T0 + 100)], T0 + 150)))
        assert not runtime.backlogged(0)
    runtime.handle(event(runtime, 7, _batch([("a", T0 + 100)], T0 + 150)))
    assert runtime.backlogged(0)  # 8 = 4 flushes of 2 messages
    asyncio.run(runtime.flush(0))
    assert not runtime.backlogged(0)
