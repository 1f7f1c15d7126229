"""The plan-topic protocol's pure half: keys, chunk sizing, encoding and bit-exact decoding."""

from __future__ import annotations

import dataclasses
import hashlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cacheroute.planner import Destination, PlannerParams, build_plan
from cacheroute.planner.protocol import (
    HARD_MAX_CHUNK_BYTES,
    HEADER_KEY,
    ProtocolError,
    chunk_bounds,
    chunk_checksum,
    chunk_key,
    decode_chunks,
    encode_plan,
    parse_key,
    peek_chunk,
    plan_from_records,
)
from cacheroute.schemas import PlanChunk, PlanHeader, PlanParams, codec_for

from .conftest import PlanFactory, make_rates


def test_keys() -> None:
    assert HEADER_KEY == b"header"
    assert chunk_key(0) == b"chunk/00000"
    assert chunk_key(123456) == b"chunk/123456"
    assert parse_key(b"header") == ("header", -1)
    assert parse_key(b"chunk/00042") == ("chunk", 42)
    assert parse_key(b"chunk/123456") == ("chunk", 123456)
    for other in (None, b"", b"chunk/", b"chunk/12", b"chunk/0000x", b"headers", b"filler"):
        assert parse_key(other) == ("other", -1)


def test_round_trip_is_bit_exact(plan_factory: PlanFactory) -> None:
    plan = plan_factory(3000, q_cap=2.0, warm_slots=600)
    plan = dataclasses.replace(plan, version=7, created_ms=1_700_000_000_123)
    enc = encode_plan(plan, planner_id="p1", inputs_until_ms=99, max_chunk_bytes=4096)
    assert len(enc.chunks) >= 5
    assert enc.header.chunk_count == len(enc.chunks)
    assert enc.header.checksum == hashlib.sha256(b"".join(enc.chunks)).hexdigest()
    assert enc.header.planner_id == "p1"
    assert enc.header.inputs_until_ms == 99
    header = codec_for(PlanHeader).decode(enc.header_bytes)
    back = plan_from_records(header, decode_chunks(header, enc.chunks))
    assert back == plan  # version, created_ms, arrays, totals and stats bit for bit
    again = encode_plan(back, planner_id="p1", inputs_until_ms=99, max_chunk_bytes=4096)
    assert again.chunks == enc.chunks
    assert again.header_bytes == enc.header_bytes


def test_replanned_plan_keeps_its_stats(plan_factory: PlanFactory) -> None:
    first = plan_factory(500, seed=1)
    keys, rates = make_rates(500, seed=2)
    second = build_plan(keys, rates, first.destination_names, first.params, prev=first)
    assert first.stats.balanced is None  # a plan from scratch has no rebalance step to report
    # 500 keys on 4 destinations: the re-plan's rebalance step gets within the 5% tolerance
    assert second.stats.balanced is True
    assert second.max_over_mean() <= second.params.imbalance_tolerance
    enc = encode_plan(second)
    back = plan_from_records(enc.header, decode_chunks(enc.header, enc.chunks))
    assert back == second
    assert back.stats == second.stats


def test_empty_and_capacity_weighted_plans() -> None:
    params = PlannerParams(q_cap=1.0, warm_slots=0, admission="rate")
    empty = build_plan(["a", "b"], [1.0, 2.0], ["d0", "d1"], params)
    enc = encode_plan(empty)
    assert enc.chunks == ()
    assert enc.header.checksum == hashlib.sha256(b"").hexdigest()
    assert plan_from_records(enc.header, []) == empty
    weighted = build_plan(
        ["a", "b", "c"],
        [5.0, 1.0, 0.5],
        [Destination("big", 3.0), Destination("small", 1.0)],
        PlannerParams(q_cap=2.0, warm_slots=2),
    )
    enc = encode_plan(weighted)
    assert plan_from_records(enc.header, decode_chunks(enc.header, enc.chunks)) == weighted


