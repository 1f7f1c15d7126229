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
  * the cold path - every other key goes by bounded-load consistent hashing: it has a home too,
    but a gateway moves it when the home holds at least ceil(c x (in flight + 1) / R) load units
    *of that gateway*. The share of cold requests displaced is the probability that a request
    finds its home at the bound: each home's in-flight units are compound Poisson (Little's law:
    rate x latency, in work units), the homes' cold rates as hashed (skewed by the keys' rates),
    the gateway's share 1/G of everything. A displaced request misses the key's own blocks as a
    spread request would. More gateways -> fewer units per gateway against a bound that is
    rounded up -> one long prompt in flight already blocks the home: the displacement grows with G;
  * the comparison - Flat-LB's power-of-two-choices balances on its own gateway's counts only;
    with G gateways each sees 1/G of the in-flight requests and its choices approach random ones.
    That costs Flat-LB capacity the deployed policy does not lose (its homes do not depend on
    counts). The gain is multiplied by `1 + SPREAD_PENALTY x (1 - 1/G)` - calibrated on the
    evaluation runs, see `SPREAD_PENALTY`.

Conservatism: the estimate ignores queueing, so it is least sure where affinity's load is bursty:
the bound c caps a home at c x the mean, so a win needs the gain to clear `win_gain` by the share
of traffic that rides on hashed homes (`uncertainty`); a gain between is a `tie`, never a `win`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np

from cacheroute.planner.admission import admit, replica_counts
from cacheroute.planner.kernels import python_kernels
from cacheroute.replay.jit import njit
from cacheroute.replay.policy import key_hashes
from cacheroute.replay.requestset import FloatArray, IntArray, RequestSet
from cacheroute.replay.service import ServiceModel

__all__ = ["Diagnosis", "Verdict", "diagnose"]

Verdict = Literal["win", "tie", "lose"]
_FIXED_POINT_ROUNDS = 6
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
) -> Diagnosis:
    """Estimate affinity's recoverable reuse and its capacity gain; give a verdict."""
    q, r = requests, destinations
    occ = _occurrences(q)
    prompt_total = float(q.prompt_tokens.sum())
    miss = 1.0 - 1.0 / r
    h_spread = h_aff = math.inf
    hits_s = hits_a = np.zeros(q.n)
    for _ in range(_FIXED_POINT_ROUNDS):
        n_all, _ = _counts(occ, h_spread)
        hits_s = _hits(q, 1.0 - miss ** n_all.astype(np.float64))
        n_all_a, n_same = _counts(occ, h_aff)
        other = (n_all_a - n_same).astype(np.float64)
        hits_a = _hits(q, np.where(n_same > 0, 1.0, 1.0 - miss**other))
        h_spread = _horizon(q, r, service.cache_tokens, float(hits_s.sum()))
        h_aff = _horizon(q, r, service.cache_tokens, float(hits_a.sum()))
    hit_s = float(hits_s.sum()) / prompt_total
    hit_a = float(hits_a.sum()) / prompt_total
    work_s, work_a = _work(q, hits_s, service), _work(q, hits_a, service)
    gain = work_s / work_a if work_a > 0 else 1.0
    counts = q.key_counts()
    pinned = float(counts[counts > 1].sum()) / max(1, q.n)
    verdict: Verdict
    if gain >= win_gain:
        verdict = "win"
        reason = f"affinity recovers {hit_a - hit_s:.1%} of prompt tokens: {gain:.2f}x less work"
    elif gain < tie_gain and pinned >= pinned_for_loss:
        verdict = "lose"
        reason = (
            f"only {gain:.2f}x less work, but {pinned:.0%} of requests would be pinned: "
            "pinning costs balance for no reuse"
        )
    else:
        verdict = "tie"
        reason = f"affinity saves only {gain:.2f}x work ({hit_a - hit_s:.1%} of prompt tokens)"
    return Diagnosis(
        verdict=verdict,
        destinations=r,
        horizon_affinity_s=h_aff,
        horizon_spread_s=h_spread,
        hit_affinity=hit_a,
        hit_spread=hit_s,
        recoverable=hit_a - hit_s,
        work_spread_s=work_s,
        work_affinity_s=work_a,
        predicted_gain=gain,
        pinned_share=pinned,
        win_gain=win_gain,
        tie_gain=tie_gain,
        reason=reason,
    )
