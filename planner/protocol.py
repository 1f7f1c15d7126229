"""The plan-topic protocol, pure: a Plan as chunk and header records, and back, bit for bit.

A plan of 100k+ admitted keys does not fit in one Kafka message (1 MB by default), so a version is
published as `chunk_count` PlanChunk records under the compaction-stable keys `chunk/00000`,
`chunk/00001`, ... followed by one PlanHeader under the key `header`: the commit record, carrying the
version, the chunk count, a sha256 over the chunk values and every scalar of the Plan. The Kafka
side (one transaction per version, tombstones, recovery) lives in `cacheroute.planservice`; this
module only turns plans into bytes and bytes into verified plans, so it is tested without a broker.
The full protocol is in docs/PLAN_PROTOCOL.md.

Chunks are cut by an *upper bound* of their encoded size rather than by a fixed entry count: keys
can be up to a kilobyte long, so a fixed count could exceed the message limit for long keys and
waste records for short ones. The bound is exact arithmetic on Avro's varint widths, so a chunk is
never larger than `max_chunk_bytes`, without encoding twice.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Literal

import numpy as np

from cacheroute.planner.errors import PlannerError
from cacheroute.planner.params import PlannerParams
from cacheroute.planner.plan import Destination, IntArray, Plan, PlanStats
from cacheroute.schemas import Destination as DestinationRecord
from cacheroute.schemas import (
    PlanChunk,
    PlanHeader,
    PlanParams,
    SchemaError,
    codec_for,
)
from cacheroute.schemas.codec import PlanChunkColumns, decode_plan_chunk_columns
from cacheroute.schemas.gc_tracking import untrack_strings

__all__ = [
    "CHUNK_KEY_PREFIX",
    "DEFAULT_MAX_CHUNK_BYTES",
    "HARD_MAX_CHUNK_BYTES",
    "HEADER_KEY",
    "MAX_CHUNK_COUNT",
    "MAX_PLAN_KEYS",
    "MAX_PLAN_VERSION",
    "MAX_VERSION_STEP",
    "PROTOCOL_REVISION",
    "VERSION_EPOCH_MS",
    "EncodedPlan",
    "KeyKind",
    "ProtocolError",
    "chunk_bounds",
    "chunk_checksum",
    "chunk_key",
    "chunk_problem",
    "decode_chunk_columns",
    "decode_chunks",
    "encode_plan",
    "header_for",
    "header_problem",
    "parse_key",
    "peek_chunk",
    "plan_from_columns",
    "plan_from_records",
    "version_ceiling",
]

PROTOCOL_REVISION = 1
"""`PlanHeader.protocol` of this key layout and these commit rules."""

HEADER_KEY = b"header"
"""Record key of every version's header (compaction keeps only the newest)."""
CHUNK_KEY_PREFIX = b"chunk/"
"""Chunk `i` of any version is keyed `chunk/{i:05d}`: stable across versions, so compaction keeps
exactly the newest version's chunk per index; indices a version no longer uses get tombstones."""

DEFAULT_MAX_CHUNK_BYTES = 64 * 1024
"""Small enough that decoding one chunk takes well under a millisecond (~0.6 ms for ~1,500 keys
here): gateways decode chunks in a background thread while routing, and one chunk's decode holds
the GIL. Far below Kafka's 1 MB default message limit; the producer batches many chunks per
request."""
HARD_MAX_CHUNK_BYTES = 900 * 1024
"""No chunk may be larger (the broker's default max.message.bytes is 1 MiB + 12 bytes)."""

