"""Decoded plan keys stay out of the cyclic collector's view (schemas/gc_tracking.py)."""

from __future__ import annotations

import gc

from cacheroute.planner import PlannerParams, build_plan
from cacheroute.planner.assembly import Applied, PlanAssembler
from cacheroute.planner.protocol import HEADER_KEY, chunk_key, encode_plan
from cacheroute.schemas.codec import decode_plan_chunk_columns
from cacheroute.schemas.gc_tracking import untrack_strings


def test_untrack_strings_untracks_tuples_and_lists_of_str_and_ignores_other_types() -> None:
    t = tuple(f"k{i}" for i in range(100))
    lst = [f"k{i}" for i in range(100)]
    d = {"a": [1]}
    assert gc.is_tracked(t)
    assert gc.is_tracked(lst)
    assert gc.is_tracked(d)
    untrack_strings(t)
    untrack_strings(lst)
    untrack_strings(d)  # type: ignore[arg-type]  # not a tuple or list: left alone
    assert not gc.is_tracked(t)
    assert not gc.is_tracked(lst)
    assert gc.is_tracked(d)
    untrack_strings(t)  # twice is harmless
    assert not gc.is_tracked(t)
    assert t == tuple(f"k{i}" for i in range(100))  # contents untouched
    gc.collect()


def test_a_followers_decoded_plan_holds_its_keys_in_untracked_containers() -> None:
    keys = [f"tenant{i % 7}/conv{i}" for i in range(400)]
    rates = [float(400 - i) for i in range(400)]
    plan = build_plan(
        keys,
        rates,
        ["d0", "d1", "d2"],
        PlannerParams(q_cap=5.0, warm_slots=60),
        version=3,
        created_ms=1,
    )
    enc = encode_plan(plan, max_chunk_bytes=1024)
    assert len(enc.chunks) > 2
    for chunk in enc.chunks:
        cols = decode_plan_chunk_columns(chunk)
        assert cols is not None
        assert cols.keys
        assert not gc.is_tracked(cols.keys)
    asm = PlanAssembler()
    outcomes = [asm.offer(chunk_key(i), c) for i, c in enumerate(enc.chunks)]
    outcomes.append(asm.offer(HEADER_KEY, enc.header_bytes))
    applied = outcomes[-1]
    assert isinstance(applied, Applied)
    assert applied.plan.keys == plan.keys
    assert not gc.is_tracked(applied.plan.keys)
