"""The faust-streaming worker: `requests` batches in, `KeyRate` records out, state in a Faust table.

This module is the thin shell around `PartitionState` (pure): it decodes messages, routes malformed
ones to the dead-letter topic, applies batches, and on each flush produces the closed windows' rates
(confluent-kafka: the agent emits ~1 record per key per window, far more than Faust's per-message
producer path handles quickly), writes the table changelog through Faust, and only then acks the
source messages — so Faust commits an offset only after the state that includes it is durable.

Acks are manual (`stream.noack()`): a message is acked at the flush after it was applied. After a
crash Faust restores the table from its changelog and re-delivers the unacked messages;
`PartitionState` skips what a bucket already holds (see state.py), so no count is lost or doubled.
Rates are at-least-once: a crash between producing a window's rates and deleting its state can emit
that window again with the same values; consumers keep the latest record per (key, window).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import faust
from confluent_kafka import Producer

from cacheroute.kafkaio import producer_config
from cacheroute.schemas import (
    KeyRate,
    RequestBatch,
    RequestSummary,
    SchemaError,
    codec_for,
    decode_any,
)
from cacheroute.schemas.errors import format_location
from cacheroute.settings import Settings
from cacheroute.streams.config import StreamConfig
from cacheroute.streams.metrics import StreamMetrics
from cacheroute.streams.state import BatchError, PartitionState, table_prefix

__all__ = ["StreamsOptions", "StreamsRuntime", "create_app"]

log = logging.getLogger(__name__)


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

    @property
    def source_topic(self) -> str:
        """The requests topic."""
        return self.settings.topics["requests"]

    # ------------------------------------------------------------------------------ state
    def state_for(self, partition: int) -> PartitionState:
        """This worker's state of a partition, rebuilt from the restored table on first use."""
        state = self.states.get(partition)
        if state is None:
            prefix = table_prefix(partition)
            entries = [(k, v) for k, v in self.table.data.items() if k.startswith(prefix)]
            state = PartitionState.restore(partition, self.config, entries)
            self.states[partition] = state
            self.last_flush[partition] = time.monotonic()
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
        self, value: bytes | None, key: bytes | None, reason: str, where: str, index: int = -1
    ) -> None:
        """Send a malformed batch or event to the dead-letter topic with the reason."""
        headers: list[tuple[str, str | bytes | None]] = [
            ("cacheroute.reason", reason.encode()),
            ("cacheroute.source", where.encode()),
            ("cacheroute.stage", b"streams"),
        ]
        if index >= 0:
            headers.append(("cacheroute.index", str(index).encode()))
        self.producer.produce(
            self.settings.topics["dead_letter"], value=value, key=key, headers=headers
        )
        self.producer.poll(0)

    def handle(self, event: Any) -> None:
        """Apply one message (synchronous: no await, so flushes see whole messages only)."""
        msg = event.message
        partition, offset = msg.partition, msg.offset
        where = format_location(msg.topic, partition, offset)
        state = self.state_for(partition)
        self.pending.setdefault(partition, []).append(event)
        self.metrics.batches.inc()
        raw = event.value
        try:
            record = decode_any(raw, topic=msg.topic, partition=partition, offset=offset)
            if isinstance(record, RequestBatch):
                result = state.apply_batch(record, offset)
            elif isinstance(record, RequestSummary):
                result = state.apply_summary(record, offset)
            else:
                raise SchemaError(f"a {type(record).__name__} does not belong on {msg.topic}")
        except (SchemaError, BatchError) as exc:
            log.warning("dead-lettering %s: %s", where, exc)
            self.dead_letter(raw, msg.key, str(exc), where)
            self.metrics.batches_dead_lettered.inc()
            return
        for bad in result.bad:
            if isinstance(record, RequestBatch):
                ev = (
                    record.events()[bad.index] if len(record) < 64 else _event_at(record, bad.index)
                )
                body = codec_for(type(ev)).to_json(ev)
            else:
                body = repr(record.keys[bad.index]).encode()
            self.dead_letter(body, msg.key, bad.reason, where, bad.index)
        self.metrics.events_accepted.inc(result.accepted)
        self.metrics.events_late.inc(result.late)
        self.metrics.events_replayed.inc(result.replayed)
        self.metrics.events_dead_lettered.inc(len(result.bad))

    def due(self, partition: int, now: float) -> bool:
        """Whether a partition should flush now."""
        pending = len(self.pending.get(partition, ()))
        if pending >= self.options.flush_max_messages:
            return True
        state = self.states.get(partition)
        stale = now - self.last_flush.get(partition, 0.0) >= self.options.flush_interval_s
        return stale and (pending > 0 or bool(state and state.has_changes))

    async def flush(self, partition: int) -> None:
        """Rates of closed windows -> Kafka; state -> changelog; then ack the applied messages."""
        async with self.lock:
            state = self.states.get(partition)
            if state is None:
                return
            began = time.perf_counter()
            acks = self.pending.pop(partition, [])
            out = state.flush()
            rates_topic = self.settings.topics["rates"]
            encode = codec_for(KeyRate).encode
            for rate in out.rates:
                # validate=False: these values are built here from ints and floats that fit
                blob = encode(rate, validate=False)
                self.producer.produce(rates_topic, key=rate.key.encode(), value=blob)
                self.producer.poll(0)
            # rates and dead letters must be durable before the state that no longer holds them
            loop = asyncio.get_running_loop()
            remaining = await loop.run_in_executor(None, self.producer.flush, 60.0)
            if self.states.get(partition) is not state:
                log.info(
                    "partition %d was revoked during a flush; its new owner takes over", partition
                )
                return
            if remaining:
                log.error(
                    "partition %d: %d records to rates/dead-letter undelivered after 60 s; "
                    "not acking, the messages will be re-delivered",
                    partition,
                    remaining,
                )
                self.pending.setdefault(partition, [])[:0] = acks
                return
            for key, value in out.writes:
                if value is None:
                    self.table.data.pop(key, None)
                    self.table.send_changelog(
                        partition, key, None, key_serializer="raw", value_serializer="raw"
                    )
                else:
                    self.table.data[key] = value
                    self.table.send_changelog(
                        partition, key, value, key_serializer="raw", value_serializer="raw"
                    )
            if self.stream is not None:
                for ev in acks:
                    await self.stream.ack(ev)
            self.last_flush[partition] = time.monotonic()
            self.metrics.rates_emitted.inc(len(out.rates))
            self.metrics.flush_seconds.observe(time.perf_counter() - began)
            self.metrics.watermark_ms.labels(str(partition)).set(state.watermark)
            self.metrics.open_windows.labels(str(partition)).set(len(state.open_windows))
            for window in out.closed_windows:
                self.metrics.windows_closed.labels(str(partition)).inc()
                log.info(
                    "partition %d: closed window %s (+%d ms): %d key rates emitted",
                    partition,
                    time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(window / 1000)),
                    self.config.window_ms,
                    sum(1 for r in out.rates if r.window_start_ms == window),
                )