MAX_PLAN_KEYS = 1 << 22
"""Most admitted keys a plan may have (4,194,304): 4x the largest plan measured end to end (1M keys,
191 chunks, 42 MB of records; docs/PLAN_PROTOCOL.md). Every gateway decodes and holds the whole
plan, so a header claiming more is not a plan any reader should try to assemble."""
MAX_CHUNK_COUNT = MAX_PLAN_KEYS
"""Most chunks a version may have. `chunk_bounds` never cuts an empty chunk, so a version has at most
one chunk per admitted key; that worst case is real (keys near a kilobyte with the smallest chunk
size the planner accepts, 1 KiB, fit one per chunk), so no tighter bound holds for every valid
plan. A header's own `key_count` bounds it further (see `header_problem`), and so does the broker:
each chunk is one record of at most max.message.bytes, so the bytes a version can make a reader
buffer grow with the chunks that actually arrive, never with what a header claims."""
MAX_PLAN_VERSION = (1 << 53) - 1
"""Highest version a reader applies and a planner writes: below the schema's long limit (2^63 - 1),
so the planner always has room above any version it accepts, and exact in a float64 (the version
gauges are Prometheus doubles). At a thousand versions a second it lasts 285,000 years."""
MAX_VERSION_STEP = 1 << 20
"""How far above the newest verified version an unverified record's version may be and still count
when a planner recovers its next version (1,048,576: a million aborted publishes in a row)."""
VERSION_EPOCH_MS = 1_704_067_200_000
"""2024-01-01T00:00:00Z, before any plan of this protocol was written. No planner commits more than
one version per millisecond, so without a verified version to measure from, a version above the
milliseconds since this epoch cannot have been written by a planner."""

# Avro binary widths: a long/int varint takes at most 10/5 bytes, a double exactly 8.
_LONG_MAX = 10
_INT_MAX = 5
_DOUBLE = 8
_SINGLE_OBJECT_PREFIX = 10  # marker C3 01 + 8-byte fingerprint
_CHUNK_OVERHEAD = _SINGLE_OBJECT_PREFIX + _LONG_MAX + _INT_MAX + 4 * (_LONG_MAX + 1)
"""Prefix, version, index, and the block count and end marker of each of the four columns."""


class ProtocolError(PlannerError):
    """Records that do not make up a valid plan version (incomplete, corrupt or inconsistent).

    Never retriable: the same records fail the same way. A follower keeps its live plan.
    """


KeyKind = Literal["header", "chunk", "other"]


def chunk_key(index: int) -> bytes:
    """The record key of chunk `index`."""
    return CHUNK_KEY_PREFIX + b"%05d" % index


def parse_key(key: bytes | None) -> tuple[KeyKind, int]:
    """("header", -1), ("chunk", index) or ("other", -1) for anything else (ignored by readers)."""
    if key == HEADER_KEY:
        return "header", -1
    if key is not None and key.startswith(CHUNK_KEY_PREFIX):
        digits = key[len(CHUNK_KEY_PREFIX) :]
        if digits.isdigit() and len(digits) >= 5:
            return "chunk", int(digits)
    return "other", -1


def header_problem(header: PlanHeader) -> str | None:
    """Why `header` cannot describe a plan any reader should assemble; None if it may.

    Checked before a reader allocates anything for the version: a header is a few hundred bytes
    that anyone with write access can forge, and its counts must not size memory. Only counts and
    the version are checked here; everything else is checked against the chunks when they verify.
    """
    v, n, keys = header.version, header.chunk_count, header.key_count
    if not 0 <= v <= MAX_PLAN_VERSION:
        return f"version {v} is outside [0, {MAX_PLAN_VERSION}]"
    if not 0 <= keys <= MAX_PLAN_KEYS:
        return f"version {v}: key_count {keys} is outside [0, {MAX_PLAN_KEYS}]"
    if not 0 <= n <= MAX_CHUNK_COUNT:
        return f"version {v}: chunk_count {n} is outside [0, {MAX_CHUNK_COUNT}]"
    if n > keys:
        return f"version {v}: {n} chunks for {keys} keys (every chunk holds at least one key)"
    if keys and not n:
        return f"version {v}: {keys} keys in no chunk"
    return None


