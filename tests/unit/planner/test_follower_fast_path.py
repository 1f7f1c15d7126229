"""The follower's cheaper apply path: columnar chunk decoding and no distinct-key set.

`decode_plan_chunk_columns` is a fast path in front of fastavro: whenever it returns columns they
must be exactly fastavro's, and whatever it does not accept must fall back to fastavro (same
errors). Followers skip the distinct-key check (the planner makes it before publishing): a forged
version that lists a key twice applies, and the routing table keeps the key's later entry.
"""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest

from cacheroute.dispatcher import routing
from cacheroute.dispatcher.dispatcher import Dispatcher
from cacheroute.dispatcher.routing import table_from_plan
from cacheroute.planner import Plan
from cacheroute.planner.assembly import Applied, PlanAssembler, Rejected
from cacheroute.planner.errors import PlannerError
from cacheroute.planner.protocol import (
    HEADER_KEY,
    chunk_checksum,
    chunk_key,
    decode_chunk_columns,
    decode_chunks,
    encode_plan,
    header_for,
    plan_from_records,
)
from cacheroute.schemas import PlanChunk, PlanHeader, SchemaError, codec_for
from cacheroute.schemas.codec import decode_plan_chunk_columns

from .conftest import PlanFactory

CHUNK = codec_for(PlanChunk)


def _fastavro(value: bytes) -> PlanChunk | None:
    try:
        return CHUNK.decode(value)
    except SchemaError:
        return None


def _same(value: bytes) -> str:
    """'fast' (both decode, identically), 'fallback' (only fastavro) or 'error' (neither)."""
    cols = decode_plan_chunk_columns(value)
    ref = _fastavro(value)
    if ref is None:
        assert cols is None
        return "error"
    if cols is None:
        return "fallback"
    assert (cols.version, cols.index, cols.keys) == (ref.version, ref.index, ref.keys)
    assert cols.replicas.dtype == cols.targets.dtype == np.int64
    assert cols.replicas.tolist() == ref.replicas
    assert cols.targets.tolist() == ref.targets
    assert cols.rates.tobytes() == np.asarray(ref.rates, np.float64).tobytes()
    return "fast"


def test_columns_match_fastavro_on_awkward_values() -> None:
    chunk = PlanChunk(
        version=2**40,
        index=7,
        keys=["", "k", "ключ/é", "x" * 300, "tenant-1/conv-2"],
        replicas=[1, 2, 0, 70, 2**31 - 1],
        targets=[0, 63, 64, -1, -(2**31), 2**31 - 1, 1000, 5],
        rates=[0.0, -0.0, 1e300, float("inf"), 3.25],
    )
    assert _same(CHUNK.encode(chunk, validate=False)) == "fast"
    empty = PlanChunk(version=0, index=0, keys=[], replicas=[], targets=[], rates=[])
    assert _same(CHUNK.encode(empty)) == "fast"


def test_columns_match_fastavro_on_corrupted_chunks(plan_factory: PlanFactory) -> None:
    enc = encode_plan(plan_factory(400, q_cap=2.0, warm_slots=100), max_chunk_bytes=4096)
    assert all(_same(c) == "fast" for c in enc.chunks)
    rng = random.Random(13)
    seen: dict[str, int] = {}
    for _ in range(600):
        value = bytearray(rng.choice(enc.chunks))
        op = rng.random()
        if op < 0.5:
            for _ in range(rng.randint(1, 3)):
                value[rng.randrange(len(value))] = rng.randrange(256)
        elif op < 0.8:
            value = value[: rng.randrange(len(value))]
        else:
            value += bytes(rng.randrange(256) for _ in range(rng.randint(1, 4)))
        kind = _same(bytes(value))
        seen[kind] = seen.get(kind, 0) + 1
    assert seen.get("error", 0) > 100
    assert seen.get("fast", 0) > 10


def test_a_block_with_a_byte_count_falls_back_to_fastavro() -> None:
    # Avro allows a negative block count followed by the block's size in bytes; fastavro reads it
    body = bytes([0x04, 0x02])  # version 2, index 1
    body += bytes([0x01, 0x04, 0x02]) + b"a" + bytes([0x00])  # keys: count -1, 4 bytes, "a"
    body += bytes([0x02, 0x02, 0x00])  # replicas [1]
    body += bytes([0x02, 0x00, 0x00])  # targets [0]
    body += bytes([0x02]) + np.float64(1.5).tobytes() + bytes([0x00])  # rates [1.5]
    value = CHUNK.prefix + body
    assert decode_plan_chunk_columns(value) is None
    assert CHUNK.decode(value).keys == ["a"]
    header = PlanHeader.__new__(PlanHeader)  # only .version is read
    object.__setattr__(header, "version", 2)
    (cols,) = decode_chunk_columns(header, [value])
    assert cols.keys == ["a"]
    assert cols.rates.tolist() == [1.5]


