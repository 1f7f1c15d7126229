"""The faust-streaming worker: `requests` batches in, `KeyRate` records out, state in a Faust table.

This module is the thin shell around `PartitionState` (pure): it decodes messages, routes malformed
ones to the dead-letter topic, applies batches, and on each flush produces the closed windows' rates
(confluent-kafka: the agent emits ~1 record per key per window, far more than Faust's per-message
producer path handles quickly), writes the table changelog (the table's own Faust changelog topic,
through the same producer, waiting for every acknowledgement), and only then acks the source
messages — so Faust commits an offset only after the state that includes it is durable.
Flushes run beside the agent (`run_flusher`, an app task), not in its loop: the agent reads on while
a flush waits for the broker, partitions due together share one wait per step, and a partition with
several flushes' worth of unacked messages makes the agent wait (`backlogged`).

Acks are manual (`stream.noack()`): a message is acked at the flush after it was applied. After a
crash Faust restores the table from its changelog and re-delivers the unacked messages;
`PartitionState` skips what a bucket already holds (see state.py), so no count is lost or doubled.
A message delivered twice to the same worker (a consumer seek) is skipped whole
(`PartitionState.first_delivery`), and stream delivery is held back while Faust resumes partitions
after a rebalance (`on_rebalance_complete` in `create_app`), where it would otherwise lose some.
Rates are at-least-once: a crash between producing a window's rates and deleting its state can emit
that window again with the same values; consumers keep the latest record per (key, window).

Clocks: each record is judged against the clock this module trusts for it (`trusted_clock`): the
broker's append time when the topic uses LogAppendTime, otherwise the earlier of the record's
CreateTime (the producing client's clock) and this worker's clock. Future-dated records and events
go to the dead-letter topic (header `cacheroute.clock: ahead`); late events go there too, one record
per message (`cacheroute.clock: late`), so a gateway whose clock is behind loses nothing silently:
both carry `cacheroute.gateway`, which `cacheroute doctor` reads to name skewed gateways.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import faust
from confluent_kafka import Producer

from cacheroute.kafkaio import produce_keyed, producer_config
from cacheroute.schemas import (
    RequestBatch,
    RequestSummary,
    SchemaError,
    codec_for,
    decode_any,
)
from cacheroute.schemas.batch_scan import ScannedBatch, scan_request_batch
from cacheroute.schemas.batch_scan import warm_up as warm_up_reader
from cacheroute.schemas.errors import format_location
from cacheroute.schemas.rate_columns import encode_key_rates
from cacheroute.schemas.rate_columns import warm_up as warm_up_encoder
from cacheroute.settings import Settings
from cacheroute.streams.columns import warm_up as warm_up_fold
from cacheroute.streams.config import StreamConfig
from cacheroute.streams.keytable import warm_up as warm_up_keys
from cacheroute.streams.metrics import StreamMetrics
from cacheroute.streams.state import (
    ApplyResult,
    BatchError,
    ClockError,
    FlushResult,
    PartitionState,
    table_prefix,
)
from cacheroute.topics import replication_for

__all__ = ["StreamsOptions", "StreamsRuntime", "create_app", "trusted_clock"]

log = logging.getLogger(__name__)

LOG_APPEND_TIME = 1
"""Kafka's timestamp type of a record stamped by the broker (0 is CreateTime, the producer's)."""

_CLOCK_LOG_EVERY_S = 60.0
"""At most one clock-skew log line per gateway and kind this often (the DLQ has every record)."""

_BACKLOG_FLUSHES = 4
"""The agent reads on while a flush waits for the broker, until a partition holds this many
flushes' worth of unacked messages (x `flush_max_messages`); then it waits for the flush. Unbounded,
a stalled broker would let a worker read far ahead of what it can make durable."""


def trusted_clock(
    timestamp_s: float | None, timestamp_type: int | None, now_ms: int
) -> tuple[int, str]:
    """The time (ms) a record's own clocks are judged against, and what it is called in reasons.

    The broker's append time (LogAppendTime) is the one clock no gateway controls: use it alone.
    A CreateTime is the producing client's clock — usually the very gateway host being judged —
    so it is also bounded by this worker's clock: a gateway whose whole host runs ahead cannot
    vouch for itself. (A worker clock behind by more than the margin would dead-letter punctual
    records; `cacheroute doctor` would then name every gateway, which points at the worker.)
    """
    ts = round(timestamp_s * 1000) if timestamp_s is not None and timestamp_s > 0 else None
    if ts is None:
        return now_ms, "worker clock"
    if timestamp_type == LOG_APPEND_TIME:
        return ts, "broker timestamp"
    if ts <= now_ms:
        return ts, "Kafka timestamp"
    return now_ms, "worker clock"


@dataclass(frozen=True)
class StreamsOptions:
    """Process-level options of the worker (the windowing itself is `StreamConfig`)."""

    app_id: str = "cacheroute-streams"
    flush_interval_s: float = 1.0
    """Flush (durable state + acks) at least this often per partition with pending messages."""
    flush_max_messages: int = 200
    """... or after this many messages of one partition."""
    datadir: Path | None = None
    session_timeout_s: float = 10.0
    commit_interval_s: float = 2.8
    """How often Faust commits acked offsets (Faust's default)."""


@dataclass
class StreamsRuntime:
    """State the agent, the flush timer and the rebalance hooks share inside one worker."""

    settings: Settings
    config: StreamConfig
    options: StreamsOptions
    table: Any
    metrics: StreamMetrics
    producer: Producer
    states: dict[int, PartitionState] = field(default_factory=dict)
    pending: dict[int, list[Any]] = field(default_factory=dict)
    last_flush: dict[int, float] = field(default_factory=dict)
    stream: Any = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    clock_notes: dict[tuple[str, str], tuple[float, int]] = field(default_factory=dict)
    """(gateway, kind) -> (when last logged, events since): rate-limits clock-skew log lines."""
    changelog_failed: dict[int, set[bytes]] = field(default_factory=dict)
    """partition -> table keys whose changelog write failed: written again at the next flush."""
    flush_requested: set[int] = field(default_factory=set)
    """Partitions the flusher flushes next (`request_flush`)."""
    flush_wake: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def source_topic(self) -> str:
        """The requests topic."""
        return self.settings.topics["requests"]

    # ------------------------------------------------------------------------------ state
    def state_for(self, partition: int, now_ms: int | None = None) -> PartitionState:
        """This worker's state of a partition, rebuilt from the restored table on first use.

        `now_ms` (the latest trustworthy time at hand) bounds the restored watermark: one further
        ahead is discarded with a warning (see `PartitionState.restore`).
        """
        state = self.states.get(partition)
        if state is None:
            prefix = table_prefix(partition)
            entries = [(k, v) for k, v in self.table.data.items() if k.startswith(prefix)]
            state = PartitionState.restore(partition, self.config, entries, now_ms=now_ms)
            self.states[partition] = state
            self.last_flush[partition] = time.monotonic()
            if state.restore_warning:
                log.warning("%s", state.restore_warning)
            if entries:
                log.info(
                    "partition %d: restored %d windows from the changelog (watermark %d, "
                    "offsets up to %d)",
                    partition,
                    len(state.open_windows),
                    state.watermark,
                    state.last_offset,
                )
        return state

    def forget(self, partitions: set[int]) -> None:
        """Drop state of revoked partitions; their next owner restores it from the changelog."""
        for p in partitions:
            self.states.pop(p, None)
            self.pending.pop(p, None)
            prefix = table_prefix(p)
            for key in [k for k in list(self.table.data) if k.startswith(prefix)]:
                self.table.data.pop(key, None)

    # ---------------------------------------------------------------------------- handling
    def dead_letter(
        self,
        value: bytes | None,
        key: bytes | None,
        reason: str,
        where: str,
        index: int = -1,
        *,
        gateway: str | None = None,
        clock: tuple[str, int, int] | None = None,
    ) -> None:
        """Send a malformed batch or event to the dead-letter topic with the reason.

        `gateway` names the sender of a decodable record; `clock` = (kind, events, skew_ms) marks
        a clock problem — "ahead" (future-dated; skew = how far ahead of the trusted clock) or
        "late" (skew = how far the oldest event is behind the watermark) — for `cacheroute doctor`.
        """
        headers: list[tuple[str, str | bytes | None]] = [
            ("cacheroute.reason", reason.encode()),
            ("cacheroute.source", where.encode()),
            ("cacheroute.stage", b"streams"),
        ]
        if index >= 0:
            headers.append(("cacheroute.index", str(index).encode()))
        if gateway is not None:
            headers.append(("cacheroute.gateway", gateway.encode()))
        if clock is not None:
            kind, events, skew_ms = clock
            headers.append(("cacheroute.clock", kind.encode()))
            headers.append(("cacheroute.events", str(events).encode()))
            headers.append(("cacheroute.skew_ms", str(skew_ms).encode()))
        self.producer.produce(
            self.settings.topics["dead_letter"], value=value, key=key, headers=headers
        )
        self.producer.poll(0)

    def handle(self, event: Any) -> None:
        """Apply one message (synchronous: no await, so flushes see whole messages only)."""
        msg = event.message
        partition, offset = msg.partition, msg.offset
        where = format_location(msg.topic, partition, offset)
        now_ms = time.time_ns() // 1_000_000
        clock_ms, clock_name = trusted_clock(
            msg.timestamp, getattr(msg, "timestamp_type", None), now_ms
        )
        state = self.state_for(partition, max(now_ms, clock_ms))
        self.pending.setdefault(partition, []).append(event)  # a re-delivery is acked too
        if not state.first_delivery(offset):
            # already applied (or dead-lettered) by this worker: see PartitionState.first_delivery
            self.metrics.messages_redelivered.inc()
            log.info("%s: delivered again after a consumer seek; already applied, skipped", where)
            return
        self.metrics.batches.inc()
        self.metrics.batch_started(now_ms / 1000.0)
        raw = event.value
        try:
            # the common case, read straight into columns (schemas/batch_scan.py); anything
            # else (and any batch with a malformed or future-dated event) is decoded below
            scanned = None if raw is None else scan_request_batch(raw)
            fast = (
                None if scanned is None else state.apply_scanned(scanned, offset, clock_ms=clock_ms)
            )
            record: Any
            if fast is not None and scanned is not None:
                record, result = scanned, fast
            elif isinstance(
                record := decode_any(raw, topic=msg.topic, partition=partition, offset=offset),
                RequestBatch,
            ):
                result = state.apply_batch(record, offset, clock_ms=clock_ms, clock_name=clock_name)
            elif isinstance(record, RequestSummary):
                result = state.apply_summary(
                    record, offset, clock_ms=clock_ms, clock_name=clock_name
                )
            else:
                raise SchemaError(f"a {type(record).__name__} does not belong on {msg.topic}")
        except ClockError as exc:
            self.dead_letter(
                raw,
                msg.key,
                str(exc),
                where,
                gateway=exc.gateway_id,
                clock=("ahead", 0, exc.ahead_ms),
            )
            self.metrics.batches_dead_lettered.inc()
            self.metrics.gateway_batches_future.labels(self.metrics.gateway(exc.gateway_id)).inc()
            self._note_clock(exc.gateway_id, "ahead", 0, f"{where}: {exc}")
            return
        except (SchemaError, BatchError) as exc:
            log.warning("dead-lettering %s: %s", where, exc)
            self.dead_letter(raw, msg.key, str(exc), where)
            self.metrics.batches_dead_lettered.inc()
            return
        except Exception as exc:  # one message must not stop the partition
            # An unforeseen bug or value. Escaping, it would end the agent loop with this message
            # unacked (acks are manual), so the partition would stop here; dead-lettered, the
            # messages after it still count. Some of its events may already be in the state.
            log.exception("dead-lettering %s: handling it raised %s", where, type(exc).__name__)
            self.dead_letter(raw, msg.key, f"error: {type(exc).__name__}: {exc}"[:1000], where)
            self.metrics.batches_dead_lettered.inc()
            return
        try:
            if isinstance(record, ScannedBatch) and result.late_index:
                # dead-lettering late events needs the events themselves
                record = codec_for(RequestBatch).decode(raw, topic=msg.topic, offset=offset)
            self._report(record, result, msg.key, where, clock_name)
        except Exception:  # its events are applied; the next messages must be too
            log.exception("%s: applied, but reporting its bad or late events failed", where)

    def _report(
        self,
        record: RequestBatch | RequestSummary | ScannedBatch,
        result: ApplyResult,
        key: bytes | None,
        where: str,
        clock_name: str,
    ) -> None:
        """Dead-letter a message's bad and late events; count everything, per gateway too.

        A `ScannedBatch` has no bad events (else it was decoded), and is decoded for late ones."""
        gateway = record.gateway_id
        for bad in result.bad:
            if isinstance(record, RequestBatch):
                ev = (
                    record.events()[bad.index] if len(record) < 64 else _event_at(record, bad.index)
                )
                body = codec_for(type(ev)).to_json(ev)
                events = 1
            elif isinstance(record, RequestSummary):
                body = repr(record.keys[bad.index]).encode()
                events = record.counts[bad.index]
            clock = ("ahead", events, bad.ahead_ms) if bad.ahead_ms > 0 else None
            self.dead_letter(body, key, bad.reason, where, bad.index, gateway=gateway, clock=clock)
        if result.late_index and not isinstance(record, ScannedBatch):
            self._dead_letter_late(record, result, key, where)
        self.metrics.events_accepted.inc(result.accepted)
        self.metrics.events_late.inc(result.late)
        self.metrics.events_replayed.inc(result.replayed)
        self.metrics.events_dead_lettered.inc(len(result.bad))
        if result.future or result.header_ahead_ms:
            label = self.metrics.gateway(gateway)
            if result.future:
                self.metrics.gateway_events_future.labels(label).inc(result.future)
            if result.header_ahead_ms:
                self.metrics.gateway_batches_future.labels(label).inc()
            ahead = max([result.header_ahead_ms] + [b.ahead_ms for b in result.bad])
            self._note_clock(
                gateway,
                "ahead",
                result.future,
                f"{where}: dated up to {ahead / 1000:.1f} s ahead of the {clock_name}",
            )

    def _dead_letter_late(
        self,
        record: RequestBatch | RequestSummary,
        result: ApplyResult,
        key: bytes | None,
        where: str,
    ) -> None:
        """One DLQ record of the message's late events (a record of the same type, only them).

        Late events used to vanish into a counter; kept on the DLQ with their gateway, a gateway
        whose clock is behind is named by `cacheroute doctor` and its events can be inspected or
        replayed once the clock is fixed.
        """
        gateway = record.gateway_id
        if isinstance(record, RequestBatch):
            body = codec_for(RequestBatch).encode(
                _subset_batch(record, result.late_index), validate=False
            )
        else:
            body = codec_for(RequestSummary).encode(
                _subset_summary(record, result.late_index), validate=False
            )
        grace = self.config.grace_ms
        reason = (
            f"{result.late} late event(s) of gateway {gateway}: their window closed (grace "
            f"{grace} ms); the oldest is {result.late_behind_ms / 1000:.1f} s behind the "
            "partition's watermark. Gateway clock behind, or delivery slower than grace?"
        )
        self.dead_letter(
            body,
            key,
            reason,
            where,
            gateway=gateway,
            clock=("late", result.late, result.late_behind_ms),
        )
        self.metrics.late_dead_letters.inc()
        self.metrics.gateway_events_late.labels(self.metrics.gateway(gateway)).inc(result.late)
        self._note_clock(
            gateway,
            "late",
            result.late,
            f"{where}: up to {result.late_behind_ms / 1000:.1f} s behind the watermark",
        )

    def _note_clock(self, gateway: str, kind: str, events: int, detail: str) -> None:
        """Log a clock problem of a gateway: at once, then at most once a minute with a count."""
        now = time.monotonic()
        last, since = self.clock_notes.get((gateway, kind), (-_CLOCK_LOG_EVERY_S, 0))
        since += events
        if now - last < _CLOCK_LOG_EVERY_S:
            self.clock_notes[(gateway, kind)] = (last, since)
            return
        self.clock_notes[(gateway, kind)] = (now, 0)
        what = "future-dated" if kind == "ahead" else "late"
        log.warning(
            "gateway %s: %s (%d %s event(s) dead-lettered since the previous note); check its clock",
            gateway,
            detail,
            since,
            what,
        )

    def due(self, partition: int, now: float) -> bool:
        """Whether a partition should flush now."""
        pending = len(self.pending.get(partition, ()))
        if pending >= self.options.flush_max_messages:
            return True
        state = self.states.get(partition)
        stale = now - self.last_flush.get(partition, 0.0) >= self.options.flush_interval_s
        return stale and (pending > 0 or bool(state and state.has_changes))

    # ------------------------------------------------------------------------------ flushes
    def request_flush(self, partition: int) -> None:
        """Have the flusher (`run_flusher`) flush `partition` soon, without waiting for it.

        The agent goes on reading while a flush waits for the broker: the flush took the state's
        writes and the messages to ack when it began, so what the agent applies meanwhile belongs
        to the next flush. Partitions requested while a flush runs are flushed together next.
        """
        self.flush_requested.add(partition)
        self.flush_wake.set()

    def backlogged(self, partition: int) -> bool:
        """Whether the agent should wait for a flush before reading on (bounded unacked work)."""
        return len(self.pending.get(partition, ())) >= _BACKLOG_FLUSHES * max(
            self.options.flush_max_messages, 1
        )

    async def run_flusher(self) -> None:
        """Flush what was requested, all requested partitions at once, until cancelled."""
        while True:
            await self.flush_wake.wait()
            self.flush_wake.clear()
            partitions, self.flush_requested = self.flush_requested, set()
            if partitions:
                await self.flush_partitions(partitions)

    async def flush(self, partition: int) -> None:
        """Rates of closed windows -> Kafka; state -> changelog; then ack the applied messages."""
        await self.flush_partitions((partition,))

    async def flush_partitions(self, partitions: Iterable[int]) -> None:
        """`flush` for several partitions with one wait for the broker per step, not one each.

        Order, per partition and for all of them together: rates (and dead letters) produced and
        acknowledged, then the table changelog written and acknowledged, then the source messages
        acked. A failure holds back only the acks of the partitions it concerns.
        """
        async with self.lock:
            began = time.perf_counter()
            work: list[tuple[int, PartitionState, list[Any], FlushResult]] = []
            for partition in sorted(set(partitions)):
                state = self.states.get(partition)
                if state is None:
                    continue
                acks = self.pending.pop(partition, [])
                out = state.flush()
                self._produce_rates(out)
                work.append((partition, state, acks, out))
            if not work:
                return
            # rates and dead letters must be durable before the state that no longer holds them
            loop = asyncio.get_running_loop()
            remaining = await loop.run_in_executor(None, self.producer.flush, 60.0)
            work = [w for w in work if not self._revoked(w[0], w[1])]
            if remaining:
                log.error(
                    "partitions %s: %d records to rates/dead-letter undelivered after 60 s; "
                    "not acking, the messages will be re-delivered",
                    [w[0] for w in work],
                    remaining,
                )
                for partition, _, acks, out in work:
                    self.pending.setdefault(partition, [])[:0] = acks
                    # the state has moved on: its entries reach the changelog with the next flush
                    self._apply_to_table(out.writes)
                    self.changelog_failed.setdefault(partition, set()).update(
                        k for k, _ in out.writes
                    )
                return
            durable = await self._write_changelogs({w[0]: w[3].writes for w in work})
            for partition, state, acks, out in work:
                if partition not in durable:
                    self.pending.setdefault(partition, [])[:0] = acks
                    continue
                if self._revoked(partition, state):
                    continue
                if self.stream is not None:
                    for ev in acks:
                        await self.stream.ack(ev)
                self.last_flush[partition] = time.monotonic()
                self.metrics.rates_emitted.inc(out.rate_count)
                if out.rate_count:
                    self.metrics.last_rates_time.set(time.time())
                self.metrics.watermark_ms.labels(str(partition)).set(state.watermark)
                self.metrics.open_windows.labels(str(partition)).set(len(state.open_windows))
                for closed in out.closed:
                    self.metrics.windows_closed.labels(str(partition)).inc()
                    log.info(
                        "partition %d: closed window %s (+%d ms): %d key rates emitted",
                        partition,
                        time.strftime(
                            "%Y-%m-%d %H:%M:%S", time.gmtime(closed.window_start_ms / 1000)
                        ),
                        self.config.window_ms,
                        len(closed),
                    )
            self.metrics.flush_seconds.observe(time.perf_counter() - began)

    def _produce_rates(self, out: FlushResult) -> None:
        """Queue every closed window's key rates to the rates topic (delivery awaited by flush)."""
        rates_topic = self.settings.topics["rates"]
        for closed in out.closed:
            # one compiled pass writes every record's bytes (schemas/rate_columns.py)
            keys, values = encode_key_rates(closed)
            produce_keyed(self.producer, rates_topic, keys, values)

    def _revoked(self, partition: int, state: PartitionState) -> bool:
        """Whether `partition` was revoked while a flush awaited (its new owner takes over)."""
        if self.states.get(partition) is state:
            return False
        log.info("partition %d was revoked during a flush; its new owner takes over", partition)
        return True

    def _apply_to_table(self, writes: list[tuple[bytes, bytes | None]]) -> None:
        """The worker's copy of the table (what a rebalance hands over) takes the writes."""
        data = self.table.data
        for key, value in writes:
            if value is None:
                data.pop(key, None)
            else:
                data[key] = value

    async def _write_changelogs(
        self, writes_by_partition: dict[int, list[tuple[bytes, bytes | None]]]
    ) -> set[int]:
        """Write table entries to the changelog and wait until the broker has every one.

        Why not `Table.send_changelog`: Faust buffers those sends, and its commit path waits for
        that buffer with `ProducerBuffer.flush`, which gives up after 0.1 s without progress. On a
        busy worker the consumer could then commit offsets whose state was not yet in the
        changelog, and a crash lost those events (seen on CI: a window restored without most of its
        counts). The records here are the ones Faust would write (raw key, raw value, None for a
        delete) on the table's own changelog topic, so Faust's restore reads them as its own; they
        go through this worker's idempotent producer, which keeps their order, and `flush` returns
        only when all are acknowledged. Only then are the source messages acked (see `flush`).

        A write whose delivery failed is written again at the next flush with the entry's current
        value (or a delete), so the changelog catches up with the table whatever failed. Returns
        the partitions whose writes of this flush (and every earlier failed one) are all durable.
        """
        data = self.table.data
        topic = self.table.changelog_topic.get_topic_name()
        failed: dict[int, set[bytes]] = {}
        batches: dict[int, list[tuple[bytes, bytes | None]]] = {}
        for partition, writes in writes_by_partition.items():
            retry = self.changelog_failed.pop(partition, set())
            lost = failed.setdefault(partition, set())

            def delivered(err: Any, msg: Any, lost: set[bytes] = lost) -> None:
                if err is not None:
                    lost.add(bytes(msg.key()))

            self._apply_to_table(writes)
            retry.difference_update(key for key, _ in writes)
            batch = [(key, data.get(key)) for key in sorted(retry)] + writes
            batches[partition] = batch
            for key, value in batch:
                self.producer.produce(
                    topic, key=key, value=value, partition=partition, on_delivery=delivered
                )
                self.producer.poll(0)
        loop = asyncio.get_running_loop()
        remaining = await loop.run_in_executor(None, self.producer.flush, 60.0)
        durable: set[int] = set()
        for partition, batch in batches.items():
            if failed[partition]:
                self.changelog_failed.setdefault(partition, set()).update(failed[partition])
                log.error(
                    "partition %d: %d changelog writes failed; not acking, they are written "
                    "again at the next flush",
                    partition,
                    len(failed[partition]),
                )
            elif remaining:
                # their delivery reports come later, to no one: write them all again next time
                self.changelog_failed.setdefault(partition, set()).update(k for k, _ in batch)
                log.error(
                    "partition %d: changelog writes undelivered after 60 s (%d records of the "
                    "worker in all); not acking, they are written again at the next flush",
                    partition,
                    remaining,
                )
            else:
                durable.add(partition)
        return durable


def _event_at(batch: RequestBatch, index: int) -> Any:
    """One event of a big batch without expanding all of it."""
    return _subset_batch(batch, [index]).events()[0]


def _subset_batch(batch: RequestBatch, indices: list[int]) -> RequestBatch:
    """The events at `indices` as a batch with the same header."""

    def pick(col: list[Any] | None) -> list[Any] | None:
        return None if col is None else [col[i] for i in indices]

    return RequestBatch(
        gateway_id=batch.gateway_id,
        seq=batch.seq,
        created_ms=batch.created_ms,
        keys=[batch.keys[i] for i in indices],
        event_time_ms=[batch.event_time_ms[i] for i in indices],
        prompt_tokens=[batch.prompt_tokens[i] for i in indices],
        prefix_tokens=pick(batch.prefix_tokens),
        cached_tokens=pick(batch.cached_tokens),
        destinations=pick(batch.destinations),
        prefix_block_hashes=pick(batch.prefix_block_hashes),
    )


def _subset_summary(summary: RequestSummary, indices: list[int]) -> RequestSummary:
    """The entries at `indices` as a summary with the same header."""
    return RequestSummary(
        gateway_id=summary.gateway_id,
        seq=summary.seq,
        created_ms=summary.created_ms,
        tick_start_ms=summary.tick_start_ms,
        tick_end_ms=summary.tick_end_ms,
        keys=[summary.keys[i] for i in indices],
        counts=[summary.counts[i] for i in indices],
        first_ms=[summary.first_ms[i] for i in indices],
        last_ms=[summary.last_ms[i] for i in indices],
        prompt_tokens_sum=[summary.prompt_tokens_sum[i] for i in indices],
        prefix_tokens_sum=[summary.prefix_tokens_sum[i] for i in indices],
        cached_tokens_sum=[summary.cached_tokens_sum[i] for i in indices],
    )


def create_app(
    settings: Settings,
    config: StreamConfig,
    options: StreamsOptions | None = None,
    *,
    metrics: StreamMetrics | None = None,
    brokers: int = 1,
) -> tuple[faust.App, StreamsRuntime]:
    """Build the Faust app and its runtime; run it with `faust.Worker(app).execute_from_commandline()`.

    `brokers` is the cluster's size (`cacheroute.topics.cluster_size`): the table's changelog is
    replicated like the project's topics (`replication_for`), so a replicated cluster that loses a
    broker loses no window state, and never runs it with fewer than 2 replicas in sync.
    """
    options = options or StreamsOptions()
    warm_up_encoder()
    warm_up_reader()
    warm_up_keys()
    warm_up_fold()
    # Faust creates its changelog (and its internal topics) with these, at replication 1 unless
    # told; it never alters a topic that exists.
    replicas, min_insync = replication_for(settings, brokers)
    datadir = options.datadir or settings.home / "streams" / options.app_id
    datadir.parent.mkdir(parents=True, exist_ok=True)
    app = faust.App(
        options.app_id,
        broker=f"kafka://{settings.bootstrap}",
        # the same SASL/TLS as every confluent-kafka client (cacheroute.kafkasecurity)
        broker_credentials=settings.kafka_security.faust_credentials(),
        store="memory://",
        web_enabled=False,  # metrics are served by prometheus_client on 127.0.0.1 instead
        datadir=str(datadir),
        topic_partitions=settings.requests_partitions,
        broker_session_timeout=options.session_timeout_s,
        broker_heartbeat_interval=1.0,
        broker_commit_interval=options.commit_interval_s,
        consumer_auto_offset_reset="earliest",
        stream_wait_empty=False,
        topic_replication_factor=replicas,
    )
    source = app.topic(
        settings.topics["requests"],
        key_type=bytes,
        value_type=bytes,
        key_serializer="raw",
        value_serializer="raw",
        partitions=settings.requests_partitions,
    )
    # bytes key/value types make Faust use the "raw" codec for the changelog both ways
    table = app.Table(
        "rate-windows",
        default=None,
        partitions=settings.requests_partitions,
        key_type=bytes,
        value_type=bytes,
        extra_topic_configs={"min.insync.replicas": str(min_insync)},
    )
    runtime = StreamsRuntime(
        settings=settings,
        config=config,
        options=options,
        table=table,
        metrics=metrics or StreamMetrics.create(),
        producer=Producer(
            producer_config(settings, partitioner="murmur2_random", **{"linger.ms": 20})
        ),
    )

    @app.agent(source, name="aggregate-rates")
    async def aggregate(stream: Any) -> None:
        manual = stream.noack()
        runtime.stream = manual
        async for event in manual.events():
            runtime.handle(event)
            runtime.metrics.batch_done(time.time())
            partition = event.message.partition
            # a window the watermark has closed is emitted now, not at the next timer tick
            if runtime.due(partition, time.monotonic()) or _closable(runtime.states.get(partition)):
                if runtime.backlogged(partition):
                    await runtime.flush(partition)  # the broker is behind: wait for it
                else:
                    runtime.request_flush(partition)
                    await asyncio.sleep(0)  # let the flusher take its snapshot and send

    @app.task  # type: ignore[untyped-decorator]
    async def flusher() -> None:
        await runtime.run_flusher()

    @app.timer(interval=max(options.flush_interval_s / 2, 0.05))  # type: ignore[untyped-decorator]
    async def flush_idle() -> None:
        now = time.monotonic()
        for partition in list(runtime.states):
            if runtime.due(partition, now) or _closable(runtime.states.get(partition)):
                runtime.request_flush(partition)

    @app.on_rebalance_complete.connect
    async def on_rebalance_complete(sender: Any, /, *args: Any, signal: Any, **kwargs: Any) -> None:
        # Faust sends this just before it resumes the source partitions, seeks them to their
        # committed offsets and only then resumes flow control, which empties every stream
        # buffer. Its consumer is already running (it read the changelog), so without this the
        # agent gets records in between: those it handled before the seek are delivered again
        # after it, and those buffered after the seek are cleared while the consumer's read
        # offset has moved past them, so they are lost until a restart (faust-streaming 0.15,
        # upstream issue 596). Suspended here, delivery waits for Faust's own resume, after the
        # seek and the clearing; the one record per partition that Faust may still deliver twice
        # is skipped by `PartitionState.first_delivery`.
        app.flow_control.suspend()

    @app.on_partitions_revoked.connect
    async def on_revoked(sender: Any, /, *args: Any, signal: Any, **kwargs: Any) -> None:
        revoked = args[0] if args else kwargs.get("revoked", set())
        parts = {tp.partition for tp in revoked if tp.topic == runtime.source_topic}
        if parts:
            log.info("partitions revoked: %s; dropping their in-memory state", sorted(parts))
            runtime.forget(parts)

    return app, runtime


def _closable(state: PartitionState | None) -> bool:
    if state is None or not state.windows:
        return False
    cfg = state.config
    return min(state.windows) + cfg.window_ms + cfg.grace_ms <= state.watermark