def chunk_problem(version: int, index: int, size: int) -> str | None:
    """Why a chunk record (peeked version and index, value size) cannot belong to any valid version.

    `size` above HARD_MAX_CHUNK_BYTES: no planner writes such a chunk (`chunk_bounds` refuses).
    """
    if not 0 <= version <= MAX_PLAN_VERSION:
        return f"chunk {index} of version {version}: the version is outside [0, {MAX_PLAN_VERSION}]"
    if not 0 <= index < MAX_CHUNK_COUNT:
        return f"chunk index {index} of version {version} is outside [0, {MAX_CHUNK_COUNT})"
    if size > HARD_MAX_CHUNK_BYTES:
        return f"chunk {index} of version {version} is {size} bytes, over {HARD_MAX_CHUNK_BYTES}"
    return None


def version_ceiling(verified: int | None, now_ms: int) -> int:
    """The highest version an *unverified* record (header without its chunks, chunk, aborted write)
    may carry and still count when a planner recovers the next version to write.

    A planner never reuses a version that was written, so it starts above every version it finds;
    a forged record at 2^63 - 1 would otherwise leave it no version to write, for good. A version
    counts only up to `verified` (the newest version that verified) + MAX_VERSION_STEP; with no
    verified version, up to the milliseconds since VERSION_EPOCH_MS (at least MAX_VERSION_STEP, in
    case this host's clock is far behind). Never above MAX_PLAN_VERSION. Versions that verified are
    not capped: readers may already route by them, and the planner must write above them.
    """
    if verified is not None and verified > 0:
        return min(MAX_PLAN_VERSION, verified + MAX_VERSION_STEP)
    return min(MAX_PLAN_VERSION, max(MAX_VERSION_STEP, now_ms - VERSION_EPOCH_MS))


@dataclass(frozen=True, slots=True)
class EncodedPlan:
    """One plan version as the bytes that go on the topic (chunks in index order, then header)."""

    version: int
    header: PlanHeader
    header_bytes: bytes
    chunks: tuple[bytes, ...]

    @property
    def chunk_bytes(self) -> int:
        """Bytes of all chunk values (before Kafka's compression)."""
        return sum(len(c) for c in self.chunks)

    @property
    def total_bytes(self) -> int:
        """Bytes of all record values of this version (before Kafka's compression)."""
        return self.chunk_bytes + len(self.header_bytes)


def chunk_checksum(chunks: Sequence[bytes | bytearray | memoryview]) -> str:
    """sha256 hex digest over the chunk values, concatenated in index order."""
    digest = hashlib.sha256()
    for chunk in chunks:
        digest.update(chunk)
    return digest.hexdigest()


def _varint_len(n: int) -> int:
    """Bytes of Avro's zig-zag varint for a non-negative n."""
    z = n << 1
    return max(1, math.ceil(z.bit_length() / 7))


def chunk_bounds(
    plan: Plan, max_chunk_bytes: int = DEFAULT_MAX_CHUNK_BYTES
) -> list[tuple[int, int]]:
    """Entry ranges [start, end) of the chunks: each chunk's encoded size is <= max_chunk_bytes.

    The per-entry bound is the key's UTF-8 length with its length varint, the destination array
    (block count, one int varint per index, end marker) and the 8-byte rate; the destination index
    width comes from the number of destinations, so the bound is tight for real plans.
    """
    if max_chunk_bytes > HARD_MAX_CHUNK_BYTES:
        raise ProtocolError(
            f"max_chunk_bytes {max_chunk_bytes} exceeds {HARD_MAX_CHUNK_BYTES} (Kafka's message "
            "limit with headroom); use a smaller value"
        )
    n = plan.n_admitted
    if n == 0:
        return []
    r = len(plan.destinations)
    index_width = _varint_len(max(r - 1, 0))
    key_len = np.fromiter((len(k.encode("utf-8")) for k in plan.keys), np.int64, count=n)
    k = plan.replicas()
    entry = key_len + _INT_MAX + _INT_MAX + k * index_width + 1 + _DOUBLE
    budget = max_chunk_bytes - _CHUNK_OVERHEAD
    too_big = np.flatnonzero(entry > budget)
    if too_big.size:
        i = int(too_big[0])
        raise ProtocolError(
            f"key {plan.keys[i]!r} alone needs up to {int(entry[i])} bytes, more than a chunk of "
            f"{max_chunk_bytes}; raise max_chunk_bytes or shorten the key"
        )
    cum = np.cumsum(entry)
    bounds: list[tuple[int, int]] = []
    start = 0
    while start < n:
        base = int(cum[start - 1]) if start else 0
        end = int(np.searchsorted(cum, base + budget, side="right"))
        bounds.append((start, end))
        start = end
    return bounds


