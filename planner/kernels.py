"""The loops of the fast planner, compiled with numba.

Why numba: LPT placement is inherently sequential (each key's choice depends on the loads every
earlier key left behind) and the fast plan must equal the reference plan *bit for bit*, ties
included. Vectorised numpy cannot express the loop, and a Python loop is what the reference already
is. numba compiles these plain functions to machine code with IEEE-754 semantics identical to
CPython's float operations (no fastmath, no reassociation), so the same additions in the same order
give the same bits, and it is a maintained, widely used package with wheels for every CPython and
numpy we support. The functions below are also valid Python: with `NUMBA_DISABLE_JIT=1` they run
as written, which keeps them debuggable.

numba is imported lazily (first plan built), so importing the planner, reading plans or running an
unrelated CLI command does not pay its start-up time or memory.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from cacheroute.planner.plan import BoolArray, FloatArray, IntArray

__all__ = ["Kernels", "compiled", "python_kernels"]

# Shewchuk partials needed for an exactly rounded sum of doubles: non-overlapping partials of a
# 2098-bit exponent range in 53-bit pieces fit in 40; 128 leaves a wide margin.
_PARTIALS = 128


# One flat function per loop on purpose: numba compiles it whole, with no calls between Python
# objects; splitting it up would need numba at import time (see the module docstring).
def _fsum_split(  # noqa: PLR0912, PLR0915 - see above
    values: FloatArray, admitted: BoolArray
) -> tuple[float, float, bool]:
    """Exactly rounded sums of all values and of the non-admitted ones (== math.fsum, both).

    A port of CPython's math.fsum (Shewchuk partials plus its half-even fix-up). An exactly rounded
    sum does not depend on summation order, so the fast planner (which meets cold keys in a
    different order than the reference) gets the very same cold-tail load. Each value goes into
    one exact accumulator (admitted or cold); the total is then the cold accumulator plus the
    admitted one's partials, still exact, so every value is touched once. Returns
    (total, cold, overflowed).
    """
    n_values = values.shape[0]
    parts = np.zeros((3, _PARTIALS), dtype=np.float64)  # 0: admitted, 1: cold, 2: total
    counts = np.zeros(3, dtype=np.int64)
    step = 0
    limit = n_values
    merging = False
    while True:
        if step == limit:
            if merging:
                break
            merging = True  # phase 2: total = cold partials + admitted partials
            counts[2] = counts[1]
            for j in range(counts[1]):
                parts[2, j] = parts[1, j]
            limit = n_values + counts[0]
            if step == limit:
                break
        if merging:
            x = parts[0, step - n_values]
            which = 2
        else:
            x = values[step]
            which = 0 if admitted[step] else 1
        step += 1
        n = counts[which]
        i = 0
        for j in range(n):
            y = parts[which, j]
            if abs(x) < abs(y):
                x, y = y, x
            hi = x + y
            lo = y - (hi - x)
            if lo != 0.0:
                parts[which, i] = lo
                i += 1
            x = hi
        n = i
        if x != 0.0:
            if not np.isfinite(x):
                return 0.0, 0.0, True
            parts[which, n] = x
            n += 1
        counts[which] = n
    out = np.zeros(3, dtype=np.float64)
    for which in range(1, 3):
        n = counts[which]
        hi = 0.0
        lo = 0.0
        if n > 0:
            n -= 1
            hi = parts[which, n]
            while n > 0:
                x = hi
                n -= 1
                y = parts[which, n]
                hi = x + y
                yr = hi - x
                lo = y - yr
                if lo != 0.0:
                    break
            if n > 0 and (
                (lo < 0.0 and parts[which, n - 1] < 0.0) or (lo > 0.0 and parts[which, n - 1] > 0.0)
            ):
                y = lo * 2.0
                x = hi + y
                yr = x - hi
                if y == yr:
                    hi = x
        out[which] = hi
    return out[2], out[1], False


def _admit(k: IntArray, capacity: int) -> tuple[IntArray, int]:
    """Walk keys in admission order; admit b if used + k_b <= capacity, else skip it and go on.

    Returns the admitted positions (into `k`) and the slots used. Stops early once the budget is
    full, because no key (k_b >= 1) can fit any more.
    """
    n = k.shape[0]
    out = np.empty(n, dtype=np.int64)
    m = 0
    used = 0
    j = 0
    while j < n and used < capacity:
        kj = k[j]
        if used + kj <= capacity:
            out[m] = j
            m += 1
            used += kj
        j += 1
    return out[:m], used


def _lpt(  # noqa: PLR0912, PLR0915, PLR0917 - one compiled loop, arrays passed positionally
    shares: FloatArray,
    offsets: IntArray,
    kept: IntArray,
    targets: IntArray,
    loads: FloatArray,
    capacities: FloatArray,
) -> None:
    """LPT placement: each key in order takes the least-loaded destinations it still needs.

    Key i needs `offsets[i+1] - offsets[i] - kept[i]` more destinations; the first `kept[i]`
    entries of its slice in `targets` are destinations it already has (the re-planner keeps them),
    which are excluded. Picks are written after them, in selection order, and `shares[i]` is added
    to each pick's load in place. Order of destinations: load (divided by capacity when
    `capacities` is non-empty), then lower index - a total order, so a binary heap pops exactly what
    the reference's heapq pops.
    """
    r = loads.shape[0]
    hetero = capacities.shape[0] > 0
    hu = np.empty(r, dtype=np.float64)
    hd = np.empty(r, dtype=np.int64)
    size = 0
    for d in range(r):  # push every destination
        u = loads[d] / capacities[d] if hetero else loads[d]
        pos = size
        size += 1
        while pos > 0:
            parent = (pos - 1) >> 1
            if u < hu[parent] or (u == hu[parent] and d < hd[parent]):
                hu[pos] = hu[parent]
                hd[pos] = hd[parent]
                pos = parent
            else:
                break
        hu[pos] = u
        hd[pos] = d
    stash_u = np.empty(r, dtype=np.float64)
    stash_d = np.empty(r, dtype=np.int64)
    for i in range(shares.shape[0]):
        start = offsets[i]
        have = kept[i]
        need = offsets[i + 1] - start - have
        if need <= 0:
            continue
        share = shares[i]
        if need == 1 and have == 0:  # the common case: replace the top and sift it down
            d = hd[0]
            targets[start] = d
            loads[d] += share
            u = loads[d] / capacities[d] if hetero else loads[d]
            pos = 0
            while True:
                child = 2 * pos + 1
                if child >= size:
                    break
                right = child + 1
                if right < size and (
                    hu[right] < hu[child] or (hu[right] == hu[child] and hd[right] < hd[child])
                ):
                    child = right
                if hu[child] < u or (hu[child] == u and hd[child] < d):
                    hu[pos] = hu[child]
                    hd[pos] = hd[child]
                    pos = child
                else:
                    break
            hu[pos] = u
            hd[pos] = d
            continue
        got = 0
        stashed = 0
        while got < need:  # pop the smallest, skipping destinations the key already has
            u = hu[0]
            d = hd[0]
            size -= 1
            lu = hu[size]
            ld = hd[size]
            pos = 0
            while True:
                child = 2 * pos + 1
                if child >= size:
                    break
                right = child + 1
                if right < size and (
                    hu[right] < hu[child] or (hu[right] == hu[child] and hd[right] < hd[child])
                ):
                    child = right
                if hu[child] < lu or (hu[child] == lu and hd[child] < ld):
                    hu[pos] = hu[child]
                    hd[pos] = hd[child]
                    pos = child
                else:
                    break
            if size > 0:
                hu[pos] = lu
                hd[pos] = ld
            excluded = False
            for j in range(start, start + have):
                if targets[j] == d:
                    excluded = True
                    break
            if not excluded:
                targets[start + have + got] = d
                got += 1
                loads[d] += share
                u = loads[d] / capacities[d] if hetero else loads[d]
            stash_u[stashed] = u
            stash_d[stashed] = d
            stashed += 1
        for s in range(stashed):  # push everything back with its current load
            u = stash_u[s]
            d = stash_d[s]
            pos = size
            size += 1
            while pos > 0:
                parent = (pos - 1) >> 1
                if u < hu[parent] or (u == hu[parent] and d < hd[parent]):
                    hu[pos] = hu[parent]
                    hd[pos] = hd[parent]
                    pos = parent
                else:
                    break
            hu[pos] = u
            hd[pos] = d


def _place_grouped(  # noqa: PLR0917 - one compiled loop, arrays positional
    shares: FloatArray,
    offsets: IntArray,
    kept: IntArray,
    targets: IntArray,
    loads: FloatArray,
    capacities: FloatArray,
    groups: IntArray,
    hosts: BoolArray,
    bound: FloatArray,
) -> None:
    """LPT with sibling co-location (`PlannerParams.group_separator`).

    Same contract as `_lpt`, plus: key i belongs to sibling group `groups[i]` (-1: none), and
    `hosts[g, d]` says whether a key of group g already sits on destination d. Each replica a key
    needs goes to the least-loaded destination of its group that it does not have yet and that
    stays within `bound[d]` after taking the share; if there is none, to the least-loaded
    destination it does not have (exactly LPT's pick). A linear scan over R instead of `_lpt`'s
    heap, because the group's subset changes per key; equal loads go to the lower index, as in
    `_lpt`, so with every group -1 the result equals `_lpt` bit for bit.
    """
    r = loads.shape[0]
    hetero = capacities.shape[0] > 0
    for i in range(shares.shape[0]):
        start = offsets[i]
        have = kept[i]
        need = offsets[i + 1] - start - have
        share = shares[i]
        g = groups[i]
        for got in range(max(need, 0)):
            end = start + have + got
            best = -1
            best_u = 0.0
            for sibling_pass in range(2):
                if sibling_pass == 0 and g < 0:
                    continue
                for d in range(r):
                    if sibling_pass == 0 and (not hosts[g, d] or loads[d] + share > bound[d]):
                        continue
                    taken = False
                    for j in range(start, end):
                        if targets[j] == d:
                            taken = True
                            break
                    if taken:
                        continue
                    u = loads[d] / capacities[d] if hetero else loads[d]
                    if best < 0 or u < best_u:
                        best = d
                        best_u = u
                if best >= 0:
                    break
            targets[end] = best
            loads[best] += share
            if g >= 0:
                hosts[g, best] = True


@dataclass(frozen=True, slots=True)
class Kernels:
    """The planner's compiled loops (or their plain-Python versions, for tests and debugging)."""

    fsum_split: Callable[[FloatArray, BoolArray], tuple[float, float, bool]]
    admit: Callable[[IntArray, int], tuple[IntArray, int]]
    lpt: Callable[[FloatArray, IntArray, IntArray, IntArray, FloatArray, FloatArray], None]
    place_grouped: Callable[..., None]


def python_kernels() -> Kernels:
    """The same loops, uncompiled: slow, but they show numba changes nothing."""
    return Kernels(fsum_split=_fsum_split, admit=_admit, lpt=_lpt, place_grouped=_place_grouped)


@functools.cache
def compiled() -> Kernels:
    """Compile (or load from numba's on-disk cache) the loops once per process."""
    import numba  # noqa: PLC0415 - deliberately lazy, see the module docstring

    def jit(fn: Callable[..., Any]) -> Any:
        return numba.njit(cache=True, nogil=True)(fn)

    return Kernels(
        fsum_split=jit(_fsum_split),
        admit=jit(_admit),
        lpt=jit(_lpt),
        place_grouped=jit(_place_grouped),
    )
