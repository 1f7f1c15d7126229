"""A router-side approximate prefix index: which destinations were recently sent which blocks.

This is what cache-aware routers keep (SGLang's approximate radix tree, Preble's global prefix
tree): not the replicas' real caches, but a record of the prompts the router sent to each of them,
trimmed LRU to a size budget. Over hashed blocks (equal id = equal prefix up to that block) the
tree's longest-prefix match is the longest run of leading blocks one destination holds.

`holders[block]` is a bitmask of destinations, so one pass over a prompt's blocks gives the match
length on every destination at once.

Gossip (`--sync-s`, replay only): a fleet's gateways that share their trees keep journals of
what they sent since the last sync (`replay/sharedprefixes.py`); `merge` replays their union into
an index in stamp order, so a block's latest insert anywhere decides its recency, as in a single
router that saw every gateway's requests (the LRU budget still holds).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

__all__ = ["PrefixIndex", "match_lengths"]


def match_lengths(masks: Iterable[int], destinations: int, full: int) -> list[int]:
    """Per destination, how many leading blocks of a prompt it holds, given each block's holder
    bitmask in prompt order (`full`: every destination's bit). Stops at the first block no
    destination still matching holds, so `masks` may be a generator."""
    lengths = [0] * destinations
    mask = full
    j = 0
    for held in masks:
        have = held & mask
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
        holders = self.holders
        return match_lengths((holders.get(b, 0) for b in blocks), self.destinations, self.full)

    def insert(self, d: int, blocks: list[int]) -> int:
        """Record that `blocks` were sent to d (deepest first, so block 0 is the most recent);
        returns how many of them d did not hold (what its cache had to take in, by this index)."""
        return self._touch(d, blocks[::-1])

    def size(self, d: int) -> int:
        """Blocks recorded for destination d."""
        return len(self.lru[d])

    def merge(self, journals: list[list[dict[int, int]]]) -> None:
        """Learn the blocks of every journal (per destination: block -> stamp of its latest insert).

        The union is replayed in stamp order - a block's latest insert anywhere decides its
        recency. Cost: one dict pass and one sort over the interval's distinct blocks.
        """
        for d in range(self.destinations):
            union: dict[int, int] = {}
            for journal in journals:
                for b, stamp in journal[d].items():
                    if stamp > union.get(b, -1):
                        union[b] = stamp
            if union:
                self._touch(d, sorted(union, key=union.__getitem__))

    def _touch(self, d: int, blocks: list[int]) -> int:
        """Make `blocks` the most recent of d's, the last one most (oldest first), then trim.
        Returns how many of them were new to d."""
        bit = 1 << d
        lru = self.lru[d]
        holders = self.holders
        added = 0
        for b in blocks:
            if b in lru:
                lru.move_to_end(b)
            else:
                lru[b] = None
                holders[b] = holders.get(b, 0) | bit
                added += 1
        while len(lru) > self.capacity:
            old, _ = lru.popitem(last=False)
            left = holders[old] & ~bit
            if left:
                holders[old] = left
            else:
                del holders[old]
        return added