def _event_at(batch: RequestBatch, index: int) -> Any:
    """One event of a big batch without expanding all of it."""
    small = RequestBatch(
        gateway_id=batch.gateway_id,
        seq=batch.seq,
        created_ms=batch.created_ms,
        keys=[batch.keys[index]],
        event_time_ms=[batch.event_time_ms[index]],
        prompt_tokens=[batch.prompt_tokens[index]],
        prefix_tokens=None if batch.prefix_tokens is None else [batch.prefix_tokens[index]],
        cached_tokens=None if batch.cached_tokens is None else [batch.cached_tokens[index]],
        destinations=None if batch.destinations is None else [batch.destinations[index]],
        prefix_block_hashes=None
        if batch.prefix_block_hashes is None
        else [batch.prefix_block_hashes[index]],
    )
    return small.events()[0]


def create_app(
    settings: Settings,
    config: StreamConfig,
    options: StreamsOptions | None = None,
    *,
    metrics: StreamMetrics | None = None,
) -> tuple[faust.App, StreamsRuntime]:
    """Build the Faust app and its runtime; run it with `faust.Worker(app).execute_from_commandline()`."""
    options = options or StreamsOptions()
    datadir = options.datadir or settings.home / "streams" / options.app_id
    datadir.parent.mkdir(parents=True, exist_ok=True)
    app = faust.App(
        options.app_id,
        broker=f"kafka://{settings.bootstrap}",
        store="memory://",
        web_enabled=False,  # metrics are served by prometheus_client on 127.0.0.1 instead
        datadir=str(datadir),
        topic_partitions=settings.requests_partitions,
        broker_session_timeout=options.session_timeout_s,
        broker_heartbeat_interval=1.0,
        broker_commit_interval=options.commit_interval_s,
        consumer_auto_offset_reset="earliest",
        stream_wait_empty=False,
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
            partition = event.message.partition
            if runtime.due(partition, time.monotonic()):
                await runtime.flush(partition)

    @app.timer(interval=max(options.flush_interval_s / 2, 0.05))  # type: ignore[untyped-decorator]
    async def flush_idle() -> None:
        now = time.monotonic()
        for partition in list(runtime.states):
            if runtime.due(partition, now) or _closable(runtime.states.get(partition)):
                await runtime.flush(partition)

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