def header_for(
    plan: Plan,
    *,
    chunk_count: int,
    checksum: str,
    planner_id: str = "",
    inputs_until_ms: int = 0,
) -> PlanHeader:
    """The header record of `plan`: commit data plus every scalar of the Plan."""
    p = plan.params
    s = plan.stats
    return PlanHeader(
        version=plan.version,
        created_ms=plan.created_ms,
        params=PlanParams(
            q_cap=p.q_cap,
            warm_slots=p.warm_slots,
            control_interval_s=p.control_interval_s,
            imbalance_tolerance=p.imbalance_tolerance,
            hysteresis=p.hysteresis,
            admission=p.admission,
            fair_share=p.fair_share,
            group_separator=p.group_separator,
        ),
        destinations=[DestinationRecord(d.name, d.capacity) for d in plan.destinations],
        key_count=plan.n_admitted,
        chunk_count=chunk_count,
        checksum=checksum,
        planner_id=planner_id,
        expected_load=plan.loads.tolist(),
        total_rate=plan.total_rate,
        cold_rate=plan.cold_rate,
        planned_keys=s.keys,
        capped_keys=s.capped_keys,
        cutoff=s.cutoff,
        kept_keys=s.kept_keys,
        new_keys=s.new_keys,
        dropped_keys=s.dropped_keys,
        resized_keys=s.resized_keys,
        displaced_replicas=s.displaced_replicas,
        balanced=None if s.balanced is None else int(s.balanced),
        inputs_until_ms=inputs_until_ms,
        protocol=PROTOCOL_REVISION,
    )


def encode_plan(
    plan: Plan,
    *,
    planner_id: str = "",
    inputs_until_ms: int = 0,
    max_chunk_bytes: int = DEFAULT_MAX_CHUNK_BYTES,
) -> EncodedPlan:
    """The records of one version: chunk values in index order and the header that commits them.

    Values are validated against the schema only for the header (small); chunk values come from a
    validated Plan (ints in range, finite rates), so the per-entry schema check is skipped: it would
    double the encoding time of a 200k-key plan for nothing.
    """
    chunk_codec = codec_for(PlanChunk)
    flat = plan.targets.tolist()
    offsets = plan.offsets.tolist()
    rates = plan.rates.tolist()
    keys = plan.keys
    chunks: list[bytes] = []
    for index, (start, end) in enumerate(chunk_bounds(plan, max_chunk_bytes)):
        chunk = PlanChunk(
            version=plan.version,
            index=index,
            keys=list(keys[start:end]),
            replicas=[offsets[i + 1] - offsets[i] for i in range(start, end)],
            targets=flat[offsets[start] : offsets[end]],
            rates=rates[start:end],
        )
        blob = chunk_codec.encode(chunk, validate=False)
        if len(blob) > max_chunk_bytes:  # cannot happen: the bound is an upper bound
            raise ProtocolError(f"chunk {index} is {len(blob)} bytes, over {max_chunk_bytes}")
        chunks.append(blob)
    header = header_for(
        plan,
        chunk_count=len(chunks),
        checksum=chunk_checksum(chunks),
        planner_id=planner_id,
        inputs_until_ms=inputs_until_ms,
    )
    return EncodedPlan(
        version=plan.version,
        header=header,
        header_bytes=codec_for(PlanHeader).encode(header),
        chunks=tuple(chunks),
    )


