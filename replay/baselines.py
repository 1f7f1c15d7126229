"""Cache-blind and hash-based baselines: `flat-lb`, `sticky`, `chwbl`.

* `flat-lb` - power-of-two-choices on in-flight requests. It *is* the dispatcher's Router with no
  plan (every key is cold there), so the baseline and CacheRoute share one P2C implementation.
* `sticky` - consistent hashing with virtual nodes (`VNODES` per destination, blake2b points):
  every request of a key goes to the owner of the first point clockwise of the key's hash.
* `chwbl` - consistent hashing with bounded loads (Mirrokni, Thorup, Zadimoghaddam 2018): walk the
  ring from the key's point and take the first destination whose in-flight count is below
  ceil(c * (total in flight + 1) / R), with c = 1.25 (the load-aware hashing of Envoy, HAProxy).

Gossip (`--sync-s`, fleet.py): in a fleet each gateway counts only its own requests in flight.
`flat-lb` and `chwbl` can take their peers' counts at every sync (`PeerState`): a gateway then
decides on its own counts (kept live) plus the sum of the others' as of the last sync (`remote`),
as peers that gossip their load would. `sticky` uses no load, so it has nothing to merge.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from cacheroute.dispatcher.routing import Router
from cacheroute.replay.policy import Policy, PolicyContext, UIntArray
from cacheroute.replay.requestset import IntArray

__all__ = ["CHWBL_C", "VNODES", "Chwbl", "FlatLB", "PeerState", "Ring", "Sticky", "peer_load"]

VNODES = 160
CHWBL_C = 1.25


@dataclass(frozen=True, slots=True)
class PeerState:
    """What one gateway reports to its peers at a sync: its own view, never what it merged.

    Reporting only its own load (and only the blocks it sent itself) keeps gossip from counting
    a request twice: every peer adds up the reports, so each request is counted once, by the
    gateway that routed it.
    """

    load: list[float]
    """The gateway's own load per destination (in-flight requests, or Preble's GPU seconds)."""


def peer_load(others: list[object], destinations: int) -> list[float]:
    """Per destination, the sum of the peers' reported loads (what a gateway adds to its own)."""
    total = [0.0] * destinations
    for other in others:
        if not isinstance(other, PeerState):
            raise TypeError(f"a peer reported {type(other).__name__}, not a PeerState")
        for d, x in enumerate(other.load):
            total[d] += x
    return total


class _CountsGossip(Policy):
    """Gossip of in-flight counts (`FleetConfig.sync_s` with `sync_load`): the state is the counts."""

    def start_sync(self, fleet: Sequence[object]) -> None:
        """Nothing to record between syncs: the in-flight counts are the state."""
        del fleet

    def export_state(self, t: float) -> PeerState:
        """This gateway's own in-flight counts."""
        del t
        return PeerState([float(x) for x in self.inflight])


class FlatLB(_CountsGossip):
    """Power-of-two-choices: the dispatcher's Router with no plan."""

    name = "flat-lb"

    def __init__(self, ctx: PolicyContext) -> None:
        super().__init__(ctx)
        self.router = Router(ctx.names, rng=ctx.random(1), cold_affinity=False)
        self.inflight = self.router.inflight
        self.keys = ctx.requests.keys
        self.remote: list[float] | None = None
        """The peers' in-flight counts at the last sync (None: no sync yet, or no gossip)."""

    def route(self, i: int, t: float) -> int:
        remote = self.remote
        if remote is None:
            d = self.router.route_index(self.keys[self.key_index[i]])
        else:
            d = self._p2c_with(remote)
        self.router.acquire(d)
        return d

    def _p2c_with(self, remote: list[float]) -> int:
        """The Router's P2C (same draws from its stream) on own + peers' in-flight counts.

        The Router compares only its own counts, so a gossiping gateway draws its two candidates
        here; every destination is up in a replay, as the Router's `live` list then says.
        """
        n = len(remote)
        if n == 1:
            return 0
        rnd = self.router.rng.random
        a = int(rnd() * n)
        b = int(rnd() * (n - 1))
        if b >= a:
            b += 1  # two distinct candidates
        inflight = self.inflight
        return a if inflight[a] + remote[a] <= inflight[b] + remote[b] else b

    def merge_state(self, others: list[object], *, loads: bool) -> None:
        """Take the peers' counts as this gateway's view of the load it did not send."""
        if loads:
            self.remote = peer_load(others, self.ctx.destinations)

    def release(self, d: int, i: int) -> None:
        self.router.release(d)


