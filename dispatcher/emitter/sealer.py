"""The emitter's sealing side: events taken from the buffers become encoded records sent to Kafka.

Why a separate object: everything here runs off the request path (in the emitter's background
thread, or in `flush`), under the emitter's seal lock, and owns its own state — per-partition
`seq` numbers, records waiting for librdkafka, summary ticks, rate-limited logging. The emitter
keeps only what `emit` touches. Counting is delegated to a `Ledger` (the emitter), which owns the
counters under its request-side lock.

Order: each partition's records wait in a FIFO and are handed to librdkafka in seal order; if its
queue is full (BufferError) the records stay and are retried on the next cycle, so nothing accepted
is lost and the idempotent producer keeps each partition's records in order.
"""

from __future__ import annotations

import functools
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from confluent_kafka import KafkaError, KafkaException, Message

from cacheroute.dispatcher.emitter.columns import Columns, batch_from, heartbeat_due
from cacheroute.dispatcher.emitter.config import EmitterConfig
from cacheroute.dispatcher.emitter.summary import summary_from
from cacheroute.dispatcher.emitter.throttle import ThrottledLog
from cacheroute.dispatcher.emitter.transport import ProducerLike
from cacheroute.schemas import RequestBatch, RequestSummary, SchemaError, codec_for

__all__ = ["Ledger", "Outgoing", "Sealer", "Taken"]


@dataclass(frozen=True, slots=True)
class Taken:
    """What one cycle took out of the emitter's buffers (under its lock) for sealing."""

    batches: list[tuple[int, Columns]]
    """(partition, events) of buffers due for sealing (events mode)."""
    ticks: list[tuple[int, int, dict[str, list[int]]]]
    """(partition, tick start, key -> row) of ticks due for sealing (summary mode)."""
    holding: list[bool]
    """Per partition: whether events are still held after taking (then no heartbeat)."""


@dataclass(frozen=True, slots=True)
class Outgoing:
    """One sealed, encoded record waiting for (or in) delivery.

    It carries the counts its outcome settles: `events` accepted events (for `events_sent` /
    `events_failed`) and `units` of the memory bound it releases (events, or summary rows).
    """

    partition: int
    seq: int
    value: bytes
    events: int
    units: int
    heartbeat: bool = False


class Ledger(Protocol):
    """Where the sealer reports outcomes (the emitter, which owns the counters)."""

    def settle(self, out: Outgoing, *, delivered: bool) -> None:
        """A record was delivered, or is lost for good."""


def _compiled_writer() -> Callable[[RequestBatch], bytes | None] | None:
    """The compiled batch writer (schemas/batch_write.py), loaded now rather than inside the
    first seal; None where numba is not installed (a gateway's base install): fastavro then
    writes every batch, the same bytes at about seven times the cost."""
    try:
        from cacheroute.schemas import batch_write  # noqa: PLC0415 - numba is optional here
    except ImportError:
        return None
    batch_write.warm_up()
    return batch_write.encode_request_batch