@settings(max_examples=40, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 300), min_size=1, max_size=80),
    limit=st.integers(1024, 6000),
    r=st.sampled_from([1, 2, 63, 64, 200]),
)
def test_chunks_never_exceed_the_limit(lengths: list[int], limit: int, r: int) -> None:
    keys = [("é" * (n // 2)) + f"{i}" for i, n in enumerate(lengths)]  # multi-byte UTF-8 too
    rates = [float(i % 7 + 1) for i in range(len(keys))]
    plan = build_plan(
        keys, rates, [f"d{i}" for i in range(r)], PlannerParams(q_cap=2.0, warm_slots=50)
    )
    bounds = chunk_bounds(plan, limit)
    assert [b for _, b in bounds] == sorted(b for _, b in bounds)
    assert sum(e - s for s, e in bounds) == plan.n_admitted
    enc = encode_plan(plan, max_chunk_bytes=limit)
    assert all(len(c) <= limit for c in enc.chunks)
    assert len(enc.chunks) == len(bounds)


def test_the_bound_is_reasonably_tight(plan_factory: PlanFactory) -> None:
    plan = plan_factory(20_000, q_cap=0.3, warm_slots=5000)
    enc = encode_plan(plan, max_chunk_bytes=64 * 1024)
    sizes = [len(c) for c in enc.chunks[:-1]]
    assert min(sizes) > 0.6 * 64 * 1024  # not wasting records on a loose bound


def test_oversized_key_or_limit_is_refused() -> None:
    plan = build_plan(["x" * 5000], [1.0], ["d0"], PlannerParams(q_cap=1.0, warm_slots=1))
    with pytest.raises(ProtocolError, match="alone needs"):
        encode_plan(plan, max_chunk_bytes=2048)
    with pytest.raises(ProtocolError, match="exceeds"):
        chunk_bounds(plan, HARD_MAX_CHUNK_BYTES + 1)


def test_peek_reads_version_and_index_only() -> None:
    chunk = codec_for(PlanChunk).encode(PlanChunk(2**40 + 3, 77, [], [], [], []))
    assert peek_chunk(chunk) == (2**40 + 3, 77)
    header = codec_for(PlanHeader).encode(
        PlanHeader(
            1, 0, PlanParams(q_cap=1.0, warm_slots=1), [], key_count=0, chunk_count=0, checksum=""
        )
    )
    assert peek_chunk(header) is None  # another schema's fingerprint
    assert peek_chunk(None) is None
    assert peek_chunk(b"garbage") is None
    assert peek_chunk(chunk[:11]) is None  # truncated inside the version varint


def test_inconsistent_records_are_protocol_errors(plan_factory: PlanFactory) -> None:
    plan = plan_factory(800, q_cap=0.5, warm_slots=300)
    enc = encode_plan(plan, max_chunk_bytes=4096)
    chunks = decode_chunks(enc.header, enc.chunks)
    with pytest.raises(ProtocolError, match="chunks, the header says"):
        plan_from_records(enc.header, chunks[:-1])
    with pytest.raises(ProtocolError, match="is chunk"):
        plan_from_records(enc.header, [chunks[1], chunks[0], *chunks[2:]])
    wrong = dataclasses.replace(enc.header, key_count=enc.header.key_count + 1)
    with pytest.raises(ProtocolError, match="keys, the header says"):
        plan_from_records(wrong, chunks)
    wrong = dataclasses.replace(enc.header, expected_load=[1.0])
    with pytest.raises(ProtocolError, match="expected loads"):
        plan_from_records(wrong, chunks)
    with pytest.raises(ProtocolError, match="does not decode"):
        decode_chunks(enc.header, [b"junk", *enc.chunks[1:]])


def test_checksum_is_order_sensitive() -> None:
    assert chunk_checksum([b"ab", b"c"]) == chunk_checksum([b"a", b"bc"])  # a byte stream ...
    assert chunk_checksum([b"a", b"b"]) != chunk_checksum([b"b", b"a"])  # ... in index order
