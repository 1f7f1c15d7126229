"""Will planned affinity pay off? A win/tie/lose estimate from the workload alone, no simulation.

The paper loses where little reuse is recoverable; this estimates how much is, from what logs
hold: keys, arrival times and prompt blocks (prefix sizes). A block of a prompt is a cache hit if
it is still on the replica the request lands on. An LRU cache keeps a block for about the eviction
horizon H = cache tokens / (uncached prompt tokens arriving per replica per second), so:

  * spreading (Flat-LB): a request lands on any of R replicas; a block seen n times in the last
    H_s seconds (by any key) is on this replica with probability 1 - (1 - 1/R)^n;
  * affinity (one home per key): a block the same key sent within H_a is there for sure; blocks
    only other keys sent are there with probability 1 - (1 - 1/R)^n_other (their homes are hashed).

Hit probabilities are made non-increasing along a prompt (a prefix hit needs every earlier block)
and summed to expected cached tokens; each horizon is the fixed point of its own hit rate (fewer
hits, more inflow, shorter horizon). The hit rates turn into work with the service model: prefill
of the uncached tokens (with the attention term) plus decoding at a typical batch, and the
**predicted capacity gain** = work per request under spreading / under affinity.

Verdict: `win` if the gain is at least `win_gain` (default 1.10); `lose` if it is below
`tie_gain` (1.03) while most traffic would be pinned to planned homes (it pays the cost of pinning,
burstier per-replica load, for nothing); else `tie`.

**The deployed policy** (given `q_cap`; without it every key gets one home, the model above). What
`cacheroute` does differently from "one home per key", and how the estimate follows it:

  * admission - the planner's own rule (`planner.admission`): keys by rate, k_b = ceil(rate /
    sizing cap) replicas (cap = min(q_cap, fair_share x mean replica load)), admitted while the
    C = R x W warm slots last. A key on k_b replicas reaches any one of them (least-loaded, random
    ties), so a block it sent n times within the horizon is there with 1 - (1 - 1/k_b)^n;
  * plan lag - plans are rebuilt `intervals` times per replay (`evaluate` passes the replay's
    count at the planner service's cadence, `EvalConfig.intervals_for`), modelled here from the
    rates seen so far (not the service's 60 s EWMA: admission is by the whole replay's): before
    the first plan every key is cold, and a key is cold until the first plan after its first
    request; its first request after that goes to the planned replicas, away from its cold home
    (its own blocks there with 1/R, as spreading would have them);
  * balance - the plan packs the admitted keys' k_b x (rate / k_b) items onto R replicas by
    LPT; coarse keys (say, a trace keyed by its few system prompts) cannot be packed evenly, and
    the busiest replica bounds capacity: the gain is divided by the packing's max/mean load;
  * the cold path - every other key goes by bounded-load consistent hashing: it has a home too,
    but a gateway moves it when the home holds at least ceil(c x (in flight + 1) / R) load units
    *of that gateway*. The share of cold requests displaced is the probability that a request
    finds its home at the bound: each home's in-flight units are compound Poisson (Little's law:
    rate x unqueued latency, in work units), the homes' cold load as hashed (skewed by the keys'
    rates), each gateway seeing 1/G of it against a bound that is rounded up. A displaced request
    finds the key's own blocks only as a spread request would;
  * gateways - in the cold path's bound above. Flat-LB's power-of-two-choices balances on its
    own gateway's counts only, so with G gateways its choices drift towards random ones; the
    gain is multiplied by `1 + SPREAD_PENALTY x (1 - 1/G)` for that, with SPREAD_PENALTY
    calibrated on the evaluation runs at G = 1, 4 and 16: Flat-LB's capacity fell by at most
    9% there, and CacheRoute's as much or more, so it is 0 - it could only ever make a `win`
    more likely, which the rule below forbids guessing at.

Conservatism: the estimate has no queueing in it, so it is least sure where load rides on hashed
homes (cold keys, and every key before the first plan): the load bound keeps each home under
c = 1.25x the mean, but that is 25% of slack the capacity may lose - and each gateway bounds only
its own 1/G of a home's load, so with many gateways the bound protects less (the runs: CacheRoute's
capacity fell from G = 1 to 16 on the Mooncake trace by 17%, Flat-LB's by 9%). A `win` needs the
gain to clear `win_gain` x (1 + UNCERTAINTY x that share of requests x (2 - 1/G)); a gain between
is a `tie`. The rule the calibration held it to: never `win` where the simulation says `lose`
(capacity <= 0.9x), and `tie` rather than `win` where the two are close.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import asdict, dataclass, replace
from typing import Any, Literal

import numpy as np

from cacheroute.planner.admission import admit, replica_counts
from cacheroute.planner.kernels import python_kernels
from cacheroute.planner.params import DEFAULT_FAIR_SHARE
from cacheroute.replay.jit import njit
from cacheroute.replay.planned import rendezvous_order
from cacheroute.replay.policy import WARM_SLOTS, key_hashes
from cacheroute.replay.requestset import FloatArray, IntArray, RequestSet
from cacheroute.replay.service import ServiceModel

__all__ = [
    "Diagnosis",
    "Verdict",
    "admitted_replicas",
    "cold_displacement",
    "diagnose",
    "planned_imbalance",
    "uncached_work",
]

Verdict = Literal["win", "tie", "lose"]
BoolArray = np.ndarray[Any, np.dtype[np.bool_]]
_FIXED_POINT_ROUNDS = 6
UNCERTAINTY = 0.25
"""How much a win's required gain rises with the share of requests on hashed (cold) homes: the
Mooncake trace (28% of requests there, predicted 1.13x, simulated 1.10-1.15x across runs) sits
on the win/tie line, and a 25% cold share must not turn a 10% gain into a win."""
SPREAD_PENALTY = 0.0
"""Flat-LB's capacity loss at G -> infinity gateways (its P2C then picks at random), as a share:
the gain is multiplied by 1 + this x (1 - 1/G). Calibrated on the evaluation runs (module doc)."""


@dataclass(frozen=True, slots=True)
class Diagnosis:
    """The estimate and every number behind it."""

    verdict: Verdict
    destinations: int
    horizon_affinity_s: float
    horizon_spread_s: float
    hit_affinity: float
    """Expected token-weighted hit rate with one home per key."""
    hit_spread: float
    """Expected token-weighted hit rate when requests spread over all replicas."""
    recoverable: float
    """hit_affinity - hit_spread: prompt share that affinity recovers."""
    work_spread_s: float
    work_affinity_s: float
    predicted_gain: float
    """Work per request under spreading / under affinity (a capacity ratio estimate)."""
    pinned_share: float
    """Share of requests whose key recurs (what a plan would pin)."""
    win_gain: float
    tie_gain: float
    reason: str
    work_gain: float = 1.0
    """work_spread_s / work_affinity_s alone, before the gateways' effect on Flat-LB."""
    gateways: int = 1
    admitted_keys: int = 0
    """Keys the planner's admission rule takes at the workload's rates (0: not modelled)."""
    admitted_share: float = 1.0
    """Share of requests from admitted keys (1 when admission is not modelled)."""
    cold_displaced: float = 0.0
    """Share of cold-path requests the load bound moves off their home (module docstring)."""
    hashed_share: float = 0.0
    """Share of requests on the cold path's hashed homes (cold keys, and all before a plan)."""
    plan_imbalance: float = 1.0
    """max/mean load of the plan's LPT placement (`planned_imbalance`; the gain is divided by it)."""
    required_gain: float = 1.10
    """The gain a `win` needs here: win_gain, raised by the uncertainty of hashed homes."""

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (JSON-ready)."""
        return asdict(self)


@njit
def _window_counts(group: IntArray, times: FloatArray, horizon: float) -> IntArray:
    """For each element of sorted runs (equal `group`), how many earlier ones lie within horizon."""
    n = group.shape[0]
    out = np.zeros(n, dtype=np.int64)
    lo = 0
    for i in range(n):
        if i == 0 or group[i] != group[i - 1]:
            lo = i
        while times[lo] < times[i] - horizon:
            lo += 1
        out[i] = i - lo
    return out


@njit
def _prefix_sum(offsets: IntArray, prob: FloatArray) -> FloatArray:
    """Per request, the sum of its block probabilities made non-increasing along the prompt."""
    n = offsets.shape[0] - 1
    out = np.zeros(n, dtype=np.float64)
    for i in range(n):
        run = 1.0
        total = 0.0
        for j in range(offsets[i], offsets[i + 1]):
            run = min(run, prob[j])
            total += run
        out[i] = total
    return out


@dataclass(frozen=True, slots=True)
class _Occurrences:
    """Every (request, block) pair, with the orders the window counts need."""

    by_block: IntArray  # permutation: sorted by (block, time, request)
    by_key_block: IntArray  # permutation: sorted by (key, block, time, request)
    block: IntArray
    key_block: IntArray  # dense id of (key, block)
    time: FloatArray


def _occurrences(q: RequestSet) -> _Occurrences:
    sizes = np.diff(q.block_offsets)
    req = np.repeat(np.arange(q.n, dtype=np.int64), sizes)
    block = q.block_ids
    key = q.key_index[req]
    time = q.times[req]
    by_block = np.lexsort((req, block))  # requests are in time order already
    pair = key * max(1, q.n_blocks) + block
    _, key_block = np.unique(pair, return_inverse=True)
    by_key_block = np.lexsort((req, key_block))
    return _Occurrences(by_block, by_key_block, block, key_block.astype(np.int64), time)


def _plan_moves(q: RequestSet, replicas: IntArray, intervals: int) -> BoolArray:
    """Requests that find their admitted key moved off its cold home by a new plan.

    Plans are rebuilt every duration / `intervals` from the rates seen so far: a key is cold
    (on its hashed home) until the first plan after its first request, and its first request
    after that plan goes to the planned replicas - where none of its blocks are (1 - 1/R).
    """
    out = np.zeros(q.n, dtype=np.bool_)
    if q.n == 0 or intervals < 1:
        return out
    step = max(q.duration, 1e-9) / intervals
    t = q.times - q.times[0]
    first = np.full(len(q.keys), np.inf)
    np.minimum.at(first, q.key_index, t)
    boundary = (np.floor(first / step) + 1.0) * step
    after = (replicas[q.key_index] > 0) & (t >= boundary[q.key_index])
    idx = np.flatnonzero(after)
    _, pos = np.unique(q.key_index[idx], return_index=True)
    out[idx[pos]] = True
    return out


def _before_first_plan(q: RequestSet, intervals: int) -> BoolArray:
    """Requests of the first control interval: no plan yet, every key on the cold path."""
    if q.n == 0 or intervals < 1:
        return np.zeros(q.n, dtype=np.bool_)
    out: BoolArray = (q.times - q.times[0]) < max(q.duration, 1e-9) / intervals
    return out


@dataclass(frozen=True, slots=True)
class _Placement:
    """Where the deployed policy sends each key and request, as far as the model needs it."""

    replicas: IntArray
    """Per key: k_b if admitted, 0 if cold (every key 1 in the plain model)."""
    cold: IntArray
    """Per key: 1 if the plan does not admit it."""
    home: IntArray
    """Per key: its hashed home on the cold path."""
    units: IntArray
    """Per request: its work units in the gateway's in-flight load."""
    moved: BoolArray
    """Per request: the first of its key's after a plan took the key off its cold home."""
    early: BoolArray
    """Per request: before the first plan (every key cold)."""