class Sealer:
    """Seals, encodes, queues and produces records; not thread-safe (the emitter serialises it)."""

    def __init__(
        self,
        *,
        gateway_id: str,
        topic: str,
        partitions: int,
        config: EmitterConfig,
        producer: ProducerLike,
        ledger: Ledger,
        log: ThrottledLog,
        now_ms: int,
    ) -> None:
        self.gateway_id = gateway_id
        self.topic = topic
        self.config = config
        self.log = log
        self._producer = producer
        self._ledger = ledger
        self._key = gateway_id.encode()
        self._batch_codec = codec_for(RequestBatch)
        self._summary_codec = codec_for(RequestSummary)
        self._seq = [0] * partitions
        self._last_sent = [now_ms] * partitions
        self._pending: list[deque[Outgoing]] = [deque() for _ in range(partitions)]
        self._now = now_ms  # time of the current cycle, for delivery reports that run inside it
        self._compiled = _compiled_writer()

    @property
    def waiting(self) -> bool:
        """Whether sealed records still wait for librdkafka to take them."""
        return any(self._pending)

    def seal(self, now: int, taken: Taken) -> None:
        """Turn what was taken from the emitter's buffers into queued records; add heartbeats."""
        self._now = now
        limit = self.config.max_batch_events
        for p, cols in taken.batches:
            for i in range(0, len(cols), limit):
                self._queue_batch(p, now, cols if len(cols) <= limit else cols.slice(i, i + limit))
        for p, start, tick in taken.ticks:
            rows = list(tick.items())
            for i in range(0, len(rows), limit):
                self._queue_summary(p, now, start, rows[i : i + limit])
        holding = taken.holding
        for p, last in enumerate(self._last_sent):
            if heartbeat_due(last, now, heartbeat_ms=self.config.heartbeat_ms, holding=holding[p]):
                self._queue_batch(p, now, Columns([], [], [], [], [], [], []), heartbeat=True)

    def _queue_batch(self, p: int, now: int, cols: Columns, *, heartbeat: bool = False) -> None:
        """Encode `cols` as one RequestBatch; split in halves while too large or unencodable."""
        n = len(cols)
        try:
            batch = batch_from(self.gateway_id, self._seq[p], now, cols)
            # the compiled writer for the usual batch, fastavro for the rest (batch_write.py)
            compiled = self._compiled
            value = (compiled and compiled(batch)) or self._batch_codec.encode(
                batch, validate=False
            )
        except SchemaError as exc:  # emit validates, so only a bug gets here: isolate it
            if n <= 1:
                self._fail(Outgoing(p, self._seq[p], b"", n, n), "unencodable", str(exc))
                return
            value = b""
        if n > 1 and (not value or len(value) > self.config.max_batch_bytes):
            self._queue_batch(p, now, cols.slice(0, n // 2))
            self._queue_batch(p, now, cols.slice(n // 2, n))
            return
        self._enqueue(Outgoing(p, self._seq[p], value, n, n, heartbeat), now)

    def _queue_summary(
        self, p: int, now: int, start: int, rows: list[tuple[str, list[int]]]
    ) -> None:
        """Encode rows of one tick as a RequestSummary; split in halves while too large."""
        summary = summary_from(
            self.gateway_id,
            self._seq[p],
            now,
            tick_start=start,
            tick_ms=self.config.tick_ms,
            rows=rows,
        )
        events = sum(summary.counts)
        try:
            value = self._summary_codec.encode(summary, validate=False)
        except SchemaError as exc:  # emit validates, so only a bug gets here
            self._fail(Outgoing(p, self._seq[p], b"", events, len(rows)), "unencodable", str(exc))
            return
        if len(value) > self.config.max_batch_bytes and len(rows) > 1:
            half = len(rows) // 2
            self._queue_summary(p, now, start, rows[:half])
            self._queue_summary(p, now, start, rows[half:])
            return
        self._enqueue(Outgoing(p, self._seq[p], value, events, len(rows)), now)

    def _enqueue(self, out: Outgoing, now: int) -> None:
        self._pending[out.partition].append(out)
        self._seq[out.partition] += 1
        self._last_sent[out.partition] = now

    def drain(self, now: int) -> int:
        """Hand queued records to librdkafka in order; keep what it cannot take yet."""
        self._now = now
        produced = 0
        for p, queue in enumerate(self._pending):
            while queue:
                out = queue[0]
                try:
                    self._producer.produce(
                        self.topic,
                        value=out.value,
                        key=self._key,
                        partition=p,
                        on_delivery=functools.partial(self._delivered, out),
                    )
                except BufferError:
                    self.log.log(
                        "queue-full",
                        now,
                        logging.WARNING,
                        f"emitter {self.gateway_id}: librdkafka's queue is full; "
                        "sealed records wait and are retried",
                    )
                    return produced
                except KafkaException as exc:
                    err = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
                    if err is not None and err.retriable():
                        self.log.log(
                            f"retry:{err.name()}",
                            now,
                            logging.WARNING,
                            f"emitter {self.gateway_id}: producing to {self.topic}[{p}] "
                            f"failed, will retry: {err.str()}",
                        )
                        break
                    queue.popleft()
                    if err is None:
                        self._fail(out, type(exc).__name__, str(exc))
                    else:
                        self._fail(out, err.name(), err.str())
                    continue
                except Exception as exc:
                    queue.popleft()
                    self._fail(out, type(exc).__name__, str(exc))
                    continue
                queue.popleft()
                produced += 1
        return produced

    def poll(self, now: int, timeout: float = 0.0) -> int:
        """Serve delivery reports (librdkafka calls them back from here)."""
        self._now = now
        return self._producer.poll(timeout)

    def flush(self, now: int, timeout: float) -> int:
        """Wait up to `timeout` s for everything handed to librdkafka; returns what is left."""
        self._now = now
        return self._producer.flush(timeout)

    def _delivered(self, out: Outgoing, err: KafkaError | None, _msg: Message) -> None:
        """librdkafka's delivery report (runs inside poll/flush, i.e. under the seal lock)."""
        try:
            if err is None:
                self._ledger.settle(out, delivered=True)
            else:
                self._fail(out, err.name(), err.str())
        except Exception:  # an exception here would surface from poll() in the caller's thread
            logging.getLogger(__name__).exception("delivery report handling failed")

    def _fail(self, out: Outgoing, kind: str, text: str) -> None:
        """A record is lost for good: count it, release its memory, log (rate-limited)."""
        self._ledger.settle(out, delivered=False)
        self.log.log(
            f"delivery:{kind}",
            self._now,
            logging.ERROR,
            f"emitter {self.gateway_id}: record {self.topic}[{out.partition}] seq {out.seq} "
            f"with {out.events} events not delivered: {kind}: {text}",
        )
