"""Assembling plan versions from plan-topic records: the follower's state machine, pure.

Records go in one at a time, in log order (key, value, where); what comes out says what happened:
a version was `Applied` (complete, checksummed, valid), `Rejected` (its header arrived but the
version is incomplete, corrupt, invalid, out of the protocol's bounds or older than the live one), a
record was `Ignored` (tombstone, unknown key, undecodable, stale, a byte-identical re-publication of
the live header), or a chunk or deferred header was `Buffered`. The shell counts and logs the
outcomes; the live plan only ever changes to a verified newer version, so an incomplete, corrupt or
forged version leaves the previous plan live, and a tombstone or garbage under any key changes
nothing a reader holds.

Chunk values are kept as raw bytes and decoded only when their header arrives and the checksum
matches, and `defer_headers` (for catching up from the start of the topic) holds headers until the
end of the log is reached, then applies only the newest version that verifies: a follower starting
on an uncompacted topic with several versions decodes one of them, not all.

Anyone who can write to the topic can forge records, so nothing a record claims sizes memory: a
header's counts are bounded before anything is allocated (`header_problem`), what is missing is
counted over the chunks that arrived, not the chunks claimed, and every buffer is bounded in
versions. Buffers are evicted least recently *updated* first, not lowest version first: a forged
chunk with a huge version must not outrank every real version to come.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from cacheroute.planner.errors import PlannerError
from cacheroute.planner.plan import Plan
from cacheroute.planner.protocol import (
    chunk_checksum,
    chunk_problem,
    decode_chunk_columns,
    header_problem,
    parse_key,
    peek_chunk,
    plan_from_columns,
)
from cacheroute.schemas import PlanHeader, SchemaError, codec_for

__all__ = [
    "Applied",
    "Buffered",
    "IgnoreReason",
    "Ignored",
    "Outcome",
    "PlanAssembler",
    "RejectReason",
    "Rejected",
]

RejectReason = Literal["incomplete", "checksum", "invalid", "stale", "out-of-range"]
IgnoreReason = Literal[
    "tombstone",
    "unknown-key",
    "undecodable",
    "key-mismatch",
    "stale-chunk",
    "superseded",
    "out-of-range",
    "republished",
]

_EVICTED_MEMORY = 16
"""Evicted versions remembered, so their late chunks are ignored instead of buffered again."""


@dataclass(frozen=True, slots=True)
class Applied:
    """Version `plan.version` is complete and verified: it is the live plan now."""

    plan: Plan
    header: PlanHeader
    where: str
    chunk_bytes: int
    header_value: bytes = b""
    """The header record's value as it was on the topic."""
    chunk_values: tuple[bytes, ...] = ()
    """The chunk values in index order, as on the topic: what a planner re-publishes, byte for
    byte, when a foreign record lands on a key of the live version (docs/PLAN_PROTOCOL.md)."""


@dataclass(frozen=True, slots=True)
class Rejected:
    """A header arrived but its version cannot be applied; the live plan stays."""

    version: int
    reason: RejectReason
    detail: str
    where: str


@dataclass(frozen=True, slots=True)
class Ignored:
    """A record that is not part of any version this reader will apply."""

    reason: IgnoreReason
    detail: str
    where: str


@dataclass(frozen=True, slots=True)
class Buffered:
    """A chunk (index >= 0) or a deferred header (index -1) was stored until its version commits."""

    version: int
    index: int
    evicted: int | None = None
    """A pending version dropped to make room (its chunks can no longer complete)."""


Outcome = Applied | Rejected | Ignored | Buffered


@dataclass(frozen=True, slots=True)
class _Deferred:
    header: PlanHeader
    value: bytes
    where: str


