"""Sibling co-location: which admitted keys share a group, and placement that keeps them together.

Why: a routing key such as `tenant-07/conv-0123` names one conversation, but every conversation of
tenant-07 starts with the tenant's prompt. Plain LPT scatters a tenant's conversations over all R
destinations, so each destination caches its own copy of that prompt; in our whale replays that
copying cost about four points of KV hit rate (docs/EVALUATION.md). Placing siblings on the
destinations their group already uses, as long as a destination stays within the imbalance
tolerance, keeps one copy per group instead of one per destination.

Only groups with two or more admitted keys get an id: a lone key has no sibling to meet, and this
keeps the (groups x R) host matrix small.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np

from cacheroute.planner.kernels import Kernels
from cacheroute.planner.plan import BoolArray, FloatArray, IntArray

__all__ = ["group_of", "place", "sibling_groups"]


def group_of(key: str, separator: str) -> str:
    """The text before the last `separator` ('' if there is none: the key has no group)."""
    return key.rpartition(separator)[0]


def sibling_groups(keys: Sequence[str], separator: str) -> tuple[IntArray, int]:
    """Per key its group id (-1: no sibling among `keys`), and the number of groups."""
    heads = [k.rpartition(separator)[0] for k in keys]
    counts = Counter(heads)
    ids: dict[str, int] = {}
    for head, n in counts.items():
        if head and n >= 2:
            ids[head] = len(ids)
    out = np.fromiter((ids.get(h, -1) for h in heads), dtype=np.int64, count=len(heads))
    return out, len(ids)


def place(
    kernels: Kernels,
    keys: Sequence[str],
    separator: str | None,
    *,
    shares: FloatArray,
    offsets: IntArray,
    kept: IntArray,
    targets: IntArray,
    loads: FloatArray,
    capacities: FloatArray,
    bound: FloatArray,
) -> None:
    """Place every missing replica: LPT, or LPT with sibling co-location when `separator` is set.

    `keys` are the admitted keys in placement order; `targets[offsets[i]:offsets[i] + kept[i]]`
    are replicas already placed (the re-planner's kept ones), which also mark their group's hosts.
    `bound` is the per-destination load a sibling preference may not exceed.
    """
    if separator is None:
        kernels.lpt(shares, offsets, kept, targets, loads, capacities)
        return
    groups, n_groups = sibling_groups(keys, separator)
    if n_groups == 0:
        kernels.lpt(shares, offsets, kept, targets, loads, capacities)
        return
    r = loads.shape[0]
    hosts: BoolArray = np.zeros((n_groups, r), dtype=np.bool_)
    k = np.diff(offsets)
    owner = np.repeat(np.arange(k.size, dtype=np.int64), k)
    is_kept = np.arange(targets.size) - offsets[owner] < kept[owner]
    grouped = is_kept & (groups[owner] >= 0)
    hosts[groups[owner[grouped]], targets[grouped]] = True
    kernels.place_grouped(shares, offsets, kept, targets, loads, capacities, groups, hosts, bound)
