"""The block LRU against a plain OrderedDict model; prefix hits; deepest-first eviction."""

from __future__ import annotations

import subprocess
import sys
from collections import OrderedDict

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from cacheroute.replay.cache import CacheState, cache_lookup_insert, new_cache


class ModelCache:
    """The specification: per replica an LRU of blocks, deepest first within one prompt."""

    def __init__(self, replicas: int, cap: int) -> None:
        self.lru = [OrderedDict[int, None]() for _ in range(replicas)]
        self.cap = cap

    def serve(self, d: int, blocks: list[int]) -> int:
        lru = self.lru[d]
        matched = 0
        for b in blocks:
            if b not in lru:
                break
            matched += 1
        for b in reversed(blocks[:matched]):  # in use: pinned before anything is evicted
            lru.move_to_end(b)
        for b in reversed(blocks[matched : self.cap]):  # deepest first
            if b in lru:
                lru.move_to_end(b)
                continue
            if len(lru) >= self.cap:
                lru.popitem(last=False)
            lru[b] = None
        for b in reversed(blocks[:matched]):  # block 0 ends most recent
            lru.move_to_end(b)
        return matched


def serve(c: CacheState, r: int, d: int, blocks: list[int]) -> int:
    arr = np.asarray(blocks, dtype=np.int64)
    scratch = np.zeros(len(blocks) + 1, dtype=np.int64)
    return int(
        cache_lookup_insert(
            c.cap, c.tkeys, c.tvals, c.ekey, c.eprev, c.enext, c.dstate, r, d, arr, scratch
        )
    )


def test_hit_is_the_longest_cached_leading_run() -> None:
    c = new_cache(2, 8)
    assert serve(c, 2, 0, [1, 2, 3]) == 0
    assert serve(c, 2, 0, [1, 2, 3, 4]) == 3
    assert serve(c, 2, 0, [1, 9, 3]) == 1
    assert serve(c, 2, 1, [1, 2]) == 0  # replicas do not share caches


def test_eviction_takes_the_oldest_and_deepest_first() -> None:
    c = new_cache(1, 4)
    serve(c, 1, 0, [1, 2, 3])
    serve(c, 1, 0, [7, 8])  # needs one slot: evicts block 3 (oldest, deepest), not block 1
    assert serve(c, 1, 0, [1, 2, 3]) == 2


def test_a_prompt_longer_than_the_cache_keeps_its_head() -> None:
    c = new_cache(1, 3)
    serve(c, 1, 0, [1, 2, 3, 4, 5])
    assert serve(c, 1, 0, [1, 2, 3, 4, 5]) == 3


def test_zero_capacity_never_hits() -> None:
    c = new_cache(1, 0)
    serve(c, 1, 0, [1, 2])
    assert serve(c, 1, 0, [1, 2]) == 0


@settings(max_examples=150, deadline=None)
@given(
    cap=st.integers(1, 12),
    ops=st.lists(
        st.tuples(st.integers(0, 2), st.integers(0, 5), st.integers(1, 8)), min_size=1, max_size=60
    ),
)
def test_matches_the_ordered_dict_model(cap: int, ops: list[tuple[int, int, int]]) -> None:
    r = 3
    fast, model = new_cache(r, cap), ModelCache(r, cap)
    for d, chain, length in ops:
        blocks = [chain * 100 + j for j in range(length)]  # chains share a prefix with themselves
        assert serve(fast, r, d, blocks) == model.serve(d, blocks)


_WARM_CHECK = """
import numpy as np
from cacheroute.demo.httpload import _FlatLBShadow
from cacheroute.replay.cache import cache_lookup_insert, warm_up

if not hasattr(cache_lookup_insert, "signatures"):  # NUMBA_DISABLE_JIT: nothing compiles
    print("no-jit")
    raise SystemExit
before = len(cache_lookup_insert.signatures)
shadow = _FlatLBShadow(destinations=4, cache_blocks=64, max_blocks=8, seed=0)  # warms up
after_warm_up = list(cache_lookup_insert.signatures)
warm_up()  # again: nothing new
assert list(cache_lookup_insert.signatures) == after_warm_up
trace_blocks = np.arange(10, dtype=np.int64)  # a request set's block ids (int64), sliced
for writable in (True, False):  # RequestSet's arrays are read-only
    trace_blocks.setflags(write=writable)
    d = shadow.send(f"k{writable}", trace_blocks[2:7], prompt=5 * 512, block_tokens=512)
    assert 0 <= d < 4
print(before, len(after_warm_up), list(cache_lookup_insert.signatures) == after_warm_up)
"""


def test_warm_up_compiles_what_the_demo_load_generator_calls() -> None:
    """In a fresh process, the HTTP demo's Flat-LB shadow compiles its cache kernel when it is
    made (`warm_up`), and its first request compiles nothing more: that request must not hold
    the load generator's loop (and its clock) for a compile."""
    out = subprocess.run(
        [sys.executable, "-c", _WARM_CHECK], capture_output=True, text=True, check=True
    ).stdout.split()
    if out == ["no-jit"]:
        return
    assert out == ["0", "2", "True"]  # writable and read-only block ids
