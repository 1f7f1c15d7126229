"""What changed between two plans: the keys that moved and how much rate moved with them.

A key "moved" when its destination *set* changed (compared by destination name, so plans over
different destination lists compare correctly). The order inside the set does not matter: the
dispatcher sends each request to the least-loaded member, so reordering warms nothing new.

How much of a moved key's rate moved: the share of its traffic that `b` sends to destinations
that were not in its set under `a` (`moved_shares`), not all of it. The dispatcher spreads a
key over its members about evenly, so a key on {d0, d1, d2} that moves to {d0, d1, d3} sends a
third of its requests to a cold replica while the other two stay warm; one that shrinks to
{d0, d1} sends none. Counting the whole rate of every multi-replica key whose set changed made
re-planning look several times costlier than it is (the publish advisor's re-warm cost, the
planner's `moved_rate_fraction` gauge, replay's `moved_rate_share`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import repeat
from typing import Any

import numpy as np

from cacheroute.planner.plan import BoolArray, FloatArray, IntArray, Plan

__all__ = ["PlanDiff", "plan_diff", "same_destination_sets"]


@dataclass(frozen=True, slots=True)
class PlanDiff:
    """Keys admitted by both plans with a changed destination set, and keys only one admits."""

    moved_keys: tuple[str, ...]
    """Admitted by both; destination set changed. In `b`'s order."""
    added_keys: tuple[str, ...]
    """Admitted only by `b` (they get a warm home they did not have). In `b`'s order."""
    removed_keys: tuple[str, ...]
    """Admitted only by `a` (they go back to power-of-two-choices). In `a`'s order."""
    kept_keys: int
    """Admitted by both with the same destination set."""
    moved_rate: float
    """Sum over the moved keys of `b`'s rate x its `moved_shares` entry: the rate that now goes
    to a destination that was not warm for its key."""
    added_rate: float
    """Sum of `b`'s rates of the added keys."""
    removed_rate: float
    """Sum of `a`'s rates of the removed keys."""
    admitted_keys: int
    """Keys `b` admits."""
    admitted_rate: float
    """Rate `b` admits."""
    moved_shares: tuple[float, ...] = ()
    """Per moved key (aligned with `moved_keys`): the share of its destinations in `b` that it
    did not have in `a`, |new - old| / |new| (1.0 for a single-replica key that moved, 0.0 for a
    set that only shrank)."""

    @property
    def changed_keys_fraction(self) -> float:
        """Share of `b`'s admitted keys whose home is new (moved or newly admitted)."""
        if self.admitted_keys == 0:
            return 0.0
        return (len(self.moved_keys) + len(self.added_keys)) / self.admitted_keys

    @property
    def changed_rate_fraction(self) -> float:
        """Share of `b`'s admitted rate whose home is new (moved or newly admitted)."""
        if self.admitted_rate <= 0:
            return 0.0
        return (self.moved_rate + self.added_rate) / self.admitted_rate

    def to_dict(self) -> dict[str, Any]:
        """Counts and rates (not the key lists) for JSON output."""
        return {
            "moved_keys": len(self.moved_keys),
            "added_keys": len(self.added_keys),
            "removed_keys": len(self.removed_keys),
            "kept_keys": self.kept_keys,
            "moved_rate": self.moved_rate,
            "added_rate": self.added_rate,
            "removed_rate": self.removed_rate,
            "changed_keys_fraction": self.changed_keys_fraction,
            "changed_rate_fraction": self.changed_rate_fraction,
        }


def same_destination_sets(
    a_offsets: IntArray,
    a_targets: IntArray,
    ia: IntArray,
    b_offsets: IntArray,
    b_targets: IntArray,
) -> BoolArray:
    """Per key of b: True when it is in a (`ia[j] >= 0`, its index in a) with the same set.

    `a_targets` must already be in b's destination index space (-1 for a destination b lacks).
    Vectorised: sorts each key's destinations within its segment and compares them element-wise.
    """
    out = np.zeros(ia.size, dtype=np.bool_)
    both = np.flatnonzero(ia >= 0)
    if both.size == 0:
        return out
    kb = b_offsets[both + 1] - b_offsets[both]
    ka = a_offsets[ia[both] + 1] - a_offsets[ia[both]]
    cand = both[kb == ka]
    if cand.size == 0:
        return out
    kk = b_offsets[cand + 1] - b_offsets[cand]
    seg = np.repeat(np.arange(cand.size, dtype=np.int64), kk)
    within = np.arange(seg.size, dtype=np.int64) - (np.cumsum(kk) - kk)[seg]
    new_t = b_targets[b_offsets[cand][seg] + within]
    old_t = a_targets[a_offsets[ia[cand]][seg] + within]
    new_sorted = new_t[np.lexsort((new_t, seg))]
    old_sorted = old_t[np.lexsort((old_t, seg))]
    differs = np.bincount(seg[new_sorted != old_sorted], minlength=cand.size)
    out[cand[differs == 0]] = True
    return out


