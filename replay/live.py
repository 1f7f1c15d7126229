"""Live replay into Kafka: push a workload or trace into `requests`, or copy a recorded topic.

Not pure (Kafka, wall clock): this is the shell side of replay. Clock and sleep are injectable so
tests can drive the pacing without waiting.

* `push` feeds a RequestSet to a gateway `Emitter` (the same one gateways embed) at `speed` x real
  time (0 = as fast as possible). Event times are the replay's own times, compressed by `speed`
  and anchored at `start_ms`, so the streams agent windows them exactly as it would have live.
* `read_recorded` reads the request records of a topic (between two event times) into a
  `RecordedTraffic`, which `cacheroute evaluate --topic` evaluates as it would a trace file.
* `copy_topic` copies every record of a topic - from an offset, or from the first record at or
  after a timestamp - up to its end at the time of the call into another topic: key, value,
  headers, partition and timestamp preserved, optionally paced by the records' timestamps.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

from confluent_kafka import (
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)

from cacheroute.errors import CacheRouteError
from cacheroute.kafkaio import consumer_config, producer_config
from cacheroute.replay.recorded import RecordedTraffic
from cacheroute.replay.requestset import RequestSet
from cacheroute.schemas import SchemaError, decode_any
from cacheroute.settings import Settings

__all__ = ["CopyStats", "EmitterLike", "PushStats", "copy_topic", "push", "read_recorded"]

_BEHIND_S = 0.002  # sleep only when at least this far ahead of schedule
_PROGRESS_EVERY = 1000


class EmitterLike(Protocol):
    """What `push` needs of the gateway emitter."""

    def emit(
        self,
        key: str,
        prompt_tokens: int,
        *,
        prefix_tokens: int | None = None,
        destination: str | None = None,
        cached_tokens: int | None = None,
        prefix_block_hashes: list[int] | None = None,
        event_time_ms: int | None = None,
    ) -> bool: ...

    def flush(self, timeout: float = 30.0) -> bool: ...


@dataclass(frozen=True, slots=True)
class PushStats:
    """What a push did."""

    requests: int
    accepted: int
    rejected_or_dropped: int
    replay_s: float
    wall_s: float
    flushed: bool


def push(
    requests: RequestSet,
    emitter: EmitterLike,
    *,
    speed: float,
    start_ms: int,
    block_hashes: bool = False,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    on_progress: Callable[[int], None] | None = None,
) -> PushStats:
    """Emit every request, paced at `speed` x real time (0: no pacing); flush at the end."""
    if speed < 0:
        raise CacheRouteError(f"speed must be >= 0, got {speed}")
    q = requests
    t0 = float(q.times[0])
    times = q.times.tolist()
    keys = [q.keys[k] for k in q.key_index.tolist()]
    prompt = q.prompt_tokens.tolist()
    prefix = q.prefix_tokens.tolist()
    offsets = q.block_offsets.tolist()
    ids = q.block_ids.tolist() if block_hashes else []
    scale = 1.0 / speed if speed > 0 else 1.0
    wall0 = clock()
    accepted = 0
    for i in range(q.n):
        offset = (times[i] - t0) * scale
        if speed > 0:
            ahead = wall0 + offset - clock()
            if ahead > _BEHIND_S:
                sleep(ahead)
        ok = emitter.emit(
            keys[i],
            prompt[i],
            prefix_tokens=prefix[i],
            prefix_block_hashes=ids[offsets[i] : offsets[i + 1]] if block_hashes else None,
            event_time_ms=start_ms + round(offset * 1000),
        )
        accepted += ok
        if on_progress is not None and (i + 1) % _PROGRESS_EVERY == 0:
            on_progress(_PROGRESS_EVERY)
    if on_progress is not None:
        on_progress(q.n % _PROGRESS_EVERY)
    flushed = emitter.flush()
    return PushStats(
        requests=q.n,
        accepted=accepted,
        rejected_or_dropped=q.n - accepted,
        replay_s=(times[-1] - t0) * scale,
        wall_s=clock() - wall0,
        flushed=flushed,
    )


@dataclass(frozen=True, slots=True)
class CopyStats:
    """What a copy did."""

    records: int
    partitions: int
    first_timestamp_ms: int | None
    last_timestamp_ms: int | None


def _start_offsets(
    consumer: Consumer,
    topic: str,
    partitions: list[int],
    *,
    from_offset: int | None,
    from_time_ms: int | None,
    timeout: float,
) -> dict[int, tuple[int, int]]:
    """partition -> (first offset to copy, end offset) at the time of the call."""
    out: dict[int, tuple[int, int]] = {}
    by_time: dict[int, int] = {}
    if from_time_ms is not None:
        found = consumer.offsets_for_times(
            [TopicPartition(topic, p, from_time_ms) for p in partitions], timeout=timeout
        )
        by_time = {tp.partition: tp.offset for tp in found}
    for p in partitions:
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout)
        start = low if from_offset is None else max(low, from_offset)
        if from_time_ms is not None:
            t_off = by_time.get(p, -1)
            start = high if t_off < 0 else max(start, t_off)
        if start < high:
            out[p] = (start, high)
    return out


@dataclass(slots=True)
class _Copy:
    """State of one copy: pacing and counters."""

    producer: Producer
    dest: str
    dest_partitions: int
    speed: float
    clock: Callable[[], float]
    sleep: Callable[[float], None]
    wall0: float = 0.0
    copied: int = 0
    first_ts: int | None = None
    last_ts: int | None = None

    def take(self, msg: Message) -> None:
        """Copy one message of the range being read."""
        p = msg.partition() or 0
        _, ts = msg.timestamp()
        if self.first_ts is None:
            self.first_ts = ts
        if self.speed > 0:
            ahead = self.wall0 + (ts - self.first_ts) / 1000 / self.speed - self.clock()
            if ahead > _BEHIND_S:
                self.sleep(ahead)
        self.last_ts = ts if self.last_ts is None else max(self.last_ts, ts)
        if p < self.dest_partitions:  # keep the partition (and so the key's streams worker)
            self.producer.produce(
                self.dest,
                value=msg.value(),
                key=msg.key(),
                headers=msg.headers(),
                timestamp=ts,
                partition=p,
            )
        else:
            self.producer.produce(
                self.dest, value=msg.value(), key=msg.key(), headers=msg.headers(), timestamp=ts
            )
        self.producer.poll(0)
        self.copied += 1


def _in_ranges(
    consumer: Consumer,
    topic: str,
    ranges: dict[int, tuple[int, int]],
    timeout: float,
    clock: Callable[[], float],
    *,
    doing: str,
) -> Iterator[Message]:
    """Assign `ranges` (partition -> (start, end) offsets) and yield each message in them, in
    order per partition, until every partition reached its end; CacheRouteError when nothing
    arrives for `timeout` seconds, KafkaException on a Kafka error (EOFs excepted)."""
    remaining = dict(ranges)
    consumer.assign([TopicPartition(topic, p, start) for p, (start, _) in ranges.items()])
    deadline = clock() + timeout
    while remaining:
        msg = consumer.poll(0.5)
        if msg is None:
            if clock() > deadline:
                raise CacheRouteError(f"{doing} {topic} timed out", retriable=True)
            continue
        err = msg.error()
        if err is not None:
            if err.code() == KafkaError._PARTITION_EOF:
                continue
            raise KafkaException(err)
        deadline = clock() + timeout
        p, offset = msg.partition() or 0, msg.offset() or 0
        if p not in remaining or offset >= remaining[p][1]:
            continue
        if offset + 1 >= remaining[p][1]:
            del remaining[p]
        yield msg


def copy_topic(
    settings: Settings,
    source: str,
    dest: str,
    *,
    from_offset: int | None = None,
    from_time_ms: int | None = None,
    speed: float = 0.0,
    timeout: float = 30.0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    on_progress: Callable[[int], None] | None = None,
) -> CopyStats:
    """Copy `source` into `dest` (which must exist) from an offset or a timestamp to its end."""
    consumer = Consumer(consumer_config(settings, group_id=f"cacheroute-copy-{time.time_ns()}"))
    try:
        meta = consumer.list_topics(timeout=timeout)
        for topic in (source, dest):
            if topic not in meta.topics:
                raise CacheRouteError(f"topic {topic} does not exist")
        partitions = sorted(meta.topics[source].partitions)
        ranges = _start_offsets(
            consumer,
            source,
            partitions,
            from_offset=from_offset,
            from_time_ms=from_time_ms,
            timeout=timeout,
        )
        if not ranges:
            return CopyStats(0, 0, None, None)
        job = _Copy(
            producer=Producer(producer_config(settings)),
            dest=dest,
            dest_partitions=len(meta.topics[dest].partitions),
            speed=speed,
            clock=clock,
            sleep=sleep,
            wall0=clock(),
        )
        for msg in _in_ranges(consumer, source, ranges, timeout, clock, doing="copying"):
            job.take(msg)
            if on_progress is not None:
                on_progress(1)
        left = job.producer.flush(timeout)
        if left:
            raise CacheRouteError(f"{left} records to {dest} not delivered", retriable=True)
    finally:
        consumer.close()
    return CopyStats(job.copied, len(ranges), job.first_ts, job.last_ts)


RECORD_SLACK_MS = 60_000
"""`read_recorded` starts reading this long before `from_ms` by Kafka timestamp: a batch's record
is timestamped when it is sealed, after its events, so events from `from_ms` on can only be in
records from then on; the slack also covers a producer whose clock lags."""


def read_recorded(
    settings: Settings,
    topic: str,
    *,
    from_ms: int | None = None,
    to_ms: int | None = None,
    timeout: float = 30.0,
    on_progress: Callable[[int], None] | None = None,
) -> RecordedTraffic:
    """The request events of `topic` with from_ms <= event time < to_ms, up to its current end.

    Every partition is read from the first record at or after `from_ms` - RECORD_SLACK_MS (by
    Kafka timestamp; its start without `from_ms`) to its end offset at the time of the call.
    Records that do not decode are counted (`undecodable`), never fatal: a recorded topic may
    hold the garbage the streams agent dead-lettered.
    """
    out = RecordedTraffic(from_ms=from_ms, to_ms=to_ms)
    consumer = Consumer(consumer_config(settings, group_id=f"cacheroute-read-{time.time_ns()}"))
    try:
        meta = consumer.list_topics(timeout=timeout)
        if topic not in meta.topics or meta.topics[topic].error is not None:
            raise CacheRouteError(
                f"topic {topic} does not exist (or this principal may not describe it); "
                "`cacheroute topics list` shows the topics"
            )
        partitions = sorted(meta.topics[topic].partitions)
        ranges = _start_offsets(
            consumer,
            topic,
            partitions,
            from_offset=None,
            from_time_ms=None if from_ms is None else max(0, from_ms - RECORD_SLACK_MS),
            timeout=timeout,
        )
        for msg in _in_ranges(consumer, topic, ranges, timeout, time.monotonic, doing="reading"):
            before = len(out)
            try:
                record = decode_any(
                    msg.value(), topic=topic, partition=msg.partition(), offset=msg.offset()
                )
            except SchemaError:
                out.undecodable += 1
                continue
            out.add(record)
            if on_progress is not None:
                on_progress(len(out) - before)
    finally:
        consumer.close()
    return out
