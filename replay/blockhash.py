"""Block-hash traces at another block size: find the size, merge fine hashes into replay blocks.

Why: the public traces with per-block prefix hashes do not agree on the block. Mooncake's list
one id per 512-token block; Alibaba's Bailian (Qwen) usage traces one per 16-token block (the
`blksz_16` in their file names, the block of the serving engine's paged cache). The replay's
cache, its routing keys (`key_blocks` leading blocks) and session keys work in 512-token
blocks, as the bundled traces and the service model do. Replaying 16-token blocks as they come
would make every request 32 times as many cache entries (an 85k-token prompt: 5,300), and a key of
"the first 2 blocks" would be 32 tokens of a system prompt instead of 1k. So fine hashes are
merged into coarse blocks first: what is lost is a hit on part of a 512-token block, as with a
Mooncake trace.

Coarse ids come from a trie over groups of fine ids, so two requests share coarse block j
exactly when they share every fine block up to its end, whether or not the trace's own ids are
chained (an id that depends on everything before it) or content-only.
"""

from __future__ import annotations

from collections.abc import Sequence

from cacheroute.replay.errors import ReplayError

__all__ = ["BLOCK_SIZE_CANDIDATES", "BlockMerger", "infer_block_tokens"]

BLOCK_SIZE_CANDIDATES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
"""Block sizes (tokens) `infer_block_tokens` tries: powers of two that divide 512."""

_AGREEMENT = 0.9
"""Share of requests whose id count must match a block size for it to be taken."""


def infer_block_tokens(prompt_tokens: Sequence[int], id_counts: Sequence[int]) -> int:
    """The block size (tokens) under which most requests list one hash id per block.

    A request of p tokens lists ceil(p / size) ids (Mooncake's and Bailian's traces: the partial
    last block has an id too) or floor(p / size) (full blocks only, as some generators write).

    Raises `ReplayError` when no candidate fits at least 90% of the requests: the ids then do
    not describe the prompt's blocks, and any replay of the trace would invent its cache hits.
    Ties (prompts shorter than every tied size, one id each) go to the smallest size.
    """
    n = len(prompt_tokens)
    if n == 0 or n != len(id_counts):
        raise ReplayError(f"need one id count per prompt, got {len(id_counts)} for {n} prompts")
    best, best_share = BLOCK_SIZE_CANDIDATES[0], -1.0
    for size in BLOCK_SIZE_CANDIDATES:
        fits = sum(
            1
            for p, c in zip(prompt_tokens, id_counts, strict=True)
            if p // size <= c <= -(-p // size)
        )
        if fits / n > best_share:
            best, best_share = size, fits / n
    if best_share < _AGREEMENT:
        raise ReplayError(
            f"hash_ids fit no block size: at best {best_share:.0%} of requests list one id "
            f"per {best}-token block (tried {', '.join(map(str, BLOCK_SIZE_CANDIDATES))} "
            "tokens); each request's hash_ids must be one id per block of its prompt"
        )
    return best


class BlockMerger:
    """Merges each request's fine ids into coarse blocks as the requests are read.

    A coarse block is `tokens // fine_tokens` consecutive fine ids; a request's last group may be
    shorter (its prompt's tail: a partial block, as the partial last id of a Mooncake request).
    A coarse block is full when all its fine blocks are full ones (within the prompt's
    `prompt // fine_tokens` full fine blocks and listed). One request at a time, so a reader
    holds coarse ids only: a long trace's fine ids would take gigabytes.
    """

    def __init__(self, fine_tokens: int, tokens: int) -> None:
        if fine_tokens < 1 or tokens % fine_tokens:
            raise ReplayError(f"a {fine_tokens}-token block does not divide a {tokens}-token block")
        self.fine_tokens = fine_tokens
        self.group = tokens // fine_tokens
        self._nodes: dict[tuple[int, tuple[int, ...]], int] = {}

    def add(self, ids: Sequence[int], prompt_tokens: int) -> tuple[list[int], int]:
        """One request's coarse ids and how many of them are full blocks."""
        nodes, group = self._nodes, self.group
        parent = -1
        row: list[int] = []
        for start in range(0, len(ids), group):
            edge = (parent, tuple(ids[start : start + group]))
            node = nodes.get(edge)
            if node is None:
                node = nodes[edge] = len(nodes)
            row.append(node)
            parent = node
        return row, min(len(ids), prompt_tokens // self.fine_tokens) // group
