"""Homes: a newly admitted key is placed where its traffic already goes, if that stays balanced.

Why: before a key is admitted it is routed by the gateways' cold path (bounded-load consistent
hashing), so its prefix - for a conversation, its whole history - is cached at that destination.
LPT, placing the key by load alone, may send its next request to a destination that has none of
it: one full recompute per newly admitted key, and on a long-context conversation workload most
admitted keys are newly admitted ones (sessions start and end between plans).

Measured in the replay (`cacheroute evaluate --keep-homes`): at `--quick --seeds 3` +5% SLO
capacity on the conversation workload at one gateway (60.8 -> 63.8 req/s), but -2% on it at 16
gateways and -6% on the Mooncake arXiv trace at 16 gateways (37.6 -> 35.4); at full size no
change at one gateway (62.8) and -4% on Mooncake at 16 (36.7 vs 38.4). A plan packed to the bound
around the homes balances worse, and with many gateways the plan is all the balance there is. So
the evaluation offers it as an option, off by default, and the planner service does not pass
homes (its rate records would have to carry each key's latest destination).

`homes[i]` is the destination (index into the plan's destinations) of key i's latest request, as
the gateways report it in their events, or -1 when unknown. Re-admitted keys keep their previous
destinations (churn.py); only keys without any placed replica use their home, and only for their
first replica, and only while the home stays within the load bound the rest of the placement
respects. Keys are taken in placement order (rate descending), so heavy keys get their homes
first; whatever does not fit is placed by LPT as before.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from cacheroute.planner.errors import PlannerError
from cacheroute.planner.plan import FloatArray, IntArray

__all__ = ["home_indices", "keep_homes"]


def home_indices(homes: Sequence[int] | IntArray | None, n_keys: int, r: int) -> IntArray | None:
    """Validated homes (int64, one per key, -1 or a destination index); None stays None."""
    if homes is None:
        return None
    out = np.asarray(homes, dtype=np.int64)
    if out.shape != (n_keys,):
        raise PlannerError(f"homes: need one entry per key ({n_keys}), got shape {out.shape}")
    if out.size and (int(out.min()) < -1 or int(out.max()) >= r):
        raise PlannerError(f"homes: entries must be -1 (unknown) or a destination index < {r}")
    return out


def keep_homes(
    homes: IntArray,
    *,
    shares: FloatArray,
    offsets: IntArray,
    kept: IntArray,
    targets: IntArray,
    loads: FloatArray,
    bound: FloatArray,
) -> int:
    """Place the first replica of every key that has none yet on its home, if it fits.

    `homes` are per admitted key, in placement order (the same order as `shares`, `offsets`,
    `kept`); `loads` already hold every placed replica and grow with each one placed here;
    a home takes a key only while its load plus the key's share stays within `bound`.
    Returns the number of keys placed at home.
    """
    placed = 0
    for i in np.flatnonzero((homes >= 0) & (kept == 0)).tolist():
        h = int(homes[i])
        share = float(shares[i])
        if loads[h] + share <= bound[h]:
            targets[offsets[i]] = h
            kept[i] = 1
            loads[h] += share
            placed += 1
    return placed
