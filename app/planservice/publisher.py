"""Publishing plan versions: one Kafka transaction per version, fencing, and version recovery.

A version is written as one transaction: its chunks (`chunk/00000` ...), tombstones for the chunk
keys of the previous version that this one no longer uses, and last the header (`header`), the
commit record. Consumers read with `isolation.level=read_committed`, so a planner killed at any
point of a publish leaves nothing they can see: the previous version stays live. Compaction also
drops aborted records, so even a read_uncommitted reader of a compacted topic finds no half version.

All planner instances of a group share one `transactional.id`. `start()` calls
`init_transactions()`, which aborts whatever transaction the previous holder left open and fences
that holder: a zombie ex-leader that wakes up cannot commit any more (ProducerFenced -> FencedError).
Only then does `start()` read the topic to recover the next version number, so no committed version
can be missed: versions strictly increase across restarts and takeovers, and never two different
plans are committed under one version. Recovery reads the topic twice: read_committed for the live
plan (the churn-aware planner's `prev`), read_uncommitted for the highest version ever *written*,
aborted ones included, so a number is never reused even for a version only a read_uncommitted
reader could have seen.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer

from cacheroute.errors import CacheRouteError
from cacheroute.kafkaio import KafkaRecord, producer_config
from cacheroute.planner import Plan
from cacheroute.planner.assembly import Applied, PlanAssembler
from cacheroute.planner.protocol import (
    DEFAULT_MAX_CHUNK_BYTES,
    HEADER_KEY,
    chunk_key,
    encode_plan,
    parse_key,
    peek_chunk,
)
from cacheroute.planservice.reader import LivePlan, scan_plans
from cacheroute.schemas import PlanHeader, SchemaError, codec_for
from cacheroute.settings import Settings

__all__ = ["FencedError", "PlanPublisher", "PublishResult", "Recovery"]

log = logging.getLogger(__name__)

_FENCED_CODES = {
    KafkaError._FENCED,
    KafkaError.PRODUCER_FENCED,
    KafkaError.INVALID_PRODUCER_EPOCH,
}


class FencedError(CacheRouteError):
    """A newer planner instance with the same transactional id took over; this one must stop."""


@dataclass(frozen=True)
class Recovery:
    """What `PlanPublisher.start` found on the plans topic."""

    next_version: int
    live: LivePlan | None
    """The newest committed, verified version (None on an empty topic)."""
    live_chunk_keys: frozenset[bytes]
    """Chunk keys whose newest committed record is a value (not a tombstone)."""
    max_written_version: int
    """Highest version in any header or chunk, committed or aborted (0: none)."""
    records: int
    seconds: float


@dataclass(frozen=True)
class PublishResult:
    """One committed version."""

    version: int
    chunks: int
    tombstones: int
    bytes: int
    seconds: float
    encode_seconds: float


class PlanPublisher:
    """Writes plan versions to the plans topic transactionally (see the module docstring)."""

    def __init__(
        self,
        settings: Settings,
        *,
        transactional_id: str,
        planner_id: str = "",
        max_chunk_bytes: int = DEFAULT_MAX_CHUNK_BYTES,
        transaction_timeout_ms: int = 60_000,
        on_chunk: Callable[[int, int], None] | None = None,
    ) -> None:
        self.settings = settings
        self.topic = settings.topics["plans"]
        self.transactional_id = transactional_id
        self.planner_id = planner_id
        self.max_chunk_bytes = max_chunk_bytes
        self._on_chunk = on_chunk
        self._config = producer_config(
            settings,
            **{
                "transactional.id": transactional_id,
                "transaction.timeout.ms": transaction_timeout_ms,
                "linger.ms": 20,
            },
        )
        self._producer: Producer | None = None
        self._next_version = 1
        self._chunk_keys: frozenset[bytes] = frozenset()
        self._usable = False

    @property
    def usable(self) -> bool:
        """False before `start()` and after fencing or a fatal error: start a new publisher."""
        return self._usable

    @property
    def next_version(self) -> int:
        """The version the next publish must carry (at least; never lower)."""
        return self._next_version

    # --------------------------------------------------------------------------- start-up
    def start(self, timeout: float = 60.0) -> Recovery:
        """Fence older holders of the transactional id, then recover the topic's state."""
        started = time.perf_counter()
        self._producer = Producer(self._config)
        try:
            self._producer.init_transactions(timeout)
        except KafkaException as exc:
            raise CacheRouteError(
                f"could not initialise transactions as {self.transactional_id!r} at "
                f"{self.settings.bootstrap}: {exc.args[0]}; is the broker up?",
                retriable=True,
            ) from exc
        recovery = self._recover(timeout, started)
        self._next_version = recovery.next_version
        self._chunk_keys = recovery.live_chunk_keys
        self._usable = True
        return recovery

    def _recover(self, timeout: float, started: float) -> Recovery:
        assembler = PlanAssembler(defer_headers=True)
        latest: dict[bytes, bool] = {}  # chunk key -> newest committed record has a value
        versions = [0]

        def committed(record: KafkaRecord) -> None:
            kind, _ = parse_key(record.key)
            if kind == "chunk" and record.key is not None:
                latest[record.key] = record.value is not None
            assembler.offer(record.key, record.value, record.where)

        def everything(record: KafkaRecord) -> None:
            kind, _ = parse_key(record.key)
            if kind == "chunk":
                peeked = peek_chunk(record.value)
                if peeked is not None:
                    versions.append(peeked[0])
            elif kind == "header" and record.value is not None:
                with contextlib.suppress(SchemaError):  # garbage has no version to respect
                    versions.append(codec_for(PlanHeader).decode(record.value).version)

        records = scan_plans(self.settings, committed, timeout=timeout)
        live: LivePlan | None = None
        for outcome in assembler.finish_catch_up():
            if isinstance(outcome, Applied):
                live = LivePlan(outcome.plan, outcome.header, outcome.where, 0)
        scan_plans(self.settings, everything, isolation="read_uncommitted", timeout=timeout)
        highest = max(*versions, 0 if live is None else live.version)
        return Recovery(
            next_version=highest + 1,
            live=live,
            live_chunk_keys=frozenset(k for k, has_value in latest.items() if has_value),
            max_written_version=highest,
            records=records,
            seconds=time.perf_counter() - started,
        )

    # ---------------------------------------------------------------------------- publish
    def publish(
        self, plan: Plan, *, inputs_until_ms: int = 0, timeout: float = 60.0
    ) -> PublishResult:
        """Write `plan` as one transaction; raise FencedError when another instance took over.

        `plan.version` must be at least `next_version`. Whatever happens, `next_version` moves past
        it: a version number that was attempted is never used again.
        """
        producer = self._producer
        if producer is None or not self._usable:
            raise CacheRouteError("the publisher is not started (or was fenced); call start()")
        if plan.version < self._next_version:
            raise CacheRouteError(
                f"refusing to publish version {plan.version}: versions must increase "
                f"(next is {self._next_version})"
            )
        self._next_version = plan.version + 1
        began = time.perf_counter()
        encoded = encode_plan(
            plan,
            planner_id=self.planner_id,
            inputs_until_ms=inputs_until_ms,
            max_chunk_bytes=self.max_chunk_bytes,
        )
        encoded_at = time.perf_counter()
        n = len(encoded.chunks)
        stale = sorted(k for k in self._chunk_keys if parse_key(k)[1] >= n)
        try:
            producer.begin_transaction()
            for i, value in enumerate(encoded.chunks):
                self._produce(producer, chunk_key(i), value)
                if self._on_chunk is not None:
                    self._on_chunk(i, n)
            for key in stale:
                self._produce(producer, key, None)
            self._produce(producer, HEADER_KEY, encoded.header_bytes)
            self._commit(producer, timeout)
        except KafkaException as exc:
            self._failed(producer, exc.args[0], plan.version)
        self._chunk_keys = frozenset(chunk_key(i) for i in range(n))
        done = time.perf_counter()
        return PublishResult(
            version=plan.version,
            chunks=n,
            tombstones=len(stale),
            bytes=encoded.total_bytes,
            seconds=done - began,
            encode_seconds=encoded_at - began,
        )

    def _produce(self, producer: Producer, key: bytes, value: bytes | None) -> None:
        deadline = time.monotonic() + 60.0
        while True:
            try:
                producer.produce(self.topic, key=key, value=value)
                producer.poll(0)
                return
            except BufferError:  # local queue full: let it drain
                if time.monotonic() > deadline:
                    raise KafkaException(
                        KafkaError(KafkaError._QUEUE_FULL, "producer queue full for 60 s")
                    ) from None
                producer.poll(0.1)

    def _commit(self, producer: Producer, timeout: float) -> None:
        for attempt in range(3):
            try:
                producer.commit_transaction(timeout)
                return
            except KafkaException as exc:
                err: KafkaError = exc.args[0]
                if not err.retriable() or attempt == 2:
                    raise
                log.warning("committing the plan transaction: %s; retrying", err)

    def _failed(self, producer: Producer, err: Any, version: int) -> None:
        """Turn a transaction error into FencedError or a CacheRouteError; abort if possible."""
        code = err.code() if isinstance(err, KafkaError) else None
        if code in _FENCED_CODES:
            self._usable = False
            raise FencedError(
                f"publishing version {version} refused: another planner instance took over "
                f"transactional id {self.transactional_id!r} ({err})"
            )
        if isinstance(err, KafkaError) and err.fatal():
            self._usable = False
            raise CacheRouteError(f"publishing version {version} failed fatally: {err}")
        try:
            producer.abort_transaction(30)
        except KafkaException as exc:
            self._usable = False
            raise CacheRouteError(
                f"publishing version {version} failed ({err}) and aborting it failed "
                f"({exc.args[0]}); the previous version stays live, the publisher restarts",
                retriable=True,
            ) from exc
        raise CacheRouteError(
            f"publishing version {version} failed: {err}; the previous version stays live",
            retriable=True,
        )

    def close(self) -> None:
        """Release the producer (no transaction is open between publishes)."""
        producer, self._producer = self._producer, None
        self._usable = False
        if producer is not None:
            producer.flush(5)
