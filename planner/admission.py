"""Sizing (k_b), admission order and the admission walk of the fast planner.

Deterministic tie-breaks, shared by every admission mode:
  * keys are walked by priority descending (the rate, or rate x prefix tokens / k_b in `bytes` mode),
    equal priorities by key ascending (Python string order);
  * `k_b = max(1, ceil(rate_b / q_cap))`, capped at the number of destinations R (with
    `fair_share` set, q_cap is the sizing cap `PlannerParams.sizing_cap` gives);
  * b is admitted if `used + k_b <= C`, otherwise skipped, and the walk goes on.

Speed: the walk only ever needs the keys near the top. At most C keys can be admitted (k_b >= 1),
so the planner partitions out the top `C + C/4 + margin` priorities in O(n), sorts just those, and
walks them; only if the budget is still not full does it sort and walk the rest. At 1M keys this
keeps the build close to linear instead of paying a full sort.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from operator import itemgetter

import numpy as np

from cacheroute.planner.kernels import Kernels
from cacheroute.planner.params import PlannerParams
from cacheroute.planner.plan import FloatArray, IntArray

__all__ = [
    "admission_priority",
    "admit",
    "count_capped",
    "order_desc",
    "pick",
    "replica_counts",
    "warn_capped",
]

_logger = logging.getLogger(__name__)

_CANDIDATE_MARGIN = 1024


def replica_counts(rates: FloatArray, q_cap: float, r: int) -> IntArray:
    """k_b = max(1, ceil(rate_b / q_cap)), capped at the number of destinations r."""
    kf = np.ceil(rates / q_cap)
    np.clip(kf, 1, r, out=kf)
    return kf.astype(np.int64)


def count_capped(rates: FloatArray, q_cap: float, r: int) -> int:
    """How many keys would need more than r replicas (ceil(x) > r exactly when x > r)."""
    return int(np.count_nonzero(rates / q_cap > r))


def warn_capped(capped: int, r: int) -> None:
    """One warning per plan, not one per key: a storm of whales must not flood the log."""
    if capped:
        _logger.warning(
            "%d key(s) need more replicas than the %d destination(s); their k_b is capped at %d "
            "and their destinations will run above q_cap",
            capped,
            r,
            r,
        )


def admission_priority(
    rates: FloatArray, tokens: FloatArray | None, params: PlannerParams, r: int, q_cap: float
) -> FloatArray:
    """What the admission walk sorts by: the rate, or (`bytes`) rate x prefix tokens per slot.

    `bytes` values a key by the prefix tokens per second its warm slots save, divided by the slots
    it takes (k_b): the density of a knapsack item, for workloads whose prefix sizes differ.
    """
    if params.admission == "rate" or tokens is None:
        return rates
    k = replica_counts(rates, q_cap, r)
    return rates * tokens / k


def order_desc(idx: IntArray, priority: FloatArray, keys: Sequence[str]) -> IntArray:
    """`idx` sorted by priority descending, equal priorities by key ascending.

    numpy's default (SIMD) argsort is several times faster than a stable sort and leaves ties in
    arbitrary order; runs of equal priority are then put in key order, which makes the result
    exact and deterministic. Continuous rates have almost no ties, so this costs nearly nothing.
    """
    if idx.size == 0:
        return idx
    p = priority[idx]
    o = np.argsort(-p)
    out = idx[o]
    ps = p[o]
    tie = np.flatnonzero(ps[1:] == ps[:-1])
    if tie.size:
        breaks = np.flatnonzero(np.diff(tie) != 1)
        starts = tie[np.r_[0, breaks + 1]]
        ends = tie[np.r_[breaks, tie.size - 1]] + 2
        for s, e in zip(starts.tolist(), ends.tolist(), strict=True):
            run = out[s:e].tolist()
            run.sort(key=keys.__getitem__)
            out[s:e] = run
    return out


def admit(
    priority: FloatArray,
    rates: FloatArray,
    keys: Sequence[str],
    *,
    q_cap: float,
    r: int,
    capacity: int,
    kernels: Kernels,
    candidate_margin: int = _CANDIDATE_MARGIN,
) -> tuple[IntArray, int]:
    """Key indices admitted, in admission order, and the slots they use (<= capacity)."""
    n = priority.shape[0]
    empty = np.zeros(0, dtype=np.int64)
    if capacity <= 0:
        return empty, 0
    m = capacity + capacity // 4 + candidate_margin
    if m < n:
        threshold = np.partition(priority, n - m)[n - m]
        top = priority >= threshold
        cand = np.flatnonzero(top)
        rest = np.flatnonzero(~top)
    else:
        cand = np.arange(n, dtype=np.int64)
        rest = empty
    order = order_desc(cand, priority, keys)
    pos, used = kernels.admit(replica_counts(rates[order], q_cap, r), capacity)
    admitted = order[pos]
    if used < capacity and rest.size:
        # The budget is not full after every candidate: every remaining key ranks below all of
        # them, so continuing the walk over the rest gives exactly the full walk's answer.
        order = order_desc(rest, priority, keys)
        pos, more = kernels.admit(replica_counts(rates[order], q_cap, r), capacity - used)
        admitted = np.concatenate([admitted, order[pos]])
        used += more
    return admitted, int(used)


def pick(keys: Sequence[str], idx: IntArray) -> tuple[str, ...]:
    """keys[idx] as a tuple, at C speed (itemgetter returns a bare item for a single index)."""
    if idx.size == 0:
        return ()
    if idx.size == 1:
        return (keys[int(idx[0])],)
    got: tuple[str, ...] = itemgetter(*idx.tolist())(keys)
    return got
