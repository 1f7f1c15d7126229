"""Publish advisor: is installing the candidate plan worth the cache it cools down?

The paper keeps the old plan until the measured staleness cost exceeds the re-warm cost, but gives
no formula. This one is explicit and every number is in the answer, so an operator can disagree:

  value of a key             = rate x reusable prefix tokens (tokens/s a warm home saves);
                               without prefix tokens, 1 token per request (value = rate)
  staleness cost (horizon H) = max(0, value of keys only the candidate admits - value of keys only
                               the live plan admits) x H, with H = the control interval: what
                               keeping the live plan forgoes until the next chance to publish
  re-warm cost               = value of the keys both admit whose destination set changes,
                               each x the share of its new destinations it did not have
                               (`PlanDiff.moved_shares`), x rewarm_s: that part of their traffic
                               runs cold at the new replicas for a while
  imbalance                  = max/mean expected load of the live plan under the new rates

Publish when the destinations changed (the live plan may route to a removed one), when the live
plan breaks the load tolerance and the candidate is better balanced, or when staleness > re-warm.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from itertools import repeat
from typing import Any

import numpy as np

from cacheroute.planner.diff import plan_diff
from cacheroute.planner.errors import PlannerError
from cacheroute.planner.loads import expected_loads
from cacheroute.planner.plan import FloatArray, Plan, max_over_mean

__all__ = ["DEFAULT_REWARM_S", "Advice", "advise"]

DEFAULT_REWARM_S = 10.0
"""Seconds a moved key's traffic is assumed to miss at its new home (measure and tune it)."""


@dataclass(frozen=True, slots=True)
class Advice:
    """The advisor's verdict with the numbers behind it (costs in token-misses, or requests)."""

    publish: bool
    reasons: tuple[str, ...]
    unit: str
    horizon_s: float
    rewarm_s: float
    off_plan_rate: float
    """Requests/s of keys the candidate admits but the live plan leaves cold."""
    off_plan_value: float
    lost_value: float
    """Value/s of keys the live plan admits and the candidate drops."""
    moved_keys: int
    moved_rate: float
    """Requests/s the candidate sends to replicas that are not warm for their key: each moved
    key's rate x the share of its new destinations it did not have (`PlanDiff.moved_shares`)."""
    moved_value: float
    live_max_over_mean: float
    candidate_max_over_mean: float
    tolerance: float
    staleness_cost: float
    rewarm_cost: float

    def to_dict(self) -> dict[str, Any]:
        """Plain dict for JSON output and logs."""
        out = asdict(self)
        out["reasons"] = list(self.reasons)
        return out


def advise(
    live: Plan | None,
    candidate: Plan,
    keys: Sequence[str],
    rates: FloatArray,
    *,
    prefix_tokens: FloatArray | None = None,
    horizon_s: float | None = None,
    rewarm_s: float = DEFAULT_REWARM_S,
) -> Advice:
    """Weigh keeping `live` against publishing `candidate`, both judged at the new `rates`."""
    if len(keys) != rates.shape[0] or (
        prefix_tokens is not None and prefix_tokens.shape != rates.shape
    ):
        raise PlannerError("advise: keys, rates and prefix_tokens must have one value per key")
    horizon = candidate.params.control_interval_s if horizon_s is None else horizon_s
    tolerance = candidate.params.imbalance_tolerance
    unit = "prefix tokens" if prefix_tokens is not None else "requests"
    cand_mom = candidate.max_over_mean()
    if live is None:
        return Advice(
            publish=True,
            reasons=("no live plan",),
            unit=unit,
            horizon_s=horizon,
            rewarm_s=rewarm_s,
            off_plan_rate=candidate.admitted_rate,
            off_plan_value=0.0,
            lost_value=0.0,
            moved_keys=0,
            moved_rate=0.0,
            moved_value=0.0,
            live_max_over_mean=math.inf,
            candidate_max_over_mean=cand_mom,
            tolerance=tolerance,
            staleness_cost=math.inf,
            rewarm_cost=0.0,
        )
    index = {key: i for i, key in enumerate(keys)}
    weight = rates if prefix_tokens is None else rates * prefix_tokens

    def value_of(
        names: Sequence[str], shares: Sequence[float] | None = None
    ) -> tuple[float, float]:
        pos = np.fromiter(map(index.get, names, repeat(-1, len(names))), np.int64, len(names))
        share = np.ones(len(names)) if shares is None else np.asarray(shares, dtype=np.float64)
        known = pos >= 0
        pos, share = pos[known], share[known]
        return math.fsum((rates[pos] * share).tolist()), math.fsum((weight[pos] * share).tolist())

    diff = plan_diff(live, candidate)
    off_rate, off_value = value_of(diff.added_keys)
    _, lost_value = value_of(diff.removed_keys)
    moved_rate, moved_value = value_of(diff.moved_keys, diff.moved_shares)
    live_mom = max_over_mean(expected_loads(live, keys, rates), live.capacities)
    staleness = max(0.0, off_value - lost_value) * horizon
    rewarm = moved_value * rewarm_s

    reasons: list[str] = []
    if set(live.destination_names) != set(candidate.destination_names):
        reasons.append("destinations changed")
    if live_mom > tolerance and cand_mom < live_mom:
        reasons.append(
            f"live plan is imbalanced under the new rates "
            f"(max/mean {live_mom:.3f} > {tolerance:.3f}; candidate {cand_mom:.3f})"
        )
    if staleness > rewarm:
        reasons.append(f"staleness cost {staleness:.4g} > re-warm cost {rewarm:.4g} ({unit})")
    if not reasons:
        reasons.append(
            f"keep the live plan: staleness cost {staleness:.4g} <= re-warm cost {rewarm:.4g} "
            f"({unit}) and max/mean {live_mom:.3f} is within {tolerance:.3f}"
        )
        publish = False
    else:
        publish = True
    return Advice(
        publish=publish,
        reasons=tuple(reasons),
        unit=unit,
        horizon_s=horizon,
        rewarm_s=rewarm_s,
        off_plan_rate=off_rate,
        off_plan_value=off_value,
        lost_value=lost_value,
        moved_keys=len(diff.moved_keys),
        moved_rate=moved_rate,
        moved_value=moved_value,
        live_max_over_mean=live_mom,
        candidate_max_over_mean=cand_mom,
        tolerance=tolerance,
        staleness_cost=staleness,
        rewarm_cost=rewarm,
    )
