"""A router-side approximate prefix index: which destinations were recently sent which blocks.

This is what cache-aware routers keep (SGLang's approximate radix tree, Preble's global prefix
tree): not the replicas' real caches, but a record of the prompts the router sent to each of them,
trimmed LRU to a size budget. Over hashed blocks (equal id = equal prefix up to that block) the
tree's longest-prefix match is the longest run of leading blocks one destination holds.

`holders[block]` is a bitmask of destinations, so one pass over a prompt's blocks gives the match
length on every destination at once.
"""

from __future__ import annotations

from collections import OrderedDict

__all__ = ["PrefixIndex"]


class PrefixIndex:
    """Per-destination LRU sets of blocks with a shared block -> destinations bitmask."""

    def __init__(self, destinations: int, capacity_blocks: int) -> None:
        self.destinations = destinations
        self.capacity = max(1, capacity_blocks)
        self.holders: dict[int, int] = {}
        self.lru: list[OrderedDict[int, None]] = [OrderedDict() for _ in range(destinations)]
        self.full = (1 << destinations) - 1

    def match(self, blocks: list[int]) -> list[int]:
        """Leading blocks of `blocks` each destination holds."""
        lengths = [0] * self.destinations
        mask = self.full
        holders = self.holders
        j = 0
        for b in blocks:
            have = holders.get(b, 0) & mask
            if have != mask:
                if j:
                    gone = mask & ~have
                    while gone:
                        low = gone & -gone
                        lengths[low.bit_length() - 1] = j
                        gone ^= low
                mask = have
                if not mask:
                    return lengths
            j += 1
        while mask:
            low = mask & -mask
            lengths[low.bit_length() - 1] = j
            mask ^= low
        return lengths

    def insert(self, d: int, blocks: list[int]) -> None:
        """Record that `blocks` were sent to d (deepest first, so block 0 is the most recent)."""
        bit = 1 << d
        lru = self.lru[d]
        holders = self.holders
        for b in reversed(blocks):
            if b in lru:
                lru.move_to_end(b)
            else:
                lru[b] = None
                holders[b] = holders.get(b, 0) | bit
        while len(lru) > self.capacity:
            old, _ = lru.popitem(last=False)
            left = holders[old] & ~bit
            if left:
                holders[old] = left
            else:
                del holders[old]

    def size(self, d: int) -> int:
        """Blocks recorded for destination d."""
        return len(self.lru[d])
