"""Algorithm 1 written for clarity: plain Python and heapq. The test oracle, not the production path.

Every line here is meant to be checked against the paper by eye. The fast planner (build.py) must
return the very same plan - same keys in the same order, same destinations, same loads bit for bit -
on any input; the property tests and `cacheroute bench planner` compare them.

Tie-breaks (the paper leaves them open; both implementations fix them the same way):
  1. keys are walked by rate descending (`bytes` mode: rate x prefix tokens / k_b), equal values
     by key ascending;
  2. k_b = max(1, ceil(rate_b / q_cap)), capped at R (counted, and logged once per plan);
  3. b is admitted if used + k_b <= C = R * W, otherwise skipped, and the walk goes on;
  4. every destination starts at the cold-tail load: the exactly rounded (math.fsum) sum of the
     non-admitted rates / R (by capacity share when capacities differ);
  5. LPT, in rate-descending order (equal rates by key): take the k_b distinct destinations with
     the smallest load (load / capacity when capacities differ), equal loads lower index first,
     in that order, and add rate_b / k_b to each.
Our two extensions, when their parameters are set, are written out here too: `fair_share` sizes
k_b against min(q_cap, fair_share x total / R); `group_separator` prefers, in step 5, the
destinations a key's siblings already use (`_place_siblings`).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence

import numpy as np

from cacheroute.planner.admission import warn_capped
from cacheroute.planner.errors import PlannerError
from cacheroute.planner.inputs import (
    bad_key_error,
    bad_rate_error,
    bad_tokens_error,
    duplicate_key_error,
    normalize_destinations,
)
from cacheroute.planner.params import PlannerParams
from cacheroute.planner.plan import Destination, Plan, PlanStats

__all__ = ["reference_build_plan"]


def reference_build_plan(
    keys: Sequence[str],
    rates: Sequence[float],
    destinations: Sequence[str | Destination],
    params: PlannerParams,
    *,
    prefix_tokens: Sequence[float] | None = None,
    version: int = 1,
    created_ms: int = 0,
) -> Plan:
    """Algorithm 1 from scratch (no re-planning); same contract as `build_plan` without `prev`."""
    dests = normalize_destinations(destinations)
    r = len(dests)
    keys, rates, tokens = _checked(keys, rates, prefix_tokens, params)
    n = len(keys)

    # The sizing cap: q_cap, or less with fair-share sizing (our extension; None: the paper).
    cap = params.sizing_cap(math.fsum(rates), r)

    def replicas(rate: float) -> int:
        return min(max(1, math.ceil(rate / cap)), r)

    capped = sum(1 for rate in rates if math.ceil(rate / cap) > r)
    warn_capped(capped, r)

    # Admission: walk by priority, admit what fits, skip what does not.
    if params.admission == "rate" or tokens is None:
        priority = rates
    else:
        priority = [rates[i] * tokens[i] / replicas(rates[i]) for i in range(n)]
    walk = sorted(range(n), key=lambda i: (-priority[i], keys[i]))
    budget = params.capacity_slots(r)
    used = 0
    admitted: list[int] = []
    for i in walk:
        k = replicas(rates[i])
        if used + k <= budget:
            admitted.append(i)
            used += k
    cutoff = priority[admitted[-1]] if admitted else 0.0
    placed = sorted(admitted, key=lambda i: (-rates[i], keys[i]))

    # Cold tail: what is not admitted is spread over every destination.
    is_admitted = set(admitted)
    total = math.fsum(rates)
    cold = math.fsum(rates[i] for i in range(n) if i not in is_admitted)
    caps = [d.capacity for d in dests]
    homogeneous = all(c == caps[0] for c in caps)
    if homogeneous:
        loads = [cold / r] * r
    else:
        cap_total = math.fsum(caps)
        loads = [cold * c / cap_total for c in caps]

    def level(d: int) -> float:
        return loads[d] if homogeneous else loads[d] / caps[d]

    if params.group_separator is None:
        # LPT: each key takes the k_b least-loaded distinct destinations.
        heap = [(level(d), d) for d in range(r)]
        heapq.heapify(heap)
        chosen_per_key: list[list[int]] = []
        for i in placed:
            k = replicas(rates[i])
            share = rates[i] / k
            chosen = [heapq.heappop(heap)[1] for _ in range(k)]
            for d in chosen:
                loads[d] += share
                heapq.heappush(heap, (level(d), d))
            chosen_per_key.append(chosen)
    else:
        chosen_per_key = _place_siblings(
            [keys[i] for i in placed],
            [rates[i] / replicas(rates[i]) for i in placed],
            [replicas(rates[i]) for i in placed],
            loads,
            level,
            params,
            total,
            caps if not homogeneous else [1.0] * r,
        )

    offsets = [0]
    for chosen in chosen_per_key:
        offsets.append(offsets[-1] + len(chosen))
    return Plan(
        version=version,
        created_ms=created_ms,
        params=params,
        destinations=dests,
        keys=tuple(keys[i] for i in placed),
        rates=np.array([rates[i] for i in placed], dtype=np.float64),
        offsets=np.array(offsets, dtype=np.int64),
        targets=np.array([d for chosen in chosen_per_key for d in chosen], dtype=np.int64),
        loads=np.array(loads, dtype=np.float64),
        total_rate=total,
        cold_rate=cold,
        stats=PlanStats(keys=n, capped_keys=capped, cutoff=cutoff),
    )


def _place_siblings(  # noqa: PLR0917 - the state of the LPT loop above, spelled out
    keys: list[str],
    shares: list[float],
    ks: list[int],
    loads: list[float],
    level: Callable[[int], float],
    params: PlannerParams,
    total: float,
    caps: list[float],
) -> list[list[int]]:
    """Sibling co-location (our extension), written plainly: the oracle of siblings.py.

    Siblings are admitted keys with the same text before the last separator; only groups of two
    or more count. Each replica goes to the least-loaded destination (level, then index) that a
    sibling already uses, that the key does not have yet and that stays within the bound
    tolerance x mean x capacity (a hair lower, as the fast planner); failing that, to the
    least-loaded destination the key does not have yet (plain LPT).
    """
    sep = params.group_separator
    assert sep is not None  # the caller checked
    heads = [k.rpartition(sep)[0] for k in keys]
    size: dict[str, int] = {}
    for h in heads:
        size[h] = size.get(h, 0) + 1
    mean = total / float(np.asarray(caps).sum())  # numpy's sum, as the fast planner's bound
    bound = [params.imbalance_tolerance * (1.0 - 1e-9) * mean * c for c in caps]
    hosts: dict[str, set[int]] = {}
    out: list[list[int]] = []
    for key_head, share, k in zip(heads, shares, ks, strict=True):
        grouped = bool(key_head) and size[key_head] >= 2
        chosen: list[int] = []
        for _ in range(k):
            free = [d for d in range(len(loads)) if d not in chosen]
            near = [
                d
                for d in free
                if grouped and d in hosts.get(key_head, ()) and loads[d] + share <= bound[d]
            ]
            d = min(near or free, key=lambda x: (level(x), x))
            chosen.append(d)
            loads[d] += share
            if grouped:
                hosts.setdefault(key_head, set()).add(d)
        out.append(chosen)
    return out


def _checked(
    keys: Sequence[str],
    rates: Sequence[float],
    prefix_tokens: Sequence[float] | None,
    params: PlannerParams,
) -> tuple[list[str], list[float], list[float] | None]:
    """The inputs as lists, after one plain pass that rejects anything the planner cannot use."""
    keys = list(keys)
    try:
        rates = [float(x) for x in rates]
    except (TypeError, ValueError) as exc:
        raise PlannerError(f"rates must be numbers: {exc}") from None
    n = len(keys)
    if n == 0:
        raise PlannerError("no keys to plan: give at least one key with its rate")
    if len(rates) != n:
        raise PlannerError(f"rates has {len(rates)} values, expected one per key ({n})")
    tokens = [float(x) for x in prefix_tokens] if prefix_tokens is not None else None
    if tokens is not None and len(tokens) != n:
        raise PlannerError(f"prefix_tokens has {len(tokens)} values, expected {n}")
    if tokens is None and params.admission == "bytes":
        raise PlannerError("admission 'bytes' needs prefix_tokens for every key")
    seen: dict[str, int] = {}
    for i, (key, rate) in enumerate(zip(keys, rates, strict=True)):
        if type(key) is not str or not key:
            raise bad_key_error(i, key)
        if not math.isfinite(rate) or rate < 0:
            raise bad_rate_error(key, rate)
        if key in seen:
            raise duplicate_key_error(key, seen[key], i)
        seen[key] = i
        if tokens is not None and not (math.isfinite(tokens[i]) and tokens[i] >= 0):
            raise bad_tokens_error(key, tokens[i])
    return keys, rates, tokens