class PlanAssembler:
    """Builds verified plans from plan-topic records (see the module docstring).

    `max_pending_versions` bounds memory: chunks of at most that many unfinished versions are kept
    (the least recently updated is dropped first, preferring versions whose header is not waiting in
    a catch-up), and a catch-up holds at most `max_pending_versions + 1` headers (the earliest
    arrived is dropped first). `live_version` starts the reader above a version it already has.
    """

    def __init__(
        self,
        *,
        max_pending_versions: int = 3,
        live_version: int = 0,
        defer_headers: bool = False,
        pause: Callable[[], None] | None = None,
    ) -> None:
        if max_pending_versions < 1:
            raise PlannerError("max_pending_versions must be >= 1")
        self._max_pending = max_pending_versions
        self._live = live_version
        self._live_header: bytes | None = None
        self._defer = defer_headers
        self._pause = pause
        """Called between decode/validation steps (gateways pass a GIL yield)."""
        self._pending: dict[int, dict[int, bytes]] = {}
        """version -> index -> chunk value; dict order is update order (least recent first)."""
        self._evicted: deque[int] = deque(maxlen=_EVICTED_MEMORY)
        self._deferred: dict[int, _Deferred] = {}
        """Catch-up: headers whose chunks had all arrived, in arrival order."""
        self._unfinished: dict[int, tuple[str, str]] = {}
        """Catch-up: headers whose chunks had not all arrived: version -> (what is missing, where)."""

    @property
    def live_version(self) -> int:
        """The newest applied version (or the starting one); older versions are stale."""
        return self._live

    @property
    def deferring(self) -> bool:
        """Whether headers are held until `finish_catch_up`."""
        return self._defer

    @property
    def pending_versions(self) -> tuple[int, ...]:
        """Versions with buffered chunks, ascending."""
        return tuple(sorted(self._pending))

    @property
    def deferred_versions(self) -> tuple[int, ...]:
        """Versions whose header is held until `finish_catch_up` (complete or not), ascending."""
        return tuple(sorted({*self._deferred, *self._unfinished}))

    def offer(
        self, key: bytes | None, value: bytes | bytearray | memoryview | None, where: str = ""
    ) -> Outcome:
        """Take the next record of the plans topic (in log order)."""
        kind, index = parse_key(key)
        if kind == "other":
            return Ignored(
                "unknown-key", f"key {key!r} is neither 'header' nor 'chunk/NNNNN'", where
            )
        if value is None:
            return Ignored("tombstone", f"tombstone for {key!r}", where)
        if kind == "chunk":
            return self._offer_chunk(index, value, where)
        return self._offer_header(value, where)

    def _offer_header(self, value: bytes | bytearray | memoryview, where: str) -> Outcome:
        raw = bytes(value)
        try:
            header = codec_for(PlanHeader).decode(raw)
        except SchemaError as exc:
            return Ignored("undecodable", str(exc), where)
        problem = header_problem(header)  # before anything is sized by what the header claims
        if problem is not None:
            return Rejected(header.version, "out-of-range", problem, where)
        v = header.version
        if v <= self._live:
            if v == self._live and raw == self._live_header:
                return Ignored("republished", f"the live version {v} again, byte for byte", where)
            return Rejected(
                v, "stale", f"version {v} is not newer than the live version {self._live}", where
            )
        if not self._defer:
            return self._commit(header, raw, where)
        missing = _missing(self._pending.get(v, {}), header.chunk_count)
        self._deferred.pop(v, None)  # a later header of a version replaces the earlier one
        self._unfinished.pop(v, None)
        if missing is None:
            self._deferred[v] = _Deferred(header, raw, where)
            while len(self._deferred) > self._max_pending + 1:
                del self._deferred[next(iter(self._deferred))]
        else:
            self._unfinished[v] = (missing, where)
            while len(self._unfinished) > self._max_pending + 1:
                del self._unfinished[min(self._unfinished)]
        return Buffered(v, -1)

    def _offer_chunk(
        self, index: int, value: bytes | bytearray | memoryview, where: str
    ) -> Outcome:
        peeked = peek_chunk(value)
        if peeked is None:
            return Ignored("undecodable", "value under a chunk key is not a PlanChunk", where)
        version, inner = peeked
        if inner != index:
            return Ignored(
                "key-mismatch", f"chunk {inner} of version {version} under {index}", where
            )
        problem = chunk_problem(version, inner, len(value))
        if problem is not None:
            return Ignored("out-of-range", problem, where)
        if version <= self._live:
            return Ignored("stale-chunk", f"chunk of version {version} <= live {self._live}", where)
        chunks = self._pending.pop(version, None)
        evicted: int | None = None
        if chunks is None:
            if version in self._evicted:
                return Ignored(
                    "stale-chunk", f"chunk of version {version}, whose chunks were dropped", where
                )
            chunks = {}
            if len(self._pending) >= self._max_pending:
                evicted = self._evict()
        chunks[index] = bytes(value)
        self._pending[version] = chunks  # now the most recently updated
        return Buffered(version, index, evicted)

    def _evict(self) -> int:
        """Drop the least recently updated pending version, one without a held header if any."""
        victim = next((v for v in self._pending if v not in self._deferred), None)
        if victim is None:
            victim = next(iter(self._pending))
        del self._pending[victim]
        self._deferred.pop(victim, None)  # its header can no longer verify
        self._evicted.append(victim)
        return victim

    def finish_catch_up(self) -> list[Outcome]:
        """Stop deferring; apply the newest deferred version that verifies (newest first).

        Older deferred versions are `superseded`, not rejected: they were superseded in the log, so
        their chunks may legitimately have been compacted away.
        """
        self._defer = False
        outcomes: list[Outcome] = []
        applied = False
        for version in sorted({*self._deferred, *self._unfinished}, reverse=True):
            held = self._deferred.get(version)
            where = held.where if held is not None else self._unfinished[version][1]
            if applied:
                outcomes.append(
                    Ignored("superseded", f"version {version} superseded by {self._live}", where)
                )
                continue
            if held is None:
                detail = f"version {version}: {self._unfinished[version][0]}"
                outcomes.append(Rejected(version, "incomplete", detail, where))
                continue
            result = self._commit(held.header, held.value, where)
            outcomes.append(result)
            applied = isinstance(result, Applied)
        done = {*self._deferred, *self._unfinished}
        self._deferred.clear()
        self._unfinished.clear()
        for version in [v for v in self._pending if v <= self._live or v in done]:
            del self._pending[version]  # applied, superseded, or its header already failed
        return outcomes

    def _commit(self, header: PlanHeader, raw: bytes, where: str) -> Applied | Rejected:
        """Verify and apply `header`'s version; a rejected version keeps its buffered chunks (a
        forged header must not discard the chunks of the real one that follows)."""
        v = header.version
        chunks = self._pending.get(v, {})
        n = header.chunk_count
        missing = _missing(chunks, n)
        if missing is not None:
            return Rejected(v, "incomplete", f"version {v}: {missing}", where)
        values = [chunks[i] for i in range(n)]
        if chunk_checksum(values) != header.checksum:
            return Rejected(v, "checksum", f"version {v}: chunk checksum does not match", where)
        try:
            if self._pause is not None:
                self._pause()  # after the checksum pass
            decoded = decode_chunk_columns(header, values, pause=self._pause)
            plan = plan_from_columns(header, decoded, pause=self._pause, distinct_keys=False)
        except PlannerError as exc:
            return Rejected(v, "invalid", f"version {v}: {exc}", where)
        except Exception as exc:  # untrusted bytes: whatever else breaks, the version is invalid
            return Rejected(v, "invalid", f"version {v}: {type(exc).__name__}: {exc}", where)
        self._live = v
        self._live_header = raw
        for older in [u for u in self._pending if u <= v]:  # their headers can no longer apply
            del self._pending[older]
        return Applied(
            plan,
            header,
            where,
            sum(len(c) for c in values),
            header_value=raw,
            chunk_values=tuple(values),
        )


def _missing(chunks: dict[int, bytes], n: int) -> str | None:
    """What of chunks 0 .. n-1 has not arrived (None: all did), in O(chunks received), never O(n):
    `n` comes from a header anyone can forge."""
    present = sum(1 for i in chunks if i < n)
    if present == n:
        return None
    first = next(i for i in range(n) if i not in chunks)  # at most present + 1 steps
    return f"{n - present} of {n} chunks missing (first: {first})"
