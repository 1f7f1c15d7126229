"""`build_plan`: Algorithm 1, fast (the entry point the planner service calls).

What makes it fast, against the reference's plain Python + heapq:
  * validation, sizing and sums are vectorised numpy passes;
  * admission sorts only the top of the priority order (see admission.py), with numpy's SIMD sort;
  * the two inherently sequential loops (admission walk, LPT placement over a binary heap) and the
    exactly rounded cold-tail sum run as numba-compiled code (see kernels.py);
  * the plan is a handful of flat arrays, not one Python object per key.
It produces the reference's plan bit for bit: same order, same ties, same float operations.

With `prev`, the churn-aware re-planner (churn.py) runs instead of a rebuild from scratch.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from cacheroute.planner.admission import (
    admission_priority,
    admit,
    count_capped,
    order_desc,
    pick,
    replica_counts,
    warn_capped,
)
from cacheroute.planner.churn import replan
from cacheroute.planner.homes import home_indices, keep_homes
from cacheroute.planner.inputs import PlanInputs, prepare_inputs
from cacheroute.planner.kernels import Kernels, compiled
from cacheroute.planner.loads import cold_tail, exact_sums, load_bound, sizing_cap
from cacheroute.planner.params import PlannerParams
from cacheroute.planner.plan import Destination, FloatArray, IntArray, Plan, PlanStats
from cacheroute.planner.siblings import place

__all__ = ["build_plan"]


def build_plan(
    keys: Sequence[str],
    rates: Sequence[float] | FloatArray,
    destinations: Sequence[str | Destination],
    params: PlannerParams,
    *,
    prev: Plan | None = None,
    prefix_tokens: Sequence[float] | FloatArray | None = None,
    homes: Sequence[int] | IntArray | None = None,
    version: int | None = None,
    created_ms: int = 0,
    kernels: Kernels | None = None,
) -> Plan:
    """Turn per-key rates into a routing plan.

    keys/rates: one rate (requests/s, finite, >= 0) per distinct key. destinations: names or
    `Destination(name, capacity)`; unequal capacities make it capacity-aware, equal ones give the
    paper's Algorithm 1 exactly. prefix_tokens: reusable prefix tokens per key (needed for
    `admission="bytes"`). prev: the live plan; when given, re-plan with few moves (churn.py).
    homes: per key, the index in `destinations` where its traffic goes now (-1: unknown); a key
    the plan newly admits is placed there while the load bound allows (homes.py).
    version defaults to prev.version + 1 (or 1); created_ms is passed in because the planner never
    reads the clock. kernels: the compiled loops (tests pass the plain-Python ones).
    Raises PlannerError naming the key for bad input.
    """
    inp = prepare_inputs(keys, rates, destinations, params, prefix_tokens)
    home = home_indices(homes, len(inp.keys), len(inp.destinations))
    if version is None:
        version = prev.version + 1 if prev is not None else 1
    kern = kernels if kernels is not None else compiled()
    if prev is not None:
        return replan(
            inp, params, prev, version=version, created_ms=created_ms, kernels=kern, homes=home
        )
    return _fresh(inp, params, version, created_ms, kern, homes=home)


def _fresh(
    inp: PlanInputs,
    params: PlannerParams,
    version: int,
    created_ms: int,
    kern: Kernels,
    *,
    homes: IntArray | None = None,
) -> Plan:
    rates = inp.rates
    r = len(inp.destinations)
    q = sizing_cap(rates, params, r, kern)
    capped = count_capped(rates, q, r)
    warn_capped(capped, r)
    priority = admission_priority(rates, inp.tokens, params, r, q)
    admitted, _ = admit(
        priority,
        rates,
        inp.keys,
        q_cap=q,
        r=r,
        capacity=params.capacity_slots(r),
        kernels=kern,
    )
    placed = admitted if params.admission == "rate" else order_desc(admitted, rates, inp.keys)
    mask = np.zeros(rates.shape[0], dtype=np.bool_)
    mask[placed] = True
    total, cold = exact_sums(rates, mask, kern)
    loads = cold_tail(cold, inp)
    adm_rates = rates[placed]
    k = replica_counts(adm_rates, q, r)
    offsets = np.zeros(placed.size + 1, dtype=np.int64)
    np.cumsum(k, out=offsets[1:])
    targets = np.empty(int(offsets[-1]), dtype=np.int64)
    kept = np.zeros(placed.size, dtype=np.int64)
    caps = np.zeros(0, dtype=np.float64) if inp.capacities is None else inp.capacities
    keys = pick(inp.keys, placed)
    bound = load_bound(params, total, np.ones(r) if inp.capacities is None else caps)
    shares = adm_rates / k
    if homes is not None:
        keep_homes(
            homes[placed],
            shares=shares,
            offsets=offsets,
            kept=kept,
            targets=targets,
            loads=loads,
            bound=bound,
        )
    place(
        kern,
        keys,
        params.group_separator,
        shares=shares,
        offsets=offsets,
        kept=kept,
        targets=targets,
        loads=loads,
        capacities=caps,
        bound=bound,
    )
    cutoff = float(priority[admitted[-1]]) if admitted.size else 0.0
    return Plan(
        version=version,
        created_ms=created_ms,
        params=params,
        destinations=inp.destinations,
        keys=keys,
        rates=adm_rates,
        offsets=offsets,
        targets=targets,
        loads=loads,
        total_rate=total,
        cold_rate=cold,
        stats=PlanStats(keys=rates.shape[0], capped_keys=capped, cutoff=cutoff),
    )
