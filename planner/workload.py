"""A seeded, paper-like synthetic workload: per-key rates (and prefix sizes) for benchmarks and tests.

The paper's trace (128,824 keys) is not public; its shape is: log-normal rates with Gini 0.756, the
top 4% of keys carrying about 47% of the requests, no key above 0.3% of them. A log-normal with
sigma = 1.65 has Gini 2*Phi(sigma/sqrt 2) - 1 = 0.757 and top-4% share Phi(sigma - 1.751) = 0.46;
with the whales below, a 128,824-key sample measures Gini 0.760 and top-4% share 0.468. "A few whales": the heaviest `whales` keys are set to 0.20%-0.29% of the
total; with the default q_cap (0.15% of the total rate, see `default_q_cap`) they need k_b = 2, so
the benchmark exercises multi-replica keys while every key stays under the paper's 0.3%.

Randomness comes from the numpy Generator the caller passes in: same seed, same workload.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from cacheroute.planner.errors import PlannerError
from cacheroute.planner.plan import FloatArray

__all__ = [
    "PAPER_KEYS",
    "PAPER_TOTAL_RATE",
    "Workload",
    "default_q_cap",
    "drift",
    "gini",
    "paper_workload",
    "top_share",
]

PAPER_KEYS = 128_824
PAPER_TOTAL_RATE = 176.0
"""Requests/s: CacheRoute's SLO capacity in the paper's headline experiment (30 destinations)."""
_Q_CAP_SHARE = 0.0015


@dataclass(frozen=True, slots=True)
class Workload:
    """Keys with their rates (requests/s) and reusable prefix tokens."""

    keys: list[str]
    rates: FloatArray  # (n_keys,)
    prefix_tokens: FloatArray  # (n_keys,)

    def stats(self) -> dict[str, Any]:
        """The properties the paper states, measured on this sample."""
        total = float(self.rates.sum())
        return {
            "keys": len(self.keys),
            "total_rate": total,
            "gini": gini(self.rates),
            "top4_share": top_share(self.rates, 0.04),
            "max_share": float(self.rates.max()) / total,
        }


def default_q_cap(total_rate: float) -> float:
    """Benchmark q_cap: 0.15% of the total rate, so the 0.2%-0.3% whales need k_b = 2."""
    return _Q_CAP_SHARE * total_rate


def gini(rates: FloatArray) -> float:
    """Gini coefficient of the rates (0: all equal, -> 1: one key has everything)."""
    x = np.sort(rates)
    n = x.size
    total = float(x.sum())
    if n == 0 or total <= 0:
        return 0.0
    ranks = np.arange(1, n + 1, dtype=np.float64)
    return float(2.0 * np.dot(ranks, x) / (n * total) - (n + 1) / n)


def top_share(rates: FloatArray, fraction: float) -> float:
    """Share of the total rate carried by the top `fraction` of keys."""
    top = max(1, math.ceil(fraction * rates.size))
    return float(np.sort(rates)[-top:].sum() / rates.sum())


def paper_workload(
    n_keys: int,
    rng: np.random.Generator,
    *,
    total_rate: float = PAPER_TOTAL_RATE,
    sigma: float = 1.65,
    max_share: float = 0.003,
    whales: int = 8,
    mean_prefix_tokens: float = 1536.0,
) -> Workload:
    """Log-normal rates with the paper's shape, capped at `max_share`, plus a few whales."""
    if n_keys < 1 or max_share * n_keys < 1.0:
        raise PlannerError(f"{n_keys} keys cannot each stay under {max_share:.2%} of the total")
    shares = rng.lognormal(0.0, sigma, n_keys)
    shares /= shares.sum()
    for _ in range(100):  # clip the tail at max_share and renormalise until it holds
        over = shares > max_share
        if not over.any():
            break
        excess = float((shares[over] - max_share).sum())
        shares[over] = max_share
        shares[~over] *= 1.0 + excess / float(shares[~over].sum())
    whales = min(whales, n_keys // 4)
    if whales > 0:
        top = np.argsort(shares)[-whales:][::-1]
        whale_shares = np.linspace(0.0029, 0.0020, whales) * (max_share / 0.003)
        rest = np.ones(n_keys, dtype=np.bool_)
        rest[top] = False
        shares[rest] *= (1.0 - whale_shares.sum()) / float(shares[rest].sum())
        shares[top] = whale_shares
    rates = shares * total_rate
    # Reusable prefix sizes differ by key (system prompts, documents): log-normal around the mean.
    tokens = np.rint(rng.lognormal(math.log(mean_prefix_tokens) - 0.5 * 0.8**2, 0.8, n_keys))
    width = len(str(n_keys - 1))
    keys = [f"tenant-{i % 997:03d}/conv-{i:0{width}d}" for i in range(n_keys)]
    return Workload(keys=keys, rates=rates, prefix_tokens=tokens)


def drift(rates: FloatArray, sigma: float, rng: np.random.Generator) -> FloatArray:
    """One control interval of the paper's drift: each rate times an independent log-normal."""
    factors = np.asarray(rng.lognormal(0.0, sigma, rates.shape[0]), dtype=np.float64)
    out: FloatArray = rates * factors
    return out
