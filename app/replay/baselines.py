"""Cache-blind and hash-based baselines: `flat-lb`, `sticky`, `chwbl`.

* `flat-lb` - power-of-two-choices on in-flight requests. It *is* the dispatcher's Router with no
  plan (every key is cold there), so the baseline and CacheRoute share one P2C implementation.
* `sticky` - consistent hashing with virtual nodes (`VNODES` per destination, blake2b points):
  every request of a key goes to the owner of the first point clockwise of the key's hash.
* `chwbl` - consistent hashing with bounded loads (Mirrokni, Thorup, Zadimoghaddam 2018): walk the
  ring from the key's point and take the first destination whose in-flight count is below
  ceil(c * (total in flight + 1) / R), with c = 1.25 (the load-aware hashing of Envoy, HAProxy).
"""

from __future__ import annotations

import hashlib
import math
from typing import Any

import numpy as np

from cacheroute.dispatcher.routing import Router
from cacheroute.replay.policy import Policy, PolicyContext, UIntArray
from cacheroute.replay.requestset import IntArray

__all__ = ["CHWBL_C", "VNODES", "Chwbl", "FlatLB", "Ring", "Sticky"]

VNODES = 160
CHWBL_C = 1.25


class FlatLB(Policy):
    """Power-of-two-choices: the dispatcher's Router with no plan."""

    name = "flat-lb"

    def __init__(self, ctx: PolicyContext) -> None:
        super().__init__(ctx)
        self.router = Router(ctx.names, rng=ctx.random(1), cold_affinity=False)
        self.inflight = self.router.inflight
        self.keys = ctx.requests.keys

    def route(self, i: int, t: float) -> int:
        d = self.router.route_index(self.keys[self.key_index[i]])
        self.router.acquire(d)
        return d

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


class Chwbl(Policy):
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

    def route(self, i: int, t: float) -> int:
        k = self.key_index[i]
        walk = self.walks.get(k)
        if walk is None:
            walk = self.walks[k] = self.ring.walk(self.start[k])
        bound = math.ceil(self.c * (self.total + 1) / self.ctx.destinations)
        inflight = self.inflight
        d = walk[0]
        for cand in walk:
            if inflight[cand] < bound:
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

    def describe(self) -> dict[str, Any]:
        return {"c": self.c, "spilled_requests": self.spilled}
