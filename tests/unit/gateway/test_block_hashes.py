"""The gateway's prefix block hashes: the same identity the trace readers give blocks."""

from __future__ import annotations

import hashlib

from cacheroute.openai_api import prefix_block_hashes

A, B, C = "a" * 8, "b" * 8, "c" * 8  # 2-token blocks at 4 characters a token


def test_only_full_blocks_are_hashed() -> None:
    assert prefix_block_hashes(A[:7], 2) == []
    assert len(prefix_block_hashes(A + B + "xyz", 2)) == 2
    assert prefix_block_hashes(A, 0) == []


def test_prompts_share_exactly_their_common_leading_blocks() -> None:
    ab, abc, acb = (prefix_block_hashes(t, 2) for t in (A + B, A + B + C, A + C + B))
    assert abc[:2] == ab
    assert acb[0] == ab[0]
    assert acb[1] != ab[1]


def test_a_block_is_identified_by_everything_before_it() -> None:
    # the same text after a different prefix is another block (a prefix, not a substring)
    assert prefix_block_hashes(A + C, 2)[1] != prefix_block_hashes(B + C, 2)[1]
    assert prefix_block_hashes(C, 2)[0] != prefix_block_hashes(A + C, 2)[1]


def test_the_first_hash_is_blake2b_of_the_root_and_the_block_as_a_signed_long() -> None:
    # the definition, spelled out once, so gateways of every version agree on the wire
    digest = hashlib.blake2b(bytes(8) + A.encode(), digest_size=8).digest()
    (first,) = prefix_block_hashes(A, 2)
    assert first == int.from_bytes(digest, "little", signed=True)
    assert -(2**63) <= first < 2**63


def test_non_ascii_text_is_cut_by_characters() -> None:
    text = "é" * 16  # 16 characters, 32 bytes: two 2-token blocks by the token estimate
    hashes = prefix_block_hashes(text, 2)
    assert len(hashes) == 2
    assert hashes[1] != hashes[0]


def test_a_limit_keeps_only_the_leading_blocks() -> None:
    text = "".join(chr(ord("a") + i) * 8 for i in range(5))  # five 2-token blocks
    whole = prefix_block_hashes(text, 2)
    assert len(whole) == 5
    assert prefix_block_hashes(text, 2, 3) == whole[:3]
    assert prefix_block_hashes(text, 2, 9) == whole
    assert prefix_block_hashes(text, 2, 0) == []
