"""The follower's state machine: only complete, checksummed, valid, newer versions become live."""

from __future__ import annotations

import dataclasses

import pytest

from cacheroute.planner import Plan
from cacheroute.planner.assembly import Applied, Buffered, Ignored, PlanAssembler, Rejected
from cacheroute.planner.protocol import HEADER_KEY, EncodedPlan, chunk_key, encode_plan
from cacheroute.schemas import PlanChunk, PlanHeader, codec_for

from .conftest import PlanFactory

Record = tuple[bytes | None, bytes | None]


def versioned(plan_factory: PlanFactory, version: int, seed: int = 0) -> Plan:
    plan = plan_factory(600, seed=seed, q_cap=2.0, warm_slots=150)
    return dataclasses.replace(plan, version=version, created_ms=1000 * version)


def records(enc: EncodedPlan, *, tombstones: int = 0) -> list[Record]:
    out: list[Record] = [(chunk_key(i), c) for i, c in enumerate(enc.chunks)]
    n = len(enc.chunks)
    out += [(chunk_key(n + i), None) for i in range(tombstones)]
    out.append((HEADER_KEY, enc.header_bytes))
    return out


def feed(asm: PlanAssembler, recs: list[Record]) -> list[object]:
    return [asm.offer(k, v, f"plans[0]@{i}") for i, (k, v) in enumerate(recs)]


@pytest.fixture
def enc1(plan_factory: PlanFactory) -> EncodedPlan:
    return encode_plan(versioned(plan_factory, 1), max_chunk_bytes=2048)


@pytest.fixture
def enc2(plan_factory: PlanFactory) -> EncodedPlan:
    return encode_plan(versioned(plan_factory, 2, seed=5), max_chunk_bytes=2048)


def test_complete_version_applies(enc1: EncodedPlan, plan_factory: PlanFactory) -> None:
    asm = PlanAssembler()
    outs = feed(asm, records(enc1, tombstones=2))
    assert all(isinstance(o, Buffered) for o in outs[: enc1.header.chunk_count])
    assert [o.reason for o in outs if isinstance(o, Ignored)] == ["tombstone", "tombstone"]
    last = outs[-1]
    assert isinstance(last, Applied)
    assert last.plan == versioned(plan_factory, 1)
    assert last.where.endswith(f"@{len(outs) - 1}")
    assert asm.live_version == 1
    assert asm.pending_versions == ()


def test_incomplete_version_is_rejected_and_previous_stays(
    enc1: EncodedPlan, enc2: EncodedPlan
) -> None:
    asm = PlanAssembler()
    feed(asm, records(enc1))
    recs = records(enc2)
    del recs[1]  # chunk 1 of version 2 never arrived
    out = feed(asm, recs)[-1]
    assert isinstance(out, Rejected)
    assert out.reason == "incomplete"
    assert "1 of" in out.detail
    assert asm.live_version == 1


def test_corrupt_chunk_fails_the_checksum(enc1: EncodedPlan, enc2: EncodedPlan) -> None:
    asm = PlanAssembler()
    feed(asm, records(enc1))
    recs = records(enc2)
    key, value = recs[0]
    assert value is not None
    flipped = value[:-3] + bytes([value[-3] ^ 0x01]) + value[-2:]
    recs[0] = (key, flipped)
    out = feed(asm, recs)[-1]
    assert isinstance(out, Rejected)
    assert out.reason == "checksum"
    assert asm.live_version == 1


def test_matching_checksum_but_invalid_plan_is_rejected(enc1: EncodedPlan) -> None:
    header = dataclasses.replace(enc1.header, key_count=enc1.header.key_count + 1)
    asm = PlanAssembler()
    recs = records(enc1)
    recs[-1] = (HEADER_KEY, codec_for(PlanHeader).encode(header))
    out = feed(asm, recs)[-1]
    assert isinstance(out, Rejected)
    assert out.reason == "invalid"
    assert asm.live_version == 0