def _with_duplicate(plan: Plan) -> tuple[list[bytes], PlanHeader, int, int]:
    """The plan's records with the key of entry `b` replaced by the key of entry `a` (a forgery
    that keeps every other invariant: a and b have different rates and single replicas)."""
    k = plan.replicas()
    singles = [i for i in range(plan.n_admitted) if k[i] == 1]
    a = singles[0]
    b = next(i for i in singles[1:] if plan.rates[i] != plan.rates[a] and i > a + 1)
    keys = list(plan.keys)
    keys[b] = keys[a]
    forged = dataclasses.replace(plan, keys=tuple(keys))
    values: list[bytes] = []
    flat = plan.targets.tolist()
    offs = plan.offsets.tolist()
    rates = plan.rates.tolist()
    bounds = [(0, plan.n_admitted // 2), (plan.n_admitted // 2, plan.n_admitted)]
    for index, (lo, hi) in enumerate(bounds):
        chunk = PlanChunk(
            version=plan.version,
            index=index,
            keys=keys[lo:hi],
            replicas=[offs[i + 1] - offs[i] for i in range(lo, hi)],
            targets=flat[offs[lo] : offs[hi]],
            rates=rates[lo:hi],
        )
        values.append(CHUNK.encode(chunk))
    header = header_for(forged, chunk_count=len(values), checksum=chunk_checksum(values))
    return values, header, a, b


def test_a_key_listed_twice_applies_and_its_later_entry_wins(plan_factory: PlanFactory) -> None:
    plan = dataclasses.replace(
        plan_factory(300, q_cap=2.0, warm_slots=80), version=3, created_ms=1000
    )
    values, header, a, b = _with_duplicate(plan)
    # the planner's own check (publishing, plan_from_records) still refuses such a plan
    with pytest.raises(PlannerError, match="distinct"):
        plan_from_records(header, decode_chunks(header, values))
    asm = PlanAssembler()
    for i, value in enumerate(values):
        asm.offer(chunk_key(i), value)
    out = asm.offer(HEADER_KEY, codec_for(PlanHeader).encode(header))
    assert isinstance(out, Applied), out
    key = plan.keys[a]
    assert out.plan.keys.count(key) == 2
    names = [d.name for d in plan.destinations]
    d = Dispatcher(names)
    assert d.apply_plan(out.plan)
    table = d.table
    assert table is not None
    assert len(table) == plan.n_admitted - 1  # one entry per distinct key
    assert table.targets(key) == plan.targets_of(b)  # the later entry wins
    assert table.targets(plan.keys[b]) == ()  # the replaced key is simply not in the plan
    assert d.route(key) in names


def test_a_forged_version_still_fails_every_other_check(plan_factory: PlanFactory) -> None:
    plan = dataclasses.replace(plan_factory(300, q_cap=2.0, warm_slots=80), version=4)
    enc = encode_plan(plan, max_chunk_bytes=2048)
    bad_target = len(plan.destinations)  # out of the destinations' range
    chunk = CHUNK.decode(enc.chunks[0])
    forged = dataclasses.replace(chunk, targets=[bad_target, *chunk.targets[1:]])
    values = [CHUNK.encode(forged, validate=False), *enc.chunks[1:]]
    header = dataclasses.replace(enc.header, checksum=chunk_checksum(values))
    asm = PlanAssembler()
    for i, value in enumerate(values):
        asm.offer(chunk_key(i), value)
    out = asm.offer(HEADER_KEY, codec_for(PlanHeader).encode(header))
    assert isinstance(out, Rejected)
    assert out.reason == "invalid"
    assert "targets must index destinations" in out.detail


@pytest.mark.parametrize("one_dict_max", [routing.ONE_DICT_MAX_KEYS, 0])
def test_table_matches_per_key_inserts(
    plan_factory: PlanFactory, monkeypatch: pytest.MonkeyPatch, one_dict_max: int
) -> None:
    """Both fills agree with per-key inserts: one dict (plans up to ONE_DICT_MAX_KEYS keys) and
    the sharded one (larger plans; forced here by a threshold of 0)."""
    monkeypatch.setattr(routing, "ONE_DICT_MAX_KEYS", one_dict_max)
    plan = plan_factory(500, q_cap=1.0, warm_slots=150)
    gateway = ["d3", "d1", "d0", "extra"]  # d2 unknown here: its keys use their other replicas
    table = table_from_plan(plan, gateway, yield_every=7, pause=lambda: None)
    assert len(table.shards) == (1 if one_dict_max else routing.SHARDS)
    local = {n: i for i, n in enumerate(gateway)}
    expected = {}
    for key, dests in plan.assignments().items():
        idx = tuple(
            local[plan.destinations[t].name] for t in dests if plan.destinations[t].name in local
        )
        if idx:
            expected[key] = idx
    assert {key: table.targets(key) for key in plan.keys if key in table} == expected
    assert len(table) == len(expected)
    assert any(len(v) > 1 for v in expected.values())