class Ring:
    """A consistent-hash ring: `VNODES` points per destination, sorted."""

    def __init__(self, destinations: int, vnodes: int = VNODES) -> None:
        points = np.empty(destinations * vnodes, dtype=np.uint64)
        owners = np.repeat(np.arange(destinations, dtype=np.int64), vnodes)
        for j in range(points.size):
            label = f"d{owners[j]}#{j % vnodes}".encode()
            points[j] = int.from_bytes(hashlib.blake2b(label, digest_size=8).digest(), "little")
        order = np.argsort(points, kind="stable")
        self.points: UIntArray = points[order]
        self.owners: IntArray = owners[order]
        self.destinations = destinations

    def start(self, hashes: UIntArray) -> IntArray:
        """Index of the first ring point clockwise of each hash."""
        out: IntArray = np.searchsorted(self.points, hashes, side="left").astype(np.int64)
        out %= self.points.size
        return out

    def walk(self, start: int) -> list[int]:
        """Distinct destinations in ring order from point `start`."""
        seen: list[int] = []
        n = self.points.size
        for j in range(n):
            d = int(self.owners[(start + j) % n])
            if d not in seen:
                seen.append(d)
                if len(seen) == self.destinations:
                    break
        return seen


class Sticky(Policy):
    """Consistent hashing: a key always goes to its ring owner."""

    name = "sticky"

    def __init__(self, ctx: PolicyContext) -> None:
        super().__init__(ctx)
        ring = Ring(ctx.destinations)
        self.owner: list[int] = ring.owners[ring.start(ctx.hashes)].tolist()

    def route(self, i: int, t: float) -> int:
        d = self.owner[self.key_index[i]]
        self.inflight[d] += 1
        return d


class Chwbl(_CountsGossip):
    """Consistent hashing with bounded loads (c = 1.25) on in-flight requests."""

    name = "chwbl"

    def __init__(self, ctx: PolicyContext, c: float = CHWBL_C) -> None:
        super().__init__(ctx)
        self.ring = Ring(ctx.destinations)
        self.start: list[int] = self.ring.start(ctx.hashes).tolist()
        self.walks: dict[int, list[int]] = {}
        self.c = c
        self.total = 0
        self.spilled = 0
        self.remote: list[float] | None = None
        """The peers' in-flight counts at the last sync (None: no sync yet, or no gossip)."""
        self.remote_total = 0.0

    def route(self, i: int, t: float) -> int:
        k = self.key_index[i]
        walk = self.walks.get(k)
        if walk is None:
            walk = self.walks[k] = self.ring.walk(self.start[k])
        inflight = self.inflight
        d = walk[0]
        remote = self.remote
        if remote is None:
            bound = math.ceil(self.c * (self.total + 1) / self.ctx.destinations)
            for cand in walk:
                if inflight[cand] < bound:
                    d = cand
                    break
        else:  # the bound and the loads both count the peers' requests too
            total = self.total + self.remote_total
            bound = math.ceil(self.c * (total + 1) / self.ctx.destinations)
            for cand in walk:
                if inflight[cand] + remote[cand] < bound:
                    d = cand
                    break
        if d != walk[0]:
            self.spilled += 1
        inflight[d] += 1
        self.total += 1
        return d

    def release(self, d: int, i: int) -> None:
        self.inflight[d] -= 1
        self.total -= 1

    def merge_state(self, others: list[object], *, loads: bool) -> None:
        """Take the peers' counts as this gateway's view of the load it did not send."""
        if loads:
            self.remote = peer_load(others, self.ctx.destinations)
            self.remote_total = sum(self.remote)

    def describe(self) -> dict[str, Any]:
        return {"c": self.c, "spilled_requests": self.spilled}
