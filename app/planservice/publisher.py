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

Anyone who can write to the topic can forge records, so recovery counts a version only if its
record passes the protocol's bounds and the version is plausible (`version_ceiling`: at most a
million above the newest verified version): a forged header at 2^63 - 1 must not leave the planner
without a version to write. And compaction keeps only the newest record per key, so a foreign
tombstone or value under `header` (or a chunk key of the live version) would, once compacted, erase
the live plan for every reader that starts afterwards. The publisher therefore watches the topic
(`watch`) and knows the offset of its own newest write per key; a newer record under a key of the
live version is foreign, and `repair` re-publishes the live version's records there, byte for byte,
in one transaction, header last. docs/PLAN_PROTOCOL.md has the rules.
"""

from __future__ import annotations

import logging
import time
from collections import Counter as Tally
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)

from cacheroute.dispatcher.reader import LivePlan, drain, plans_consumer, scan_plans
from cacheroute.errors import CacheRouteError
from cacheroute.kafkaio import KafkaRecord, producer_config
from cacheroute.planner import Plan
from cacheroute.planner.assembly import Applied, PlanAssembler
from cacheroute.planner.protocol import (
    DEFAULT_MAX_CHUNK_BYTES,
    HEADER_KEY,
    MAX_PLAN_VERSION,
    EncodedPlan,
    chunk_key,
    chunk_problem,
    encode_plan,
    header_problem,
    parse_key,
    peek_chunk,
    version_ceiling,
)
from cacheroute.schemas import PlanHeader, SchemaError, codec_for
from cacheroute.settings import Settings

__all__ = [
    "FencedError",
    "ForeignRecord",
    "PlanPublisher",
    "PublishResult",
    "Recovery",
    "RepairResult",
]

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
    """Highest version that counts in any header or chunk, committed or aborted (0: none)."""
    records: int
    seconds: float
    ignored: dict[str, int] = field(default_factory=dict)
    """Headers and chunks whose version did not count, by reason: `out-of-range` (the record
    breaks the protocol's bounds) or `implausible-version` (above `version_ceiling`)."""
    highest_ignored: int | None = None
    """The highest version among the `implausible-version` records (None: there were none)."""
    ceiling: int = MAX_PLAN_VERSION
    """The plausibility bound used: the highest version an unverified record could count with."""
    damaged: tuple[bytes, ...] = ()
    """Keys of the live version whose newest committed record is not the live version's record
    (a foreign tombstone or value); `repair()` re-publishes them."""


@dataclass(frozen=True)
class ForeignRecord:
    """A record on the plans topic that this publisher did not write, newer than its own write
    under the same key."""

    where: str
    key: bytes
    tombstone: bool
    damaging: bool
    """Whether it shadows a record of the live version (compaction would erase that record)."""

    @property
    def kind(self) -> str:
        """`header` or `chunk`."""
        return parse_key(self.key)[0]


@dataclass(frozen=True)
class RepairResult:
    """The live version re-published over foreign records."""

    version: int
    chunks: int
    """Chunk records re-published (the header always is)."""
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


class _WrittenVersions:
    """The highest version that counts among every header and chunk written (recovery's second
    pass): records that break the protocol's bounds, or whose version is above the plausibility
    `ceiling`, are counted by reason instead (see `version_ceiling`)."""

    def __init__(self, ceiling: int, verified: int | None) -> None:
        self.ceiling = ceiling
        self.highest = verified or 0
        self.ignored: Tally[str] = Tally()
        self.highest_ignored: int | None = None

    def offer(self, record: KafkaRecord) -> None:
        kind, _ = parse_key(record.key)
        value = record.value
        if value is None or kind == "other":
            return
        if kind == "chunk":
            peeked = peek_chunk(value)
            if peeked is None:
                return
            if chunk_problem(peeked[0], peeked[1], len(value)) is not None:
                self.ignored["out-of-range"] += 1
                return
            self._count(peeked[0])
            return
        try:
            header = codec_for(PlanHeader).decode(value)
        except SchemaError:  # garbage has no version to respect
            return
        if header_problem(header) is not None:
            self.ignored["out-of-range"] += 1
            return
        self._count(header.version)

    def _count(self, version: int) -> None:
        if version <= self.ceiling:
            self.highest = max(self.highest, version)
            return
        self.ignored["implausible-version"] += 1
        self.highest_ignored = max(self.highest_ignored or version, version)


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
        clock: Callable[[], float] = time.time,
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
                # lz4, not the producers' zstd: every gateway decompresses every version in the
                # time the plan takes to reach it, the planner compresses it once. Measured with
                # `bench propagation` (8 gateways, 61k admitted keys): 1.15 MB a version on the
                # broker against 0.92 MB, p99 262-290 ms against 311-327 ms.
                "compression.type": "lz4",
            },
        )
        self._clock = clock
        self._producer: Producer | None = None
        self._watcher: Consumer | None = None
        self._next_version = 1
        self._chunk_keys: frozenset[bytes] = frozenset()
        self._usable = False
        self._live: EncodedPlan | None = None
        """The live version's records, byte for byte (what `repair` re-publishes)."""
        self._owned: dict[bytes, int] = {}
        """Key -> offset of the newest record this publisher wrote there (or recovered as the live
        version's): a newer record under the key is foreign."""
        self._written: dict[bytes, int] = {}
        """Offsets of the open transaction's records (kept in `_owned` once it commits)."""
        self._damaged: set[bytes] = set()

    @property
    def usable(self) -> bool:
        """False before `start()` and after fencing or a fatal error: start a new publisher."""
        return self._usable

    @property
    def next_version(self) -> int:
        """The version the next publish must carry (at least; never lower)."""
        return self._next_version

    @property
    def live_version(self) -> int | None:
        """The version this publisher last committed or recovered as live (None: none)."""
        return None if self._live is None else self._live.version

    @property
    def damaged(self) -> frozenset[bytes]:
        """Keys of the live version shadowed by a foreign record; `repair()` re-publishes them."""
        return frozenset(self._damaged)

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
        if recovery.next_version > MAX_PLAN_VERSION:
            raise CacheRouteError(
                f"the live plan on {self.topic} has version {recovery.max_written_version}, the "
                f"protocol's maximum ({MAX_PLAN_VERSION}): no version is left to write. It passed "
                "every check, so a writer other than the planner made it; restrict writes to the "
                "topic and recreate it (`cacheroute topics ensure` after deleting it)"
            )
        self._next_version = recovery.next_version
        self._chunk_keys = recovery.live_chunk_keys
        self._usable = True
        return recovery

    def _recover(self, timeout: float, started: float) -> Recovery:
        assembler = PlanAssembler(defer_headers=True)
        latest: dict[bytes, bool] = {}  # chunk key -> newest committed record has a value
        newest: dict[bytes, tuple[int, bytes | None]] = {}  # protocol key -> (offset, value)
        end = [OFFSET_BEGINNING]

        def committed(record: KafkaRecord) -> None:
            kind, _ = parse_key(record.key)
            if kind != "other" and record.key is not None:
                newest[record.key] = (record.offset, record.value)
                if kind == "chunk":
                    latest[record.key] = record.value is not None
            assembler.offer(record.key, record.value, record.where)

        def ended(offset: int) -> None:
            end[0] = offset

        records = scan_plans(self.settings, committed, timeout=timeout, on_end=ended)
        applied: Applied | None = None
        for outcome in assembler.finish_catch_up():
            if isinstance(outcome, Applied):
                applied = outcome
        live = None if applied is None else LivePlan(applied.plan, applied.header, applied.where, 0)
        verified = None if applied is None else applied.header.version
        written = _WrittenVersions(version_ceiling(verified, int(self._clock() * 1000)), verified)
        scan_plans(self.settings, written.offer, isolation="read_uncommitted", timeout=timeout)
        damaged = self._adopt(applied, newest)
        self._open_watcher(end[0])
        return Recovery(
            next_version=written.highest + 1,
            live=live,
            live_chunk_keys=frozenset(k for k, has_value in latest.items() if has_value),
            max_written_version=written.highest,
            records=records,
            seconds=time.perf_counter() - started,
            ignored=dict(written.ignored),
            highest_ignored=written.highest_ignored,
            ceiling=written.ceiling,
            damaged=damaged,
        )

    def _adopt(
        self, applied: Applied | None, newest: dict[bytes, tuple[int, bytes | None]]
    ) -> tuple[bytes, ...]:
        """Take the recovered live version as this publisher's own; return its damaged keys.

        A key is damaged when its newest committed record is not the live version's record: after
        compaction a reader would find that record instead (or nothing, for a tombstone).
        """
        self._owned = {}
        self._damaged = set()
        self._live = None
        if applied is None:
            return ()
        self._live = EncodedPlan(
            applied.header.version, applied.header, applied.header_value, applied.chunk_values
        )
        damaged: list[bytes] = []
        for key, value in self._live_records():
            offset, have = newest.get(key, (-1, None))
            if have is not None and have == value:
                self._owned[key] = offset
            else:
                damaged.append(key)
        self._damaged = set(damaged)
        return tuple(damaged)

    def _live_records(self) -> list[tuple[bytes, bytes]]:
        """(key, value) of every record of the live version, chunks first, header last."""
        live = self._live
        if live is None:
            return []
        out = [(chunk_key(i), value) for i, value in enumerate(live.chunks)]
        out.append((HEADER_KEY, live.header_bytes))
        return out

    def _open_watcher(self, offset: int) -> None:
        """Read the topic from `offset` on (where recovery stopped), for `watch`."""
        if self._watcher is not None:
            self._watcher.close()
        self._watcher = plans_consumer(
            self.settings, "read_committed", f"cacheroute-plan-watch[{self.planner_id}]"
        )
        self._watcher.assign([TopicPartition(self.topic, 0, offset)])

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
        if plan.version > MAX_PLAN_VERSION:
            raise CacheRouteError(
                f"refusing to publish version {plan.version}: above the protocol's maximum "
                f"{MAX_PLAN_VERSION}, so no reader would apply it"
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
            self._written = {}
            for i, value in enumerate(encoded.chunks):
                self._produce(producer, chunk_key(i), value)
                if self._on_chunk is not None:
                    self._on_chunk(i, n)
            for key in stale:
                self._produce(producer, key, None)
            self._produce(producer, HEADER_KEY, encoded.header_bytes)
            self._commit(producer, timeout)
        except KafkaException as exc:
            self._failed(producer, exc.args[0], f"publishing version {plan.version}")
        self._committed(producer, [HEADER_KEY, *(chunk_key(i) for i in range(n)), *stale], timeout)
        self._live = encoded
        self._damaged.clear()  # every key of the live version was just written
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

    # ----------------------------------------------------------------- watching and repair
    def watch(self, timeout: float = 0.0) -> list[ForeignRecord]:
        """Read what was committed to the topic since the last look; return the foreign records.

        A record under `header` or `chunk/N` is foreign when it is newer than this publisher's own
        newest write under that key (delivery reports give the offsets of its writes, served right
        after each commit, in this thread, before it reads them back: it never mistakes its own
        records). A foreign record under a key of the live version (`damaging`) marks that key for
        `repair`. A message whose handling raises is logged and skipped, never the ones after it.
        """
        watcher = self._watcher
        if watcher is None:
            return []
        found: list[ForeignRecord] = []
        for msg in drain(watcher, 1000, timeout):
            try:
                foreign = self._look(msg)
            except Exception:  # per message: the next one may be the record that matters
                log.exception(
                    "plan watcher: the record at offset %s could not be read", msg.offset()
                )
                continue
            if foreign is not None:
                found.append(foreign)
        return found

    def _look(self, msg: Message) -> ForeignRecord | None:
        err = msg.error()
        if err is not None:
            if err.code() != KafkaError._PARTITION_EOF:
                log.debug("plan watcher: %s", err)
            return None
        key = msg.key()
        kind, index = parse_key(key)
        offset = msg.offset() or 0
        if key is None or kind == "other" or offset <= self._owned.get(key, -1):
            return None  # not a protocol key, or this publisher's own (or older) record
        live = self._live
        damaging = live is not None and (kind == "header" or index < len(live.chunks))
        if damaging:
            self._damaged.add(key)
        where = f"{msg.topic()}[{msg.partition()}]@{offset}"
        return ForeignRecord(where, key, msg.value() is None, damaging)

    def repair(self, timeout: float = 60.0) -> RepairResult | None:
        """Re-publish the live version's records under the damaged keys, header last, in one
        transaction (None: nothing to repair).

        The very same bytes under the same version: readers that hold the version ignore them
        (`republished`, `stale-chunk`), a reader starting later finds the version whole, and no
        version number is spent, so nothing changes for routing.
        """
        producer = self._producer
        live = self._live
        if producer is None or not self._usable:
            raise CacheRouteError("the publisher is not started (or was fenced); call start()")
        if live is None or not self._damaged:
            return None
        began = time.perf_counter()
        indices = sorted(
            i
            for key in self._damaged
            if (parsed := parse_key(key))[0] == "chunk" and (i := parsed[1]) < len(live.chunks)
        )
        try:
            producer.begin_transaction()
            self._written = {}
            for i in indices:
                self._produce(producer, chunk_key(i), live.chunks[i])
            self._produce(producer, HEADER_KEY, live.header_bytes)
            self._commit(producer, timeout)
        except KafkaException as exc:
            self._failed(producer, exc.args[0], f"re-publishing version {live.version}")
        self._committed(producer, [HEADER_KEY, *(chunk_key(i) for i in indices)], timeout)
        self._damaged.clear()
        return RepairResult(live.version, len(indices), time.perf_counter() - began)

    # ---------------------------------------------------------------------------- records
    def _delivered(self, err: KafkaError | None, msg: Message) -> None:
        if err is not None:  # a failed record (its transaction aborts); touch nothing of it
            return
        key = msg.key()
        if key is not None:
            self._written[key] = msg.offset() or 0

    def _committed(self, producer: Producer, keys: list[bytes], timeout: float) -> None:
        """The transaction committed: its records are this publisher's newest writes.

        The commit delivered every record; `flush` serves their delivery reports (the offsets)
        before `watch` can read the records back, in this same thread.
        """
        producer.flush(timeout)
        missing = [k for k in keys if k not in self._written]
        if missing:  # never seen; without its offset a record of ours would look foreign
            log.warning("no delivery report for %d record(s) of the last transaction", len(missing))
        self._owned.update(self._written)
        self._written = {}

    def _produce(self, producer: Producer, key: bytes, value: bytes | None) -> None:
        deadline = time.monotonic() + 60.0
        while True:
            try:
                producer.produce(self.topic, key=key, value=value, on_delivery=self._delivered)
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

    def _failed(self, producer: Producer, err: Any, what: str) -> None:
        """Turn a transaction error into FencedError or a CacheRouteError; abort if possible."""
        self._written = {}
        code = err.code() if isinstance(err, KafkaError) else None
        if code in _FENCED_CODES:
            self._usable = False
            raise FencedError(
                f"{what} refused: another planner instance took over transactional id "
                f"{self.transactional_id!r} ({err})"
            )
        if isinstance(err, KafkaError) and err.fatal():
            self._usable = False
            raise CacheRouteError(f"{what} failed fatally: {err}")
        try:
            producer.abort_transaction(30)
        except KafkaException as exc:
            self._usable = False
            raise CacheRouteError(
                f"{what} failed ({err}) and aborting it failed ({exc.args[0]}); the previous "
                "version stays live, the publisher restarts",
                retriable=True,
            ) from exc
        raise CacheRouteError(
            f"{what} failed: {err}; the previous version stays live", retriable=True
        )

    def close(self) -> None:
        """Release the producer and the watcher (no transaction is open between publishes)."""
        producer, self._producer = self._producer, None
        watcher, self._watcher = self._watcher, None
        self._usable = False
        if producer is not None:
            producer.flush(5)
        if watcher is not None:
            watcher.close()