def test_stale_and_duplicate_headers_are_rejected(enc1: EncodedPlan, enc2: EncodedPlan) -> None:
    asm = PlanAssembler()
    feed(asm, records(enc2))
    assert asm.live_version == 2
    out = feed(asm, records(enc1))
    assert [o.reason for o in out if isinstance(o, Ignored)] == ["stale-chunk"] * len(enc1.chunks)
    assert isinstance(out[-1], Rejected)
    assert out[-1].reason == "stale"
    # the live version re-published byte for byte (a planner repairing its topic): not a rejection
    again = asm.offer(HEADER_KEY, enc2.header_bytes, "x")
    assert isinstance(again, Ignored)
    assert again.reason == "republished"
    forged = dataclasses.replace(enc2.header, planner_id="someone-else")
    other = asm.offer(HEADER_KEY, codec_for(PlanHeader).encode(forged), "x")
    assert isinstance(other, Rejected)
    assert other.reason == "stale"


def test_garbage_is_ignored_and_does_not_disturb(enc1: EncodedPlan, enc2: EncodedPlan) -> None:
    asm = PlanAssembler()
    feed(asm, records(enc1))
    recs = records(enc2)
    other_chunk = codec_for(PlanChunk).encode(PlanChunk(2, 5, [], [], [], []))
    garbage: list[Record] = [
        (b"filler", b"anything"),
        (None, b"no key"),
        (HEADER_KEY, b"\xc3\x01garbage!"),
        (HEADER_KEY, enc2.chunks[0]),  # a chunk under the header key
        (chunk_key(0), b"not avro"),
        (chunk_key(0), enc2.header_bytes),  # a header under a chunk key
        (chunk_key(1), other_chunk),  # chunk 5 under key 1
    ]
    outs = feed(asm, recs[:2] + garbage + recs[2:])
    reasons = [o.reason for o in outs if isinstance(o, Ignored)]
    assert reasons == ["unknown-key"] * 2 + ["undecodable"] * 4 + ["key-mismatch"]
    assert isinstance(outs[-1], Applied)
    assert asm.live_version == 2


def test_deferred_catch_up_applies_only_the_newest_complete(
    enc1: EncodedPlan, enc2: EncodedPlan, plan_factory: PlanFactory
) -> None:
    enc3 = encode_plan(versioned(plan_factory, 3, seed=9), max_chunk_bytes=2048)
    broken = records(enc3)
    del broken[0]
    asm = PlanAssembler(defer_headers=True)
    outs = feed(asm, records(enc1) + records(enc2) + broken)
    assert not any(isinstance(o, Applied | Rejected) for o in outs)
    done = asm.finish_catch_up()
    assert [type(o).__name__ for o in done] == ["Rejected", "Applied", "Ignored"]
    assert isinstance(done[1], Applied)
    assert done[1].plan.version == 2
    assert isinstance(done[2], Ignored)
    assert done[2].reason == "superseded"
    assert not asm.deferring
    assert asm.pending_versions == ()
    follow = feed(asm, records(encode_plan(versioned(plan_factory, 4), max_chunk_bytes=2048)))
    assert isinstance(follow[-1], Applied)


def test_pending_versions_are_bounded(plan_factory: PlanFactory) -> None:
    asm = PlanAssembler(max_pending_versions=2)
    encs = [encode_plan(versioned(plan_factory, v), max_chunk_bytes=2048) for v in (5, 6, 7)]
    evicted = [
        o.evicted
        for enc in encs
        for o in feed(asm, records(enc)[:-1])  # chunks only, never a header
        if isinstance(o, Buffered) and o.evicted is not None
    ]
    assert evicted == [5]
    assert asm.pending_versions == (6, 7)
    old = asm.offer(chunk_key(0), encs[0].chunks[0], "x")
    assert isinstance(old, Ignored)
    assert old.reason == "stale-chunk"
    out = asm.offer(HEADER_KEY, encs[2].header_bytes, "x")
    assert isinstance(out, Applied)
    assert not asm.pending_versions  # older unfinished versions can no longer complete


def test_invalid_construction() -> None:
    with pytest.raises(ValueError, match="max_pending_versions"):
        PlanAssembler(max_pending_versions=0)
