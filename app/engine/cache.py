"""The engine stand-in's prefix cache: an LRU over chained hashes of fixed-size prompt blocks.

It models what vLLM's automatic prefix caching does, at the resolution the gateway can observe:

- a prompt is cut into full blocks of `block_chars` characters (`block_tokens` tokens at 4
  characters per token); a partial last block is never cached;
- block j is identified by a hash of block j's text *and* the hash of block j-1, so a block only
  matches when everything before it matches too (a prefix, not a substring);
- a lookup walks the chain from the first block and stops at the first miss;
- at most `prompt_tokens - 1` tokens can hit, because the engine must compute the last prompt
  token to produce the first output token (vLLM caps its hit length the same way);
- capacity is counted in blocks (`capacity_tokens // block_tokens`); the least recently used
  block is evicted first, and a request touches its chain from the last block to the first, so
  the first blocks of a prompt are the most recent and a chain is evicted from its tail.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass

from cacheroute.openai_api import CHARS_PER_TOKEN, estimate_tokens

__all__ = ["CacheResult", "PrefixCache", "block_hashes"]

_ROOT = b"\x00" * 16


def block_hashes(text: str, block_chars: int) -> list[bytes]:
    """Chained 16-byte blake2b hashes of the full `block_chars`-character blocks of `text`."""
    out: list[bytes] = []
    prev = _ROOT
    for start in range(0, len(text) - block_chars + 1, block_chars):
        block = text[start : start + block_chars].encode("utf-8", "surrogatepass")
        prev = hashlib.blake2b(prev + block, digest_size=16).digest()
        out.append(prev)
    return out


@dataclass(frozen=True, slots=True)
class CacheResult:
    """What one prompt found in the cache."""

    prompt_tokens: int
    cached_tokens: int
    hashes: tuple[bytes, ...]
    """The prompt's full-block chain, for `insert` once the prefill is done."""


class PrefixCache:
    """LRU prefix cache of one engine (single-threaded: the engine's event loop owns it)."""

    def __init__(self, capacity_tokens: int, *, block_tokens: int = 16) -> None:
        if block_tokens < 1:
            raise ValueError("block_tokens must be >= 1")
        self.block_tokens = block_tokens
        self.block_chars = block_tokens * CHARS_PER_TOKEN
        self.capacity_blocks = max(0, capacity_tokens // block_tokens)
        self._blocks: OrderedDict[bytes, None] = OrderedDict()
        self.queries_tokens = 0
        self.hit_tokens = 0

    def __len__(self) -> int:
        return len(self._blocks)

    @property
    def usage(self) -> float:
        """Fraction of the capacity in use (0 when the cache has no capacity)."""
        return len(self._blocks) / self.capacity_blocks if self.capacity_blocks else 0.0

    def lookup(self, text: str) -> CacheResult:
        """Match `text` against the cache, touch the matched blocks, count the query."""
        prompt_tokens = max(1, estimate_tokens(text))
        hashes = block_hashes(text, self.block_chars)
        limit = (prompt_tokens - 1) // self.block_tokens  # the last token is always computed
        matched = 0
        blocks = self._blocks
        for h in hashes[:limit]:
            if h not in blocks:
                break
            matched += 1
        for h in reversed(hashes[:matched]):
            blocks.move_to_end(h)
        cached = matched * self.block_tokens
        self.queries_tokens += prompt_tokens
        self.hit_tokens += cached
        return CacheResult(prompt_tokens, cached, tuple(hashes))

    def insert(self, hashes: tuple[bytes, ...]) -> None:
        """Store a computed prompt's blocks (most recent: its first block), evicting LRU blocks."""
        if self.capacity_blocks == 0:
            return
        blocks = self._blocks
        for h in reversed(hashes[: self.capacity_blocks]):
            blocks[h] = None
            blocks.move_to_end(h)
        while len(blocks) > self.capacity_blocks:
            blocks.popitem(last=False)