def peek_chunk(value: bytes | bytearray | memoryview | None) -> tuple[int, int] | None:
    """(version, index) of an encoded PlanChunk without decoding its entries; None if it is not one.

    Readers buffer chunk bytes and decode only the version they apply (a follower catching up on an
    uncompacted topic skips the older versions' entries entirely). The two leading fields of the
    Avro body are the version (long) and the index (int), zig-zag varints right after the
    single-object prefix; the full decode at apply time still validates everything.
    """
    if value is None or len(value) < _SINGLE_OBJECT_PREFIX + 2:
        return None
    if bytes(value[:_SINGLE_OBJECT_PREFIX]) != codec_for(PlanChunk).prefix:
        return None
    pos = _SINGLE_OBJECT_PREFIX
    fields: list[int] = []
    for width in (_LONG_MAX, _INT_MAX):
        result = shift = 0
        for _ in range(width):
            if pos >= len(value):
                return None
            byte = value[pos]
            pos += 1
            result |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                break
        else:
            return None
        fields.append((result >> 1) ^ -(result & 1))
    return fields[0], fields[1]


def decode_chunks(
    header: PlanHeader,
    values: Sequence[bytes | bytearray | memoryview],
    *,
    pause: Callable[[], None] | None = None,
) -> list[PlanChunk]:
    """Decode the chunk values of `header`'s version; SchemaError becomes ProtocolError.

    `pause` runs after each chunk (gateways pass a GIL yield: see DEFAULT_MAX_CHUNK_BYTES).
    """
    codec = codec_for(PlanChunk)
    out: list[PlanChunk] = []
    for i, value in enumerate(values):
        try:
            out.append(codec.decode(value))
        except SchemaError as exc:
            raise ProtocolError(
                f"version {header.version}: chunk {i} does not decode: {exc}"
            ) from exc
        if pause is not None:
            pause()
    return out


def decode_chunk_columns(
    header: PlanHeader,
    values: Sequence[bytes | bytearray | memoryview],
    *,
    pause: Callable[[], None] | None = None,
) -> list[PlanChunkColumns]:
    """`decode_chunks` for followers: numeric columns as numpy arrays (`plan_from_columns`).

    Each chunk takes the columnar fast path (`decode_plan_chunk_columns`, about half the CPU of
    fastavro here), and anything it does not accept is decoded by fastavro exactly as in
    `decode_chunks`, with the same errors. `pause` runs after each chunk.
    """
    codec = codec_for(PlanChunk)
    out: list[PlanChunkColumns] = []
    for i, value in enumerate(values):
        cols = decode_plan_chunk_columns(bytes(value))
        if cols is None:
            try:
                c = codec.decode(value)
            except SchemaError as exc:
                raise ProtocolError(
                    f"version {header.version}: chunk {i} does not decode: {exc}"
                ) from exc
            cols = _columns(c)
        out.append(cols)
        if pause is not None:
            pause()
    return out


def _columns(c: PlanChunk) -> PlanChunkColumns:
    return PlanChunkColumns(
        c.version,
        c.index,
        c.keys,
        np.asarray(c.replicas, np.int64),
        np.asarray(c.targets, np.int64),
        np.asarray(c.rates, np.float64),
    )


def _no_pause() -> None:
    return None


def plan_from_records(
    header: PlanHeader,
    chunks: Sequence[PlanChunk],
    *,
    pause: Callable[[], None] | None = None,
) -> Plan:
    """The Plan a header and its chunks (in index order) describe, validated.

    Raises ProtocolError when the records disagree with each other (count, version, index, key
    count, destination count) and PlannerError when the plan they describe breaks an invariant.
    """
    return plan_from_columns(header, [_columns(c) for c in chunks], pause=pause)


