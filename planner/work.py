"""Per-key rates in units of work: what the planner sizes, admits and places when it plans on work.

A replica's cost is GPU time, and a request's GPU time grows with its prompt: prompts on one
cluster vary a hundredfold, so two keys with equal request rates can load a replica 10x apart.
Planning on request counts then balances requests while prefill work stays skewed (on the `whale`
workload: requests at max/mean 1.09, prefill at 1.33).

The unit is the one the gateways' `Router` already charges a request while it waits for its first
token, `1 + uncached_tokens / unit_tokens` (a decode unit plus the prefill the cache will not
save), so the plan and the dispatcher weigh load alike. A key's uncached tokens are its mean prompt
less what the engines reported serving from cache (`planning_rates`), or, until any engine
reports, less its mean declared reusable prefix (`RequestEvent.prefix_tokens`; 0 when none is
declared, so the whole prompt counts): a planned key's replicas hold its prefix warm, and
charging the whole prompt would over-weigh exactly the long-prefix keys the plan serves best (in
the evaluator at full size, whole prompts lost about 5% of SLO capacity on `whale` against request
counts). Measured against request counts (docs/EVALUATION.md `whale_plan_on_requests`, the
ablation): with declared prefixes, +2-7% on `whale` and the Mooncake trace; with reported cached
tokens, whale at one gateway serves 373 req/s against 382 on request counts (prefill max/mean
1.15 against 1.26).

Rates are then rescaled so that their total is unchanged: a key's rate becomes its share of the
work times the total request rate, "mean-request equivalents". `q_cap` (a key's per-replica knee,
in requests/s of an average request) and every other parameter keep their meaning, and a cluster
whose requests all cost the same plans exactly as before.

Pure: numpy in, numpy out.
"""

from __future__ import annotations

import numpy as np

from cacheroute.planner.errors import PlannerError
from cacheroute.planner.plan import FloatArray
from cacheroute.planner.smoothing import RatesSnapshot

__all__ = [
    "DEFAULT_WORK_UNIT_TOKENS",
    "planning_rates",
    "request_cost",
    "uncached_tokens",
    "work_rates",
]

DEFAULT_WORK_UNIT_TOKENS = 512
"""Tokens of prefill one unit of work stands for: the gateways' unit
(`dispatcher.routing.DEFAULT_UNIT_TOKENS`), so the plan and the dispatcher weigh load alike."""


def uncached_tokens(prompt_tokens: FloatArray, prefix_tokens: FloatArray) -> FloatArray:
    """Mean prompt tokens a warm cache does not save: prompt - reusable prefix, at least 0."""
    out: FloatArray = np.maximum(
        np.asarray(prompt_tokens, dtype=np.float64) - np.asarray(prefix_tokens, dtype=np.float64),
        0.0,
    )
    return out


def request_cost(uncached: FloatArray, unit_tokens: int) -> FloatArray:
    """Work of one request with this many uncached prompt tokens: 1 (decode) + uncached / unit."""
    if unit_tokens <= 0:
        raise PlannerError(f"unit_tokens must be > 0, got {unit_tokens!r}")
    out: FloatArray = 1.0 + np.asarray(uncached, dtype=np.float64) / float(unit_tokens)
    return out


def work_rates(rates: FloatArray, uncached: FloatArray, unit_tokens: int) -> FloatArray:
    """Each key's rate weighted by its mean request cost, rescaled to the same total rate.

    rates: requests/s per key; uncached: mean uncached prompt tokens of a request of that key.
    Returns rate_b * cost_b / mean_cost, where mean_cost is the rate-weighted mean cost over all
    keys (so sum(result) == sum(rates)). All-zero rates come back unchanged.
    """
    r = np.asarray(rates, dtype=np.float64)
    p = np.asarray(uncached, dtype=np.float64)
    if r.shape != p.shape:
        raise PlannerError(f"work_rates: {r.shape[0]} rates but {p.shape[0]} prompt sizes")
    if not (np.isfinite(p).all() and (p >= 0).all()):
        raise PlannerError("work_rates: prompt sizes must be finite and >= 0")
    cost = request_cost(p, unit_tokens)
    total = float(r.sum())
    work = r * cost
    if total <= 0:
        return r.copy()
    out: FloatArray = work * (total / float(work.sum()))
    return out


def planning_rates(snapshot: RatesSnapshot, unit_tokens: int | None) -> FloatArray:
    """The rates the planner service plans on: work rates from the smoothed snapshot, or (None)
    its request rates. Keys whose records carry no token sums (older gateways) cost 1 each.

    A key's uncached tokens are its prompt less what the engines *reported* serving from cache
    when they report it (any key with cached tokens > 0: vLLM and SGLang return them in every
    answer's usage, so a key with none there really was computed in full), else less its
    declared reusable prefix. The reported figure is the work the key brings where it runs now:
    a long conversation whose history falls out of the cache, or a key whose prefix is warm on
    none of its replicas, costs what the engines measured, not what an ideal cache would save.
    (In the evaluator, on the long-context conversation trace keyed per conversation at 16
    gateways: 21.8 -> 28.0 req/s of SLO capacity, and the whale workload's prefill max/mean at
    one gateway 1.35 -> 1.15 at the same capacity; docs/EVALUATION.md `conv-trace_g16_declared_cost`,
    `whale_declared_cost`.)
    """
    if unit_tokens is None:
        return snapshot.rates
    cached = snapshot.cached_tokens
    reported = cached is not None and bool((cached > 0).any())
    saved = cached if reported and cached is not None else snapshot.prefix_tokens
    uncached = uncached_tokens(snapshot.prompt_tokens, saved)
    return work_rates(snapshot.rates, uncached, unit_tokens)
