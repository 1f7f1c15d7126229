"""Hostile records on the plans topic, pure: forged counts, forged versions, foreign tombstones.

Every expectation is a known answer worked out by hand from the protocol's bounds
(MAX_PLAN_KEYS = MAX_CHUNK_COUNT = 2^22 = 4,194,304; MAX_PLAN_VERSION = 2^53 - 1 =
9,007,199,254,740,991; MAX_VERSION_STEP = 2^20 = 1,048,576), never recomputed from them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from cacheroute.planner import Plan
from cacheroute.planner.assembly import Applied, Buffered, Ignored, PlanAssembler, Rejected
from cacheroute.planner.protocol import (
    HEADER_KEY,
    EncodedPlan,
    chunk_key,
    chunk_problem,
    encode_plan,
    header_problem,
    version_ceiling,
)
from cacheroute.schemas import PlanChunk, PlanHeader, codec_for

from .conftest import PlanFactory

Record = tuple[bytes | None, bytes | None]
INT31 = 2**31 - 1
LONG63 = 2**63 - 1


def versioned(plan_factory: PlanFactory, version: int, seed: int = 0) -> Plan:
    plan = plan_factory(600, seed=seed, q_cap=2.0, warm_slots=150)
    return dataclasses.replace(plan, version=version, created_ms=1000 * version)


def records(enc: EncodedPlan) -> list[Record]:
    out: list[Record] = [(chunk_key(i), c) for i, c in enumerate(enc.chunks)]
    out.append((HEADER_KEY, enc.header_bytes))
    return out


def feed(asm: PlanAssembler, recs: list[Record]) -> list[object]:
    return [asm.offer(k, v, f"plans[0]@{i}") for i, (k, v) in enumerate(recs)]


def forged(enc: EncodedPlan, **changes: Any) -> bytes:
    return codec_for(PlanHeader).encode(dataclasses.replace(enc.header, **changes))


def chunk_value(version: int, index: int) -> bytes:
    return codec_for(PlanChunk).encode(PlanChunk(version, index, ["k"], [1], [0], [1.0]))


@contextmanager
def peak_bytes() -> Iterator[Callable[[], int]]:
    """The peak of Python allocations inside the block (tracemalloc), readable afterwards."""
    tracemalloc.start()
    tracemalloc.reset_peak()
    peak = [0]
    try:
        yield lambda: peak[0]
    finally:
        peak[0] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()


@pytest.fixture
def enc1(plan_factory: PlanFactory) -> EncodedPlan:
    return encode_plan(versioned(plan_factory, 1), max_chunk_bytes=2048)


@pytest.fixture
def enc2(plan_factory: PlanFactory) -> EncodedPlan:
    return encode_plan(versioned(plan_factory, 2, seed=5), max_chunk_bytes=2048)


# ------------------------------------------------------------------------------ the bounds
@pytest.mark.parametrize(
    ("version", "keys", "chunks", "problem"),
    [
        (1, 0, 0, None),  # an empty plan: no key, no chunk
        (1, 10, 3, None),
        (9_007_199_254_740_991, 4_194_304, 4_194_304, None),  # every maximum at once
        (9_007_199_254_740_992, 10, 3, "version 9007199254740992 is outside [0, 9007199254740991]"),
        (LONG63, 10, 3, "version 9223372036854775807 is outside [0, 9007199254740991]"),
        (-1, 10, 3, "version -1 is outside [0, 9007199254740991]"),
        (5, 4_194_305, 1, "version 5: key_count 4194305 is outside [0, 4194304]"),
        (5, 10, INT31, "version 5: chunk_count 2147483647 is outside [0, 4194304]"),
        (5, 10, -1, "version 5: chunk_count -1 is outside [0, 4194304]"),
        (5, 10, 11, "version 5: 11 chunks for 10 keys (every chunk holds at least one key)"),
        (5, 10, 0, "version 5: 10 keys in no chunk"),
    ],
)
def test_header_bounds(
    enc1: EncodedPlan, version: int, keys: int, chunks: int, problem: str | None
) -> None:
    header = dataclasses.replace(enc1.header, version=version, key_count=keys, chunk_count=chunks)
    assert header_problem(header) == problem


@pytest.mark.parametrize(
    ("version", "index", "size", "problem"),
    [
        (3, 0, 100, None),
        (3, 4_194_303, 921_600, None),  # the last index, a chunk of exactly 900 KiB
        (LONG63, 0, 100, "chunk 0 of version 9223372036854775807: the version is outside [0, "
         "9007199254740991]"),
        (3, 4_194_304, 100, "chunk index 4194304 of version 3 is outside [0, 4194304)"),
        (3, 7, 921_601, "chunk 7 of version 3 is 921601 bytes, over 921600"),
    ],
)  # fmt: skip
def test_chunk_bounds(version: int, index: int, size: int, problem: str | None) -> None:
    assert chunk_problem(version, index, size) == problem


@pytest.mark.parametrize(
    ("verified", "now_ms", "ceiling"),
    [
        (7, 0, 1_048_583),  # 7 + 2^20, whatever the clock says
        (9_007_199_254_740_000, 0, 9_007_199_254_740_991),  # never above the protocol maximum
        (None, 1_754_067_200_000, 50_000_000_000),  # 5e10 ms after 2024-01-01
        (0, 1_754_067_200_000, 50_000_000_000),  # version 0 verifies nothing above it
        (None, 1_000, 1_048_576),  # a clock stuck in 1970: at least 2^20
    ],
)
def test_version_ceiling(verified: int | None, now_ms: int, ceiling: int) -> None:
    assert version_ceiling(verified, now_ms) == ceiling


# ------------------------------------------------------------------ probe 3: forged chunk_count
def test_header_claiming_2_31_chunks_is_refused_before_anything_is_allocated(
    enc1: EncodedPlan,
) -> None:
    asm = PlanAssembler()
    feed(asm, records(enc1))
    bogus = forged(enc1, version=2, chunk_count=INT31)
    with peak_bytes() as peak:
        out = asm.offer(HEADER_KEY, bogus, "plans[0]@99")
    assert isinstance(out, Rejected)
    assert out.reason == "out-of-range"
    assert out.detail == "version 2: chunk_count 2147483647 is outside [0, 4194304]"
    assert peak() < 256 * 1024  # the old reader listed 2^31 missing indices: gigabytes
    assert asm.live_version == 1


def test_claims_within_the_bounds_cost_only_what_arrived(enc1: EncodedPlan) -> None:
    asm = PlanAssembler()
    feed(asm, records(enc1))
    claim = forged(enc1, version=2, key_count=4_194_304, chunk_count=4_194_304)
    with peak_bytes() as peak:
        out = asm.offer(HEADER_KEY, claim, "x")
    assert isinstance(out, Rejected)
    assert out.detail == "version 2: 4194304 of 4194304 chunks missing (first: 0)"
    assert peak() < 256 * 1024  # counting the missing chunks is O(received), not O(claimed)
    feed(asm, [(chunk_key(0), chunk_value(3, 0)), (chunk_key(1), chunk_value(3, 1))])
    out = asm.offer(HEADER_KEY, forged(enc1, version=3, key_count=9, chunk_count=5), "x")
    assert isinstance(out, Rejected)
    assert out.detail == "version 3: 3 of 5 chunks missing (first: 2)"
    assert asm.live_version == 1


def test_forged_chunks_out_of_bounds_are_ignored(enc1: EncodedPlan) -> None:
    asm = PlanAssembler()
    outs = feed(
        asm,
        [
            (chunk_key(0), chunk_value(LONG63, 0)),
            (chunk_key(4_194_304), chunk_value(4, 4_194_304)),
        ],
    )
    assert [o.reason for o in outs if isinstance(o, Ignored)] == ["out-of-range"] * 2
    assert asm.pending_versions == ()


# ------------------------------------------------------------------- probe 4: forged versions
def test_header_at_the_schema_limit_never_becomes_live(enc1: EncodedPlan) -> None:
    asm = PlanAssembler()
    feed(asm, records(enc1))
    out = asm.offer(HEADER_KEY, forged(enc1, version=LONG63), "x")
    assert isinstance(out, Rejected)
    assert out.reason == "out-of-range"
    assert asm.live_version == 1


def test_a_forged_header_does_not_discard_the_chunks_of_the_real_one(
    enc1: EncodedPlan, enc2: EncodedPlan
) -> None:
    """Chunks of v2, then forged headers v3 (incomplete) and v2 (wrong checksum), then the real
    header v2: the real version still applies (the old reader dropped v2's chunks on both)."""
    asm = PlanAssembler()
    feed(asm, records(enc1))
    recs = records(enc2)
    outs = feed(
        asm,
        [
            *recs[:-1],
            (HEADER_KEY, forged(enc2, version=3)),
            (HEADER_KEY, forged(enc2, checksum="0" * 64)),
            recs[-1],
        ],
    )
    assert [o.reason for o in outs[-3:-1] if isinstance(o, Rejected)] == ["incomplete", "checksum"]
    assert isinstance(outs[-1], Applied)
    assert asm.live_version == 2


def test_forged_high_version_chunks_do_not_crowd_out_real_versions(
    enc1: EncodedPlan, enc2: EncodedPlan
) -> None:
    """Three forged chunks of huge versions fill the 3 pending slots; buffers are evicted least
    recently updated first, so the real versions still complete (the old rule ignored every chunk
    older than all pending versions: these forged ones, for good)."""
    asm = PlanAssembler(max_pending_versions=3)
    top = 9_007_199_254_740_991
    feed(asm, [(chunk_key(0), chunk_value(top - i, 0)) for i in range(3)])
    assert asm.pending_versions == (top - 2, top - 1, top)
    outs = feed(asm, records(enc1))
    assert next(o.evicted for o in outs if isinstance(o, Buffered)) == top
    assert isinstance(outs[-1], Applied)
    assert isinstance(feed(asm, records(enc2))[-1], Applied)
    assert asm.live_version == 2


# -------------------------------------------------------------- probe 5: foreign tombstones
def test_tombstone_or_garbage_under_header_leaves_the_live_plan(enc1: EncodedPlan) -> None:
    asm = PlanAssembler()
    feed(asm, records(enc1))
    outs = feed(asm, [(HEADER_KEY, None), (HEADER_KEY, b"\x00garbage"), (chunk_key(0), None)])
    assert [o.reason for o in outs if isinstance(o, Ignored)] == [
        "tombstone",
        "undecodable",
        "tombstone",
    ]
    assert asm.live_version == 1
    again = asm.offer(HEADER_KEY, enc1.header_bytes, "repair")
    assert isinstance(again, Ignored)
    assert again.reason == "republished"


def compacted(recs: list[Record]) -> list[Record]:
    """What a reader finds once compaction ran and delete.retention.ms passed: the newest record
    per key, in the order of those newest records, tombstones gone."""
    newest: dict[bytes | None, int] = {}
    for i, (key, _) in enumerate(recs):
        newest[key] = i
    return [recs[i] for i in sorted(newest.values()) if recs[i][1] is not None]


def test_a_tombstone_under_header_erases_the_plan_once_compacted_unless_republished(
    enc1: EncodedPlan,
) -> None:
    log = [*records(enc1), (HEADER_KEY, None)]
    fresh = PlanAssembler(defer_headers=True)
    feed(fresh, compacted(log))
    assert not [o for o in fresh.finish_catch_up() if isinstance(o, Applied)]  # no plan at all

    log.append((HEADER_KEY, enc1.header_bytes))  # the planner's repair: the same header again
    fresh = PlanAssembler(defer_headers=True)
    feed(fresh, compacted(log))
    applied = [o for o in fresh.finish_catch_up() if isinstance(o, Applied)]
    assert [a.plan.version for a in applied] == [1]


def test_a_foreign_value_under_a_live_chunk_key_is_repaired_by_that_chunk_and_the_header(
    enc1: EncodedPlan,
) -> None:
    log = [*records(enc1), (chunk_key(2), b"junk"), (HEADER_KEY, b"junk")]
    fresh = PlanAssembler(defer_headers=True)
    feed(fresh, compacted(log))
    assert not [o for o in fresh.finish_catch_up() if isinstance(o, Applied)]

    log += [(chunk_key(2), enc1.chunks[2]), (HEADER_KEY, enc1.header_bytes)]
    fresh = PlanAssembler(defer_headers=True)
    feed(fresh, compacted(log))
    done = fresh.finish_catch_up()
    assert [(type(o).__name__, getattr(o, "version", None)) for o in done] == [("Applied", None)]
    assert isinstance(done[0], Applied)
    assert done[0].plan.version == 1
    assert done[0].chunk_values == enc1.chunks  # what a planner re-publishes, byte for byte
    assert done[0].header_value == enc1.header_bytes


def test_catch_up_holds_a_bounded_number_of_forged_headers(enc1: EncodedPlan) -> None:
    """1000 forged incomplete headers after the real version: at most max_pending + 1 are held,
    and the real version still applies."""
    asm = PlanAssembler(max_pending_versions=3, defer_headers=True)
    feed(asm, records(enc1))
    for v in range(10, 1010):
        asm.offer(HEADER_KEY, forged(enc1, version=v, chunk_count=1, key_count=1), "x")
    assert asm.deferred_versions == (1, 1006, 1007, 1008, 1009)
    done = asm.finish_catch_up()
    assert [(type(o).__name__, getattr(o, "reason", "")) for o in done] == [
        ("Rejected", "incomplete"),
        ("Rejected", "incomplete"),
        ("Rejected", "incomplete"),
        ("Rejected", "incomplete"),
        ("Applied", ""),
    ]
    assert asm.live_version == 1


def test_forged_complete_headers_can_crowd_a_catch_up_until_the_planner_republishes(
    enc1: EncodedPlan,
) -> None:
    """Headers whose chunks are all there (an empty plan's: none) are held by arrival, at most
    max_pending + 1: five forged ones after the real header push it out of a catch-up. The
    planner's repair (the real header again, after them) is what brings it back."""
    empty = hashlib.sha256(b"").hexdigest()
    log = records(enc1) + [
        (HEADER_KEY, forged(enc1, version=v, key_count=0, chunk_count=0, checksum="0" * 64))
        for v in range(10, 15)
    ]
    assert empty != "0" * 64
    asm = PlanAssembler(max_pending_versions=3, defer_headers=True)
    feed(asm, log)
    assert asm.deferred_versions == (11, 12, 13, 14)
    assert [getattr(o, "reason", "") for o in asm.finish_catch_up()] == ["checksum"] * 4
    assert asm.live_version == 0

    asm = PlanAssembler(max_pending_versions=3, defer_headers=True)
    feed(asm, [*log, (HEADER_KEY, enc1.header_bytes)])
    assert asm.deferred_versions == (1, 12, 13, 14)
    done = asm.finish_catch_up()
    assert [getattr(o, "reason", "applied") for o in done] == ["checksum"] * 3 + ["applied"]
    assert asm.live_version == 1