def _placement(
    q: RequestSet,
    r: int,
    q_cap: float | None,
    *,
    warm_slots: int,
    fair_share: float | None,
    work_unit_tokens: int | None,
    intervals: int,
) -> _Placement:
    """The plain model (`q_cap` None: one home per key) or the deployed policy's placement."""
    none = np.zeros(q.n, dtype=np.bool_)
    if q_cap is None:
        replicas = np.ones(len(q.keys), dtype=np.int64)
    else:
        replicas = admitted_replicas(q, r, q_cap, warm_slots, fair_share)
    units = (
        np.ones(q.n, dtype=np.int64)
        if work_unit_tokens is None
        else (q.prompt_tokens // work_unit_tokens + 1).astype(np.int64)
    )
    return _Placement(
        replicas=replicas,
        cold=(replicas == 0).astype(np.int64),
        home=rendezvous_order(key_hashes(q.keys), r)[:, 0],
        units=units,
        moved=_plan_moves(q, replicas, intervals) if q_cap is not None else none,
        early=_before_first_plan(q, intervals) if q_cap is not None else none,
    )


def _displaced(
    q: RequestSet,
    at: _Placement,
    latency: FloatArray,
    *,
    cold_affinity: bool,
    destinations: int,
    gateways: int,
    load_factor: float,
) -> FloatArray:
    """Per request, the probability it is not where its key's earlier requests went.

    Cold keys always, and every key before the first plan, take the cold path: displaced by the
    load bound (`cold_displacement`), or - P2C, without cold affinity - always.
    """
    cold_path = at.early | (at.cold[q.key_index] > 0)
    if not cold_affinity:
        out: FloatArray = np.where(cold_path, 1.0, 0.0)
        return out
    kw: dict[str, Any] = {
        "destinations": destinations,
        "gateways": gateways,
        "load_factor": load_factor,
    }
    planned = cold_displacement(q, at.home, at.cold, latency, at.units, **kw)[q.key_index]
    if not at.early.any():
        return planned
    every = np.ones_like(at.cold)
    hashed = cold_displacement(q, at.home, every, latency, at.units, **kw)[q.key_index]
    mixed: FloatArray = np.where(at.early, hashed, planned)
    return mixed


def _request_of(q: RequestSet) -> IntArray:
    """Request index of every (request, block) occurrence."""
    out: IntArray = np.repeat(np.arange(q.n, dtype=np.int64), np.diff(q.block_offsets))
    return out


def _counts(occ: _Occurrences, horizon: float) -> tuple[IntArray, IntArray]:
    """(earlier occurrences of the block within horizon, of the same key's block within it)."""
    n_all = np.empty(occ.block.size, dtype=np.int64)
    p = occ.by_block
    n_all[p] = _window_counts(occ.block[p], occ.time[p], horizon)
    n_same = np.empty(occ.block.size, dtype=np.int64)
    p = occ.by_key_block
    n_same[p] = _window_counts(occ.key_block[p], occ.time[p], horizon)
    return n_all, n_same


def _hits(q: RequestSet, prob: FloatArray) -> FloatArray:
    tokens = _prefix_sum(q.block_offsets, prob) * q.block_tokens
    out: FloatArray = np.minimum(tokens, q.prompt_tokens - 1.0)
    return out


def _horizon(q: RequestSet, r: int, cache_tokens: int, hit_tokens: float) -> float:
    inflow = max(1e-9, float(q.prompt_tokens.sum()) - hit_tokens) / max(q.duration, 1e-9) / r
    return cache_tokens / inflow


def admitted_replicas(
    q: RequestSet, destinations: int, q_cap: float, warm_slots: int, fair_share: float | None
) -> IntArray:
    """Per key, k_b if the planner admits it at the workload's rates, else 0.

    The planner's own walk (`planner.admission.admit`): keys by rate (ties by key), k_b =
    max(1, ceil(rate / cap)) capped at R, with cap = min(q_cap, fair_share x total rate / R) as
    `PlannerParams.sizing_cap` has it, admitted while used + k_b <= C = R x W. The deployment
    plans from rates observed so far; the whole replay's rates are what it converges to.
    """
    r = destinations
    rates = q.key_rates().astype(np.float64)
    total = float(rates.sum())
    cap = q_cap
    if fair_share is not None and total > 0.0:
        cap = min(q_cap, fair_share * total / r)
    out = np.zeros(len(q.keys), dtype=np.int64)
    active = np.flatnonzero(rates > 0)
    if active.size == 0 or warm_slots <= 0:
        return out
    keys = [q.keys[k] for k in active.tolist()]
    sub = rates[active]
    idx, _ = admit(
        sub, sub, keys, q_cap=cap, r=r, capacity=r * warm_slots, kernels=python_kernels()
    )
    chosen = active[idx]
    out[chosen] = replica_counts(rates[chosen], cap, r)
    return out


def planned_imbalance(q: RequestSet, replicas: IntArray, destinations: int) -> float:
    """max/mean replica load of the plan's LPT placement, the cold load spread evenly.

    Each admitted key is k_b items of rate / k_b, placed largest first on the least-loaded
    replica (LPT, as the planner places them). Fair-share sizing keeps every item below the mean,
    but a few coarse keys still cannot be packed evenly: what the planner reports as
    `expected_max_over_mean`, and the balance a plan costs before any burst.
    """
    rates = q.key_rates().astype(np.float64)
    admitted = np.flatnonzero(replicas > 0)
    cold = float(rates[replicas == 0].sum())
    loads = [cold / destinations] * destinations
    heap = [(load, d) for d, load in enumerate(loads)]
    heapq.heapify(heap)
    items = np.repeat(rates[admitted] / replicas[admitted], replicas[admitted])
    for item in np.sort(items)[::-1].tolist():
        load, d = heapq.heappop(heap)
        heapq.heappush(heap, (load + item, d))
    final = [load for load, _ in heap]
    mean = sum(final) / destinations
    return max(final) / mean if mean > 0 else 1.0


@njit
def _tail(nu: float, sizes: FloatArray, bound: int) -> float:
    """P(X >= bound) for X a compound Poisson sum: Poisson(nu) items, P(size = j) = sizes[j].

    Panjer's recursion f(x) = nu / x * sum_j j sizes[j] f(x - j) for x < bound: sizes of `bound`
    or more never enter it, so `sizes` may stop at bound - 1.
    """
    if bound <= 0:
        return 1.0
    f = np.zeros(bound, dtype=np.float64)
    f[0] = math.exp(-nu)
    below = f[0]
    for x in range(1, bound):
        acc = 0.0
        for j in range(1, min(x, sizes.shape[0] - 1) + 1):
            acc += j * sizes[j] * f[x - j]
        f[x] = nu / x * acc
        below += f[x]
    return float(max(0.0, 1.0 - below))


def _latency(q: RequestSet, hits: FloatArray, s: ServiceModel) -> FloatArray:
    """Seconds each request is in flight, unqueued: prefill, then decoding at half the batch."""
    prompt = q.prompt_tokens.astype(np.float64)
    batch = max(1.0, s.max_running / 2)
    out = q.output_tokens.astype(np.float64)
    step = s.decode_base_s + batch * s.decode_per_seq_s + s.decode_per_ctx_token_s * (prompt + out)
    lat: FloatArray = s.prefill_seconds(prompt - hits, hits) + out * step
    return lat


def cold_displacement(
    q: RequestSet,
    home: IntArray,
    cold: IntArray,
    latency: FloatArray,
    units: IntArray,
    *,
    destinations: int,
    gateways: int,
    load_factor: float,
) -> FloatArray:
    """Per key, the probability that a cold request finds its home at the load bound.

    One gateway sees 1/G of every request. Home d holds, from it, a compound Poisson number of
    in-flight requests: mean (Little) sum of latency / duration / G over the requests homed there
    - planned keys' spread evenly over the R replicas, cold keys' (`cold` marks them) on their
    hashed `home` - each weighing its work units, sized as the units of a request in flight (by
    latency). The bound is ceil(c x (L + 1) / R) units with L the gateway's mean in-flight units,
    as the Router computes it; a request is displaced when its home holds that many.
    """
    r, g = destinations, max(1, gateways)
    dur = max(q.duration, 1e-9)
    inflight = latency / dur / g  # each request's contribution to mean in-flight requests
    is_cold = cold[q.key_index].astype(bool)
    hashed = np.bincount(home[q.key_index[is_cold]], weights=inflight[is_cold], minlength=r)
    per_home = hashed + float(inflight[~is_cold].sum()) / r  # planned load: LPT-balanced
    total_units = float((inflight * units).sum())
    bound = math.ceil(load_factor * (total_units + 1.0) / r)
    w = np.bincount(np.minimum(units, bound), weights=inflight, minlength=bound + 1)
    sizes = w / max(float(w.sum()), 1e-300)
    p_home = np.array([_tail(float(nu), sizes, bound) for nu in per_home.tolist()])
    out: FloatArray = np.where(cold > 0, p_home[home], 0.0)
    return out


def uncached_work(q: RequestSet, service: ServiceModel) -> float:
    """Mean GPU seconds per request with no cache hits: R / this is a load R replicas can take."""
    return _work(q, np.zeros(q.n), service)


def _work(q: RequestSet, hits: FloatArray, s: ServiceModel) -> float:
    """Mean GPU seconds per request: prefill of the uncached part + decode at half the batch."""
    prompt = q.prompt_tokens.astype(np.float64)
    prefill = s.prefill_seconds(prompt - hits, hits)
    batch = max(1.0, s.max_running / 2)
    ctx = float(prompt.mean() + 0.5 * q.output_tokens.mean())
    per_token = (
        s.decode_base_s + batch * s.decode_per_seq_s
    ) / batch + s.decode_per_ctx_token_s * ctx
    return float(prefill.mean()) + float(q.output_tokens.mean()) * per_token


def diagnose(
    requests: RequestSet,
    destinations: int,
    service: ServiceModel,
    *,
    win_gain: float = 1.10,
    tie_gain: float = 1.03,
    pinned_for_loss: float = 0.5,
    q_cap: float | None = None,
    warm_slots: int = WARM_SLOTS,
    fair_share: float | None = DEFAULT_FAIR_SHARE,
    gateways: int = 1,
    cold_affinity: bool = True,
    cold_load_factor: float = 1.25,
    work_unit_tokens: int | None = 512,
    intervals: int = 15,
) -> Diagnosis:
    """Estimate affinity's recoverable reuse and its capacity gain; give a verdict.

    Without `q_cap` every key has one home (the plain affinity model); with it, the deployed
    policy: the planner's admission (`q_cap`, `warm_slots`, `fair_share`), the cold path (bounded
    loads, `cold_load_factor`, in `work_unit_tokens` units; P2C if not `cold_affinity`) and
    `gateways` (module docstring).
    """
    q, r = requests, destinations
    g = max(1, gateways)
    occ = _occurrences(q)
    prompt_total = float(q.prompt_tokens.sum())
    miss = 1.0 - 1.0 / r
    at = _placement(
        q,
        r,
        q_cap,
        warm_slots=warm_slots,
        fair_share=fair_share,
        work_unit_tokens=work_unit_tokens,
        intervals=intervals,
    )
    of = _request_of(q)
    k_occ = np.maximum(at.replicas, 1)[q.key_index].astype(np.float64)[of]
    h_spread = h_aff = math.inf
    hits_s = hits_a = np.zeros(q.n)
    displaced = np.zeros(q.n)
    for _ in range(_FIXED_POINT_ROUNDS):
        n_all, _ = _counts(occ, h_spread)
        hits_s = _hits(q, 1.0 - miss ** n_all.astype(np.float64))
        if q_cap is not None:
            displaced = _displaced(
                q,
                at,
                _latency(q, hits_a, service),
                cold_affinity=cold_affinity,
                destinations=r,
                gateways=g,
                load_factor=cold_load_factor,
            )
        n_all_a, n_same = _counts(occ, h_aff)
        other = (n_all_a - n_same).astype(np.float64)
        same = n_same.astype(np.float64)
        # the key's own blocks: on one of its k_b replicas, or - displaced or moved - anywhere
        stay = np.where(at.moved, 0.0, 1.0 - displaced)[of]
        p_same = stay * (1.0 - (1.0 - 1.0 / k_occ) ** same) + (1.0 - stay) * (1.0 - miss**same)
        p_same = np.where(same > 0, p_same, 0.0)
        hits_a = _hits(q, 1.0 - (1.0 - p_same) * miss**other)
        h_spread = _horizon(q, r, service.cache_tokens, float(hits_s.sum()))
        h_aff = _horizon(q, r, service.cache_tokens, float(hits_a.sum()))
    work_s, work_a = _work(q, hits_s, service), _work(q, hits_a, service)
    work_gain = work_s / work_a if work_a > 0 else 1.0
    counts = q.key_counts()
    imbalance = planned_imbalance(q, at.replicas, r) if q_cap is not None else 1.0
    cold_req = at.cold[q.key_index] > 0
    hashed = float((cold_req | at.early).mean()) if q.n and cold_affinity and q_cap else 0.0
    base = Diagnosis(
        verdict="tie",
        destinations=r,
        horizon_affinity_s=h_aff,
        horizon_spread_s=h_spread,
        hit_affinity=float(hits_a.sum()) / prompt_total,
        hit_spread=float(hits_s.sum()) / prompt_total,
        recoverable=float(hits_a.sum() - hits_s.sum()) / prompt_total,
        work_spread_s=work_s,
        work_affinity_s=work_a,
        predicted_gain=work_gain * (1.0 + SPREAD_PENALTY * (1.0 - 1.0 / g)) / imbalance,
        pinned_share=float(counts[counts > 1].sum()) / max(1, q.n),
        win_gain=win_gain,
        tie_gain=tie_gain,
        reason="",
        work_gain=work_gain,
        gateways=g,
        admitted_keys=int(np.count_nonzero(at.replicas)) if q_cap is not None else 0,
        admitted_share=1.0 - float(cold_req.mean()) if q.n else 1.0,
        cold_displaced=float(displaced[cold_req].mean()) if cold_req.any() else 0.0,
        hashed_share=hashed,
        plan_imbalance=imbalance,
        required_gain=win_gain * (1.0 + UNCERTAINTY * hashed * (2.0 - 1.0 / g)),
    )
    return _judge(base, pinned_for_loss)


def _judge(d: Diagnosis, pinned_for_loss: float) -> Diagnosis:
    """The verdict and its reason for the numbers in `d` (module docstring: Verdict)."""
    gain, pinned, rec = d.predicted_gain, d.pinned_share, d.recoverable
    verdict: Verdict
    if gain >= d.required_gain:
        verdict = "win"
        reason = f"affinity recovers {rec:.1%} of prompt tokens: {gain:.2f}x less work"
    elif gain < d.tie_gain and pinned >= pinned_for_loss:
        verdict = "lose"
        reason = (
            f"only {gain:.2f}x less work, but {pinned:.0%} of requests would be pinned: "
            "pinning costs balance for no reuse"
        )
    elif gain >= d.win_gain:
        verdict = "tie"
        reason = (
            f"affinity saves {gain:.2f}x work, short of the {d.required_gain:.2f}x a win needs "
            f"with {d.hashed_share:.0%} of requests on hashed homes"
        )
    else:
        verdict = "tie"
        reason = f"affinity saves only {gain:.2f}x work ({rec:.1%} of prompt tokens)"
    return replace(d, verdict=verdict, reason=reason)
