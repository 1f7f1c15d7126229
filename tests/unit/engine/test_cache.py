"""The engine stand-in's prefix cache, against numbers derived by hand.

Blocks are 16 tokens = 64 characters; a prompt of c characters has ceil(c / 4) tokens, its full
blocks are c // 64, and at most (tokens - 1) // 16 blocks can hit (the last token is computed).
"""

from __future__ import annotations

from cacheroute.engine.cache import PrefixCache, block_hashes

A, B, C, D = "a" * 64, "b" * 64, "c" * 64, "d" * 64


def test_repeat_hits_every_full_block_but_not_the_partial_one() -> None:
    cache = PrefixCache(capacity_tokens=1024)
    text = A + B + C + "d" * 8  # 200 chars = 50 tokens, 3 full blocks, at most 49 // 16 = 3 hit
    first = cache.lookup(text)
    assert (first.prompt_tokens, first.cached_tokens, len(first.hashes)) == (50, 0, 3)
    cache.insert(first.hashes)
    assert cache.lookup(text).cached_tokens == 48
    assert (cache.queries_tokens, cache.hit_tokens) == (100, 48)


def test_a_shared_prefix_hits_up_to_the_first_different_block() -> None:
    cache = PrefixCache(capacity_tokens=1024)
    cache.insert(cache.lookup(A + B + C + "d").hashes)
    assert cache.lookup(A + B + "x" * 64 + "y").cached_tokens == 32  # 193 chars: 49 tokens
    # same second block after a different first one: a chain, not a bag of blocks
    assert cache.lookup("q" * 64 + B + C + "d").cached_tokens == 0


def test_the_last_token_is_always_computed() -> None:
    cache = PrefixCache(capacity_tokens=1024)
    cache.insert(cache.lookup(A + B).hashes)  # 128 chars = 32 tokens: (32 - 1) // 16 = 1 block
    assert cache.lookup(A + B).cached_tokens == 16
    assert cache.lookup(A + B + "z").cached_tokens == 32  # 33 tokens: 2 blocks may hit


def test_lru_evicts_the_tail_of_the_least_recent_chain_first() -> None:
    cache = PrefixCache(capacity_tokens=64)  # 4 blocks
    cache.insert(cache.lookup(A + B + C + "!").hashes)  # 3 blocks
    cache.insert(cache.lookup(D + D + "!").hashes)  # 2 more: one must go, and it is A+B+C's C
    assert len(cache) == 4
    assert cache.usage == 1.0
    assert cache.lookup(A + B + C + "!").cached_tokens == 32
    assert cache.lookup(D + D + "!").cached_tokens == 32


def test_a_touched_chain_survives_a_newer_insert() -> None:
    cache = PrefixCache(capacity_tokens=64)
    cache.insert(cache.lookup(A + B + "!").hashes)
    cache.insert(cache.lookup(C + C + "!").hashes)  # full: 4 blocks
    assert cache.lookup(A + B + "!").cached_tokens == 32  # touches A, A+B: C's chain is older
    cache.insert(cache.lookup(D + "!").hashes)  # evicts C+C (the older chain's tail)
    assert cache.lookup(A + B + "!").cached_tokens == 32
    assert cache.lookup(C + C + "!").cached_tokens == 16


def test_zero_capacity_never_hits() -> None:
    cache = PrefixCache(capacity_tokens=0)
    cache.insert(cache.lookup(A + B + "!").hashes)
    assert cache.lookup(A + B + "!").cached_tokens == 0
    assert cache.usage == 0.0


def test_block_hashes_are_chained_and_full_blocks_only() -> None:
    assert block_hashes(A[:63], 64) == []
    one = block_hashes(A, 64)
    two = block_hashes(A + B, 64)
    assert len(one) == 1
    assert len(two) == 2
    assert two[0] == one[0]
    assert block_hashes(B, 64)[0] != two[1]  # B after A is not B alone
