"""A router-side approximate prefix index: which destinations were recently sent which blocks.

This is what cache-aware routers keep (SGLang's approximate radix tree, Preble's global prefix
tree): not the replicas' real caches, but a record of the prompts the router sent to each of them,
trimmed LRU to a size budget. Over hashed blocks (equal id = equal prefix up to that block) the
tree's longest-prefix match is the longest run of leading blocks one destination holds.

`holders[block]` is a bitmask of destinations, so one pass over a prompt's blocks gives the match
length on every destination at once.

Gossip (`--sync-s`): gateways of a fleet that share their trees periodically keep a *journal* - per
destination, the blocks inserted since the last sync, each stamped with its place in the global
request order. `merge` replays the union of every gateway's journal in stamp order, so after a
sync every gateway's index holds the same blocks per destination, in the recency order a single
router that saw all of the interval's requests would have given them (the LRU budget still holds).
"""

from __future__ import annotations

from collections import OrderedDict

__all__ = ["PrefixIndex"]

_STAMP_STRIDE = 1 << 24
"""Journal stamp = request index * this + position in the insert (prompts stay below 2**24 blocks)."""


class PrefixIndex:
    """Per-destination LRU sets of blocks with a shared block -> destinations bitmask."""

    def __init__(self, destinations: int, capacity_blocks: int) -> None:
        self.destinations = destinations
        self.capacity = max(1, capacity_blocks)
        self.holders: dict[int, int] = {}
        self.lru: list[OrderedDict[int, None]] = [OrderedDict() for _ in range(destinations)]
        self.full = (1 << destinations) - 1
        self.journal: list[dict[int, int]] | None = None
        """Per destination: block -> stamp of its latest insert since the last sync (None: off)."""

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

    def insert(self, d: int, blocks: list[int], seq: int = 0) -> int:
        """Record that `blocks` were sent to d (deepest first, so block 0 is the most recent);
        returns how many of them d did not hold (what its cache had to take in, by this index).

        `seq` orders inserts across gateways (the request's index) for the journal, if kept.
        """
        if self.journal is not None:
            journal = self.journal[d]
            base = seq * _STAMP_STRIDE
            for k, b in enumerate(reversed(blocks)):
                journal[b] = base + k
        return self._touch(d, blocks[::-1])

    def size(self, d: int) -> int:
        """Blocks recorded for destination d."""
        return len(self.lru[d])

    def start_journal(self) -> None:
        """Keep a journal of inserts from now on, for `merge` (gossiping gateways)."""
        self.journal = [{} for _ in range(self.destinations)]

    def merge(self, journals: list[list[dict[int, int]]]) -> None:
        """Learn every journal's blocks (this index's own among them), then start a new journal.

        The union is replayed in stamp order - a block's latest insert anywhere decides its
        recency - so indexes that merged the same journals agree on which blocks every
        destination holds. Cost: one dict pass and one sort over the interval's distinct blocks.
        """
        for d in range(self.destinations):
            union: dict[int, int] = {}
            for journal in journals:
                for b, stamp in journal[d].items():
                    if stamp > union.get(b, -1):
                        union[b] = stamp
            if union:
                self._touch(d, sorted(union, key=union.__getitem__))
        self.start_journal()

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