def plan_diff(a: Plan, b: Plan) -> PlanDiff:
    """How `b` differs from `a` (typically: live plan a, candidate b)."""
    pos_in_a = {key: i for i, key in enumerate(a.keys)}
    nb = b.n_admitted
    ia = np.fromiter(map(pos_in_a.get, b.keys, repeat(-1, nb)), dtype=np.int64, count=nb)
    b_index = {name: i for i, name in enumerate(b.destination_names)}
    a_to_b = np.array([b_index.get(name, -1) for name in a.destination_names], dtype=np.int64)
    a_targets = a_to_b[a.targets]
    same = same_destination_sets(a.offsets, a_targets, ia, b.offsets, b.targets)
    in_a = ia >= 0
    moved = in_a & ~same
    added = ~in_a
    in_b = np.zeros(a.n_admitted, dtype=np.bool_)
    in_b[ia[in_a]] = True
    removed = np.flatnonzero(~in_b)
    b_rates = b.rates.tolist()
    moved_at = np.flatnonzero(moved)
    shares = _new_destination_shares(a, a_targets, ia[moved_at], b, moved_at).tolist()
    return PlanDiff(
        moved_keys=_pick(b.keys, moved),
        added_keys=_pick(b.keys, added),
        removed_keys=tuple(a.keys[i] for i in removed.tolist()),
        kept_keys=int(np.count_nonzero(same)),
        moved_rate=math.fsum(
            b_rates[i] * f for i, f in zip(moved_at.tolist(), shares, strict=True)
        ),
        added_rate=math.fsum(b_rates[i] for i in np.flatnonzero(added).tolist()),
        removed_rate=math.fsum(a.rates[removed].tolist()),
        admitted_keys=nb,
        admitted_rate=b.admitted_rate,
        moved_shares=tuple(shares),
    )


def _new_destination_shares(
    a: Plan, a_targets: IntArray, ia: IntArray, b: Plan, at: IntArray
) -> FloatArray:
    """Per key `at[j]` of b (its index `ia[j]` in a): the share of its destinations in b that are
    not among its destinations in a.

    `a_targets` must already be in b's destination index space (-1 for a destination b lacks).
    Vectorised: every (key, destination) pair becomes one integer, and b's pairs are looked up
    among a's.
    """
    if ia.size == 0:
        return np.zeros(0, dtype=np.float64)
    destinations = len(b.destination_names)
    b_start = b.offsets[at]
    seg_of = np.arange(ia.size, dtype=np.int64)
    kb = b.offsets[at + 1] - b_start
    kb_seg = np.repeat(seg_of, kb)
    b_pos = np.arange(kb_seg.size, dtype=np.int64) - (np.cumsum(kb) - kb)[kb_seg] + b_start[kb_seg]
    new_codes = kb_seg * destinations + b.targets[b_pos]
    ka = a.offsets[ia + 1] - a.offsets[ia]
    ka_seg = np.repeat(seg_of, ka)
    a_pos = (
        np.arange(ka_seg.size, dtype=np.int64)
        - (np.cumsum(ka) - ka)[ka_seg]
        + a.offsets[ia][ka_seg]
    )
    old = a_targets[a_pos]
    old_codes = (ka_seg * destinations + old)[old >= 0]
    fresh = ~np.isin(new_codes, old_codes)
    counts = np.bincount(kb_seg[fresh], minlength=ia.size).astype(np.float64)
    out: FloatArray = counts / np.maximum(kb, 1)
    return out


def _pick(keys: tuple[str, ...], mask: BoolArray) -> tuple[str, ...]:
    return tuple(keys[i] for i in np.flatnonzero(mask).tolist())
