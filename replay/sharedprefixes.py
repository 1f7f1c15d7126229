"""Prefix indexes of a gossiping fleet: one shared index as of the last sync, a view per gateway.

Why: with `--sync-s`, every gateway of a fleet learns at each sync the blocks every peer sent
since the last one, and afterwards all gateways' indexes agree (`PrefixIndex.merge` replays the
union of the journals in stamp order). Each of G gateways replaying the same union into its own
copy made a sync cost G times the work of one: at G = 16 and a sync every 0.25 s of replay time,
three quarters of an evidence run's time went to it (cProfile of the Mooncake arXiv trace,
`--quick --gateways 16 --sync-s 0.25`: 295 of 408 s in `merge`).

Here the fleet keeps one `PrefixIndex`, the state every gateway agreed on at the last sync, and
each gateway a `GatewayPrefixes` view: that index plus what the gateway sent since. The view is
exactly the gateway's own LRU index: per destination, its order is the shared index's blocks
(oldest first, those the gateway has since sent again left out) followed by the blocks the
gateway sent, in the order it sent them; trimming to the budget takes the oldest first, so a
cursor walks the shared index's order and marks what the view dropped. At a sync the union of
the views' journals is replayed into the shared index once, and the views start empty again.

That the shared index after a sync is what each gateway's own index would have become: an LRU
index keeps the `capacity` most recently touched blocks, in order of their last touch. A gateway's
own index before the sync holds the shared blocks it had not pushed out, then its own; replaying
the union (its own blocks among it) in stamp order leaves the union's blocks last, by stamp,
after the shared blocks outside the union, in their order - the same sequence whatever the
gateway sent - and the blocks its own inserts pushed out were the oldest of those, which the
replay trims anyway. `tests/unit/replay/test_sharedprefixes.py` checks this against gateways
that each keep and merge a whole index, on random inserts and syncs.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator

from cacheroute.dispatcher.prefixes import PrefixIndex, match_lengths

__all__ = ["GatewayPrefixes", "SharedPrefixes"]

_STAMP_STRIDE = 1 << 24
"""Journal stamp = request index * this + position in the insert (prompts stay below 2**24 blocks)."""


class SharedPrefixes:
    """The fleet's prefix index as of the last sync, and the gateways' views of it."""

    def __init__(self, destinations: int, capacity_blocks: int) -> None:
        self.index = PrefixIndex(destinations, capacity_blocks)
        self.views: list[GatewayPrefixes] = []

    def join(self) -> GatewayPrefixes:
        """A new gateway's view (joining before any block was sent)."""
        view = GatewayPrefixes(self.index)
        self.views.append(view)
        return view

    def merge(self) -> None:
        """The sync: replay every view's journal into the shared index, then empty the views.
        Nothing to do when no gateway sent anything since (so every gateway of a sync may call
        it: the first one merges)."""
        sent = [v for v in self.views if v.dirty]
        if not sent:
            return
        self.index.merge([v.journal for v in sent])
        sizes = [len(lru) for lru in self.index.lru]
        for view in sent:
            view.reset()
        for view in self.views:
            view.sizes = sizes.copy()


class GatewayPrefixes:
    """One gateway's prefix index: the shared index as of the last sync + what it sent since.

    Same answers as a `PrefixIndex` this gateway kept and merged itself (module docstring).
    """

    __slots__ = (
        "base",
        "capacity",
        "cursor",
        "destinations",
        "dirty",
        "full",
        "gone",
        "journal",
        "own",
        "own_holders",
        "sizes",
    )

    def __init__(self, base: PrefixIndex) -> None:
        self.base = base
        self.destinations = base.destinations
        self.capacity = base.capacity
        self.full = base.full
        self.own: list[OrderedDict[int, None]] = []
        """Per destination, the blocks this gateway sent since the sync (oldest first)."""
        self.own_holders: dict[int, int] = {}
        """Block -> bitmask of the destinations `own` holds it for."""
        self.gone: dict[int, int] = {}
        """Block -> bitmask of the destinations whose view dropped the shared index's copy."""
        self.cursor: list[Iterator[int] | None] = []
        """Per destination, the walk over the shared index's blocks, oldest first, that trims."""
        self.sizes: list[int] = []
        self.journal: list[dict[int, int]] = []
        """Per destination: block -> stamp of its latest insert since the sync (for `merge`)."""
        self.dirty = False
        """Whether this gateway sent anything since the sync (else `reset` has nothing to do)."""
        self.reset()
        self.sizes = [len(lru) for lru in base.lru]

    def reset(self) -> None:
        """Forget what was sent since the sync (the shared index has merged it); the fleet
        sets `sizes` from the merged index."""
        n = self.destinations
        self.own = [OrderedDict() for _ in range(n)]
        self.own_holders = {}
        self.gone = {}
        self.cursor = [None] * n
        self.journal = [{} for _ in range(n)]
        self.dirty = False

    def match(self, blocks: list[int]) -> list[int]:
        """Leading blocks of `blocks` each destination holds (as `PrefixIndex.match`)."""
        shared, own, gone = self.base.holders, self.own_holders, self.gone
        return match_lengths(
            ((shared.get(b, 0) & ~gone.get(b, 0)) | own.get(b, 0) for b in blocks),
            self.destinations,
            self.full,
        )

    def insert(self, d: int, blocks: list[int], seq: int) -> int:
        """Record that `blocks` (request `seq`'s, in the fleet's order) were sent to d; returns
        how many of them d did not hold (as `PrefixIndex.insert`)."""
        self.dirty = True
        journal = self.journal[d]
        stamp = seq * _STAMP_STRIDE
        for k, b in enumerate(reversed(blocks)):
            journal[b] = stamp + k
        bit = 1 << d
        own = self.own[d]
        holders = self.own_holders
        shared = self.base.lru[d]
        gone = self.gone
        added = 0
        for b in reversed(blocks):  # deepest first, so block 0 ends the most recent
            if b in own:
                own.move_to_end(b)
                continue
            own[b] = None
            holders[b] = holders.get(b, 0) | bit
            if b not in shared or gone.get(b, 0) & bit:
                added += 1
        if added:
            size = self.sizes[d] + added
            if size > self.capacity:
                self._trim(d, bit, size - self.capacity)
            self.sizes[d] = min(size, self.capacity)
        return added

    def size(self, d: int) -> int:
        """Blocks d holds in this view."""
        return self.sizes[d]

    def _trim(self, d: int, bit: int, excess: int) -> None:
        """Drop d's `excess` oldest blocks: first those of the shared index this view still
        holds, oldest first, then, once none is left, the oldest this gateway sent."""
        walk = self.cursor[d]
        if walk is None:
            walk = self.cursor[d] = iter(self.base.lru[d])
        own = self.own[d]
        gone = self.gone
        for b in walk:
            if b not in own:  # a block sent again since is as recent as its new place in own
                gone[b] = gone.get(b, 0) | bit
                excess -= 1
                if not excess:
                    return
        holders = self.own_holders
        shared = self.base.lru[d]
        for _ in range(excess):
            b = own.popitem(last=False)[0]
            left = holders[b] & ~bit
            if left:
                holders[b] = left
            else:
                del holders[b]
            if b in shared:
                gone[b] = gone.get(b, 0) | bit
