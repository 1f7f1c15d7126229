"""What one simulated run measured: hit rate, load spread, latency percentiles, tenant fairness.

Requests in the warm-up (the first `warmup_fraction` of arrivals: caches still cold, no plan yet)
are served but not measured. Definitions:
  * hit_rate - token-weighted served KV hit rate: cached prompt tokens / prompt tokens;
  * load - requests per destination; max_over_mean of those (1.0 = perfect), and of the prefill
    work (uncached prompt tokens), which is what a cache-aware policy can unbalance;
  * TTFT = first token - arrival, e2e = last token - arrival, queue = start of service - arrival;
  * fairness - p99 TTFT of the hottest keys (the fewest keys carrying 25% of requests) against
    the cold tail (keys outside the top half of requests).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np

from cacheroute.replay.requestset import FloatArray, IntArray, RequestSet

__all__ = ["SLO_METRICS", "RunMetrics", "SloMetric", "run_metrics"]

SloMetric = Literal["ttft", "e2e"]
SLO_METRICS: tuple[SloMetric, ...] = ("ttft", "e2e")
_HOT_SHARE = 0.25
_COLD_AFTER = 0.50


@dataclass(frozen=True, slots=True)
class RunMetrics:
    """Measured figures of one (policy, load) run."""

    policy: str
    offered_qps: float
    destinations: int
    measured_requests: int
    hit_rate: float
    max_over_mean: float
    max_over_mean_prefill: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    e2e_p50_ms: float
    e2e_p99_ms: float
    queue_p99_ms: float
    hot_ttft_p99_ms: float
    cold_ttft_p99_ms: float
    hot_keys: int
    load: tuple[int, ...]

    def p99_ms(self, metric: SloMetric) -> float:
        """The p99 the SLO is judged on."""
        return self.ttft_p99_ms if metric == "ttft" else self.e2e_p99_ms

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (JSON-ready)."""
        out = asdict(self)
        out["load"] = list(self.load)
        return out


def _p(values: FloatArray, q: float) -> float:
    return float(np.percentile(values, q)) * 1e3 if values.size else math.nan


def _max_over_mean(values: FloatArray) -> float:
    mean = float(values.mean()) if values.size else 0.0
    return float(values.max()) / mean if mean > 0 else 1.0


def run_metrics(
    *,
    policy: str,
    requests: RequestSet,
    destinations: int,
    dest: IntArray,
    cached: IntArray,
    t_start: FloatArray,
    t_first: FloatArray,
    t_done: FloatArray,
    warmup_fraction: float,
) -> RunMetrics:
    """Figures over the measured requests (after the warm-up)."""
    n = requests.n
    first = min(n - 1, math.floor(warmup_fraction * n))
    sl = slice(first, n)
    arrive = requests.times[sl]
    ttft = t_first[sl] - arrive
    e2e = t_done[sl] - arrive
    queue = t_start[sl] - arrive
    prompt = requests.prompt_tokens[sl]
    hit = float(cached[sl].sum()) / max(1.0, float(prompt.sum()))
    d = dest[sl]
    load: FloatArray = np.bincount(d, minlength=destinations).astype(np.float64)
    uncached = (prompt - cached[sl]).astype(np.float64)
    prefill: FloatArray = np.bincount(d, weights=uncached, minlength=destinations).astype(
        np.float64
    )
    keys = requests.key_index[sl]
    counts = np.bincount(keys, minlength=len(requests.keys)).astype(np.float64)
    order = np.argsort(-counts, kind="stable")
    cum = np.cumsum(counts[order]) / max(1.0, float(counts.sum()))
    hot_n = int(np.searchsorted(cum, _HOT_SHARE) + 1)
    cold_from = int(np.searchsorted(cum, _COLD_AFTER) + 1)
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    req_rank = rank[keys]
    return RunMetrics(
        policy=policy,
        offered_qps=requests.rate,
        destinations=destinations,
        measured_requests=int(n - first),
        hit_rate=hit,
        max_over_mean=_max_over_mean(load),
        max_over_mean_prefill=_max_over_mean(prefill),
        ttft_p50_ms=_p(ttft, 50),
        ttft_p99_ms=_p(ttft, 99),
        e2e_p50_ms=_p(e2e, 50),
        e2e_p99_ms=_p(e2e, 99),
        queue_p99_ms=_p(queue, 99),
        hot_ttft_p99_ms=_p(ttft[req_rank < hot_n], 99),
        cold_ttft_p99_ms=_p(ttft[req_rank >= cold_from], 99),
        hot_keys=hot_n,
        load=tuple(int(x) for x in load),
    )