def plan_from_columns(
    header: PlanHeader,
    chunks: Sequence[PlanChunkColumns],
    *,
    pause: Callable[[], None] | None = None,
    distinct_keys: bool = True,
) -> Plan:
    """`plan_from_records` over decoded columns (`decode_chunk_columns`), with the same checks.

    `distinct_keys=False` (what `PlanAssembler` passes for followers) skips checking that the
    admitted keys are distinct: see `Plan.validate` for why a follower may.
    """
    v = header.version
    problem = header_problem(header)
    if problem is not None:
        raise ProtocolError(problem)
    if len(chunks) != header.chunk_count:
        raise ProtocolError(
            f"version {v}: {len(chunks)} chunks, the header says {header.chunk_count}"
        )
    for i, chunk in enumerate(chunks):
        if chunk.version != v or chunk.index != i:
            raise ProtocolError(
                f"version {v}: chunk {i} is chunk {chunk.index} of version {chunk.version}"
            )
    yield_ = pause or _no_pause
    for chunk in chunks:
        if not len(chunk.keys) == len(chunk.replicas) == len(chunk.rates):
            raise ProtocolError(f"version {v}: chunk {chunk.index} has columns of unequal length")
        total = int(chunk.replicas.sum())
        if total != len(chunk.targets):
            raise ProtocolError(
                f"version {v}: chunk {chunk.index}: replicas add up to {total}, "
                f"targets has {len(chunk.targets)}"
            )
    yield_()
    keys = tuple(chain.from_iterable(chunk.keys for chunk in chunks))  # one pass over the keys
    untrack_strings(keys)
    if len(keys) != header.key_count:
        raise ProtocolError(f"version {v}: {len(keys)} keys, the header says {header.key_count}")
    dests = tuple(Destination(d.name, d.capacity) for d in header.destinations)
    if len(header.expected_load) != len(dests):
        raise ProtocolError(
            f"version {v}: {len(header.expected_load)} expected loads for {len(dests)} destinations"
        )
    count_parts = [np.zeros(0, np.int64), *(c.replicas for c in chunks)]
    target_parts = [np.zeros(0, np.int64), *(c.targets for c in chunks)]
    rate_parts = [np.zeros(0, np.float64), *(c.rates for c in chunks)]
    counts = np.concatenate(count_parts)
    offsets: IntArray = np.zeros(len(keys) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    targets = np.concatenate(target_parts)
    rates = np.concatenate(rate_parts)
    yield_()
    p = header.params
    if p.admission not in ("rate", "bytes"):
        raise ProtocolError(f"version {v}: unknown admission mode {p.admission!r}")
    params = PlannerParams(
        q_cap=p.q_cap,
        warm_slots=p.warm_slots,
        control_interval_s=p.control_interval_s,
        imbalance_tolerance=p.imbalance_tolerance,
        hysteresis=p.hysteresis,
        admission="bytes" if p.admission == "bytes" else "rate",
        fair_share=p.fair_share,
        group_separator=p.group_separator,
    )
    plan = Plan(
        version=v,
        created_ms=header.created_ms,
        params=params,
        destinations=dests,
        keys=keys,
        rates=rates,
        offsets=offsets,
        targets=targets,
        loads=np.array(header.expected_load, dtype=np.float64),
        total_rate=header.total_rate,
        cold_rate=header.cold_rate,
        stats=PlanStats(
            keys=header.planned_keys,
            capped_keys=header.capped_keys,
            cutoff=header.cutoff,
            kept_keys=header.kept_keys,
            new_keys=header.new_keys,
            dropped_keys=header.dropped_keys,
            resized_keys=header.resized_keys,
            displaced_replicas=header.displaced_replicas,
            balanced=None if header.balanced is None else bool(header.balanced),
        ),
    )
    yield_()
    plan.validate(pause=pause, distinct_keys=distinct_keys)
    return plan
