"""Assembling plan versions from plan-topic records: the follower's state machine, pure.

Records go in one at a time, in log order (key, value, where); what comes out says what happened:
a version was `Applied` (complete, checksummed, valid), `Rejected` (its header arrived but the
version is incomplete, corrupt, invalid or older than the live one), a record was `Ignored`
(tombstone, unknown key, undecodable, stale), or a chunk or deferred header was `Buffered`. The shell
counts and logs the outcomes; the live plan only ever changes to a verified newer version, so an
incomplete or corrupt version leaves the previous plan live.

Chunk values are kept as raw bytes and decoded only when their header arrives and the checksum
matches, and `defer_headers` (for catching up from the start of the topic) holds headers until the
end of the log is reached, then applies only the newest version that verifies: a follower starting
on an uncompacted topic with several versions decodes one of them, not all.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from cacheroute.planner.errors import PlannerError
from cacheroute.planner.plan import Plan
from cacheroute.planner.protocol import (
    chunk_checksum,
    decode_chunks,
    parse_key,
    peek_chunk,
    plan_from_records,
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

RejectReason = Literal["incomplete", "checksum", "invalid", "stale"]
IgnoreReason = Literal[
    "tombstone", "unknown-key", "undecodable", "key-mismatch", "stale-chunk", "superseded"
]


@dataclass(frozen=True, slots=True)
class Applied:
    """Version `plan.version` is complete and verified: it is the live plan now."""

    plan: Plan
    header: PlanHeader
    where: str
    chunk_bytes: int


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


class PlanAssembler:
    """Builds verified plans from plan-topic records (see the module docstring).

    `max_pending_versions` bounds memory: chunks of at most that many unfinished versions are kept
    (the oldest is dropped first). `live_version` starts the reader above a version it already has.
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
        self._defer = defer_headers
        self._pause = pause
        """Called between decode/validation steps (gateways pass a GIL yield)."""
        self._pending: dict[int, dict[int, bytes]] = {}
        self._headers: dict[int, tuple[PlanHeader, str]] = {}

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
        try:
            header = codec_for(PlanHeader).decode(value)
        except SchemaError as exc:
            return Ignored("undecodable", str(exc), where)
        if header.version <= self._live:
            return Rejected(
                header.version,
                "stale",
                f"version {header.version} is not newer than the live version {self._live}",
                where,
            )
        if self._defer:
            self._headers[header.version] = (header, where)
            return Buffered(header.version, -1)
        return self._commit(header, where, drop_older=True)

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
        if version <= self._live:
            return Ignored("stale-chunk", f"chunk of version {version} <= live {self._live}", where)
        evicted: int | None = None
        if version not in self._pending and len(self._pending) >= self._max_pending:
            oldest = min(self._pending)
            if oldest > version:
                return Ignored(
                    "stale-chunk", f"chunk of version {version}, older than all pending", where
                )
            del self._pending[oldest]
            evicted = oldest
        self._pending.setdefault(version, {})[index] = bytes(value)
        return Buffered(version, index, evicted)

    def finish_catch_up(self) -> list[Outcome]:
        """Stop deferring; apply the newest deferred version that verifies (newest first).

        Older deferred versions are `superseded`, not rejected: they were superseded in the log, so
        their chunks may legitimately have been compacted away.
        """
        self._defer = False
        outcomes: list[Outcome] = []
        applied = False
        for version in sorted(self._headers, reverse=True):
            header, where = self._headers[version]
            if applied:
                outcomes.append(
                    Ignored("superseded", f"version {version} superseded by {self._live}", where)
                )
                continue
            result = self._commit(header, where, drop_older=False)
            outcomes.append(result)
            applied = isinstance(result, Applied)
        self._headers.clear()
        for version in [v for v in self._pending if v <= self._live]:
            del self._pending[version]
        return outcomes

    def _commit(self, header: PlanHeader, where: str, *, drop_older: bool) -> Applied | Rejected:
        v = header.version
        chunks = self._pending.pop(v, {})
        if drop_older:  # in log order, an older version's header can no longer arrive
            for older in [u for u in self._pending if u < v]:
                del self._pending[older]
        n = header.chunk_count
        missing = [i for i in range(n) if i not in chunks]
        if n < 0 or missing:
            detail = f"{len(missing)} of {n} chunks missing (first: {missing[0] if missing else n})"
            return Rejected(v, "incomplete", f"version {v}: {detail}", where)
        values = [chunks[i] for i in range(n)]
        if chunk_checksum(values) != header.checksum:
            return Rejected(v, "checksum", f"version {v}: chunk checksum does not match", where)
        try:
            if self._pause is not None:
                self._pause()  # after the checksum pass
            decoded = decode_chunks(header, values, pause=self._pause)
            plan = plan_from_records(header, decoded, pause=self._pause)
        except PlannerError as exc:
            return Rejected(v, "invalid", f"version {v}: {exc}", where)
        self._live = v
        return Applied(plan, header, where, sum(len(c) for c in values))
