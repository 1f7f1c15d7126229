"""One verdict from several seeds: capacities averaged, their spread kept, verdicts from the means.

A capacity search resolves a knee to a few percent, and the knee itself moves from one draw of a
workload to the next, so one seed can say `win` where another says `tie`. `combine` takes the
JSON of N evaluations of the same source and settings, seeds 0..N-1, and returns one JSON object
of the same shape: the first seed's figures, except that every policy's `slo_capacity_qps` is
the mean over the seeds, with `slo_capacity_qps_min`, `_max` and `_by_seed` beside it, and the
simulation verdict, ratios and recommendation are recomputed from the means (the same rules as
one run: win at >= 1.10x flat-lb's capacity, lose at <= 0.90x; deploy only if capacity is at
least 1 + margin times flat-lb's and the mean p99 ratio at the reference load at most 1 - margin).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from typing import Any

from cacheroute.replay.errors import ReplayError

__all__ = ["combine"]


def _verdict(ratio: float) -> str:
    return "win" if ratio >= 1.10 else "lose" if ratio <= 0.90 else "tie"


def combine(runs: Sequence[dict[str, Any]], margin: float = 0.10) -> dict[str, Any]:
    """The seeds' JSON objects (`Evaluation.to_dict()`) as one; see the module docstring."""
    if not runs:
        raise ReplayError("no runs to combine")
    names = list(runs[0]["policies"])
    for r in runs[1:]:
        if list(r["policies"]) != names:
            raise ReplayError("the runs compare different policies")
    out = copy.deepcopy(dict(runs[0]))
    for name in names:
        caps = [float(r["policies"][name]["slo_capacity_qps"]) for r in runs]
        p = out["policies"][name]
        p["slo_capacity_qps"] = sum(caps) / len(caps)
        p["slo_capacity_qps_min"] = min(caps)
        p["slo_capacity_qps_max"] = max(caps)
        p["slo_capacity_qps_by_seed"] = caps
        p["slo_capacity_is_lower_bound"] = any(
            bool(r["policies"][name].get("slo_capacity_is_lower_bound")) for r in runs
        )
    flat = out["policies"]["flat-lb"]["slo_capacity_qps"]
    ours = out["policies"]["cacheroute"]["slo_capacity_qps"]
    ratio = ours / flat if flat > 0 else math.inf
    p99 = [float(r["simulation"]["p99_ratio_at_reference"]) for r in runs]
    p99_ratio = sum(p99) / len(p99)
    out["simulation"] = {
        "verdict": _verdict(ratio),
        "capacity_ratio": ratio,
        "p99_ratio_at_reference": p99_ratio,
        "verdicts_by_seed": [r["simulation"]["verdict"] for r in runs],
    }
    out["agree"] = out["diagnostic"]["verdict"] == out["simulation"]["verdict"]
    better = ratio >= 1 + margin and p99_ratio <= 1 - margin
    out["recommendation"] = "deploy" if better else "keep flat-lb"
    out["seeds"] = len(runs)
    out["sim_requests"] = sum(int(r.get("sim_requests", 0)) for r in runs)
    return out
