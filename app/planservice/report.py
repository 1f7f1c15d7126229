"""What `plan show` and `plan diff` print: plain dicts built from plans read off the topic.

Kept apart from the click commands so the shape of the JSON output is one function each, testable
without a terminal, and reusable by the demo's live view.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from cacheroute.dispatcher.reader import LivePlan
from cacheroute.planner import Plan, plan_diff

__all__ = [
    "diff_report",
    "key_report",
    "plan_report",
    "render_diff_report",
    "render_plan_report",
]


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def plan_report(live: LivePlan, *, now_ms: int) -> dict[str, Any]:
    """Version, provenance, size, balance and per-destination expected load of one version."""
    plan, header = live.plan, live.header
    per_dest = np.bincount(plan.targets, minlength=len(plan.destinations)).tolist()
    summary = plan.to_summary()
    return {
        "version": plan.version,
        "created_ms": plan.created_ms,
        "age_s": round(live.age_s(now_ms), 3),
        "planner_id": header.planner_id,
        "where": live.where,
        "chunks": header.chunk_count,
        "checksum": header.checksum,
        "inputs_until_ms": header.inputs_until_ms,
        "params": {
            "q_cap": plan.params.q_cap,
            "warm_slots": plan.params.warm_slots,
            "control_interval_s": plan.params.control_interval_s,
            "imbalance_tolerance": plan.params.imbalance_tolerance,
            "hysteresis": plan.params.hysteresis,
            "admission": plan.params.admission,
        },
        "keys": summary["keys"],
        "admitted_keys": summary["admitted_keys"],
        "slots_used": summary["slots_used"],
        "slots": summary["slots"],
        "multi_replica_keys": int(np.count_nonzero(plan.replicas() > 1)),
        "total_rate": summary["total_rate"],
        "admitted_rate": summary["admitted_rate"],
        "cold_rate": summary["cold_rate"],
        "imbalance": _finite(plan.max_over_mean()),
        "destinations": [
            {
                "name": d.name,
                "capacity": d.capacity,
                "expected_load": float(plan.loads[i]),
                "admitted_keys": per_dest[i],
            }
            for i, d in enumerate(plan.destinations)
        ],
    }


def key_report(live: LivePlan, key: str) -> dict[str, Any]:
    """Where one key goes under this version: its replica set, or power-of-two-choices if cold."""
    plan = live.plan
    i = live.index.get(key) if live.index else None
    if i is None and not live.index:
        i = plan.keys.index(key) if key in plan.keys else None
    if i is None:
        return {
            "key": key,
            "admitted": False,
            "routing": "cold: cluster-wide power-of-two-choices",
        }
    targets = plan.targets_of(i)
    rate = float(plan.rates[i])
    return {
        "key": key,
        "admitted": True,
        "position": i,
        "rate": rate,
        "replicas": len(targets),
        "destinations": [plan.destinations[d].name for d in targets],
        "rate_per_replica": rate / len(targets),
    }


def diff_report(a: Plan, b: Plan, *, top: int = 10) -> dict[str, Any]:
    """How `b` differs from `a`: moved/added/removed keys and rate, loads per destination."""
    diff = plan_diff(a, b)
    out: dict[str, Any] = {"a": a.version, "b": b.version}
    out.update(diff.to_dict())
    out["admitted_keys"] = {"a": a.n_admitted, "b": b.n_admitted}
    out["imbalance"] = {"a": _finite(a.max_over_mean()), "b": _finite(b.max_over_mean())}
    loads_a = dict(zip(a.destination_names, a.loads.tolist(), strict=True))
    loads_b = dict(zip(b.destination_names, b.loads.tolist(), strict=True))
    names = list(a.destination_names) + [n for n in b.destination_names if n not in loads_a]
    out["destinations"] = [
        {"name": n, "expected_load_a": loads_a.get(n), "expected_load_b": loads_b.get(n)}
        for n in names
    ]
    b_rate = dict(zip(b.keys, b.rates.tolist(), strict=True))
    moved = sorted(diff.moved_keys, key=lambda k: -b_rate[k])[:top]
    out["top_moved_keys"] = [{"key": k, "rate": b_rate[k]} for k in moved]
    return out


def render_plan_report(data: dict[str, Any], topic: str, console: Console) -> None:
    """`plan show` for people: the summary, loads per destination, the key asked about."""
    table = Table(
        title=f"Plan v{data['version']} on {topic}", title_justify="left", show_header=False
    )
    for name in (
        "version", "live_version", "planner_id", "age_s", "where", "chunks", "keys",
        "admitted_keys", "multi_replica_keys", "slots_used", "slots", "total_rate",
        "admitted_rate", "cold_rate", "imbalance",
    ):  # fmt: skip
        value = data[name]
        table.add_row(name, f"{value:.6g}" if isinstance(value, float) else str(value))
    console.print(table)
    loads = Table(title="Expected load per destination", title_justify="left")
    for col in ("destination", "capacity", "load (req/s)", "admitted keys"):
        loads.add_column(col, justify="left" if col == "destination" else "right")
    for d in data["destinations"]:
        loads.add_row(
            d["name"], f"{d['capacity']:g}", f"{d['expected_load']:.6g}", str(d["admitted_keys"])
        )
    console.print(loads)
    if "key" in data:
        info = data["key"]
        if info["admitted"]:
            console.print(
                f"{info['key']}: admitted, rate {info['rate']:.6g}/s, {info['replicas']} replica(s): "
                f"{', '.join(info['destinations'])}"
            )
        else:
            console.print(f"{info['key']}: not admitted ({info['routing']})")
    for r in data["rejected_versions"]:
        console.print(
            f"note: version {r['version']} at {r['where']} was not applied ({r['reason']})"
        )


def render_diff_report(data: dict[str, Any], console: Console) -> None:
    """`plan diff` for people: counts and rates, loads per destination, the top moved keys."""
    table = Table(
        title=f"Plan v{data['a']} -> v{data['b']}", title_justify="left", show_header=False
    )
    for name in (
        "moved_keys", "added_keys", "removed_keys", "kept_keys", "moved_rate", "added_rate",
        "removed_rate", "changed_keys_fraction", "changed_rate_fraction",
    ):  # fmt: skip
        value = data[name]
        table.add_row(name, f"{value:.4g}" if isinstance(value, float) else str(value))
    table.add_row("admitted keys", f"{data['admitted_keys']['a']} -> {data['admitted_keys']['b']}")
    imb = data["imbalance"]
    table.add_row(
        "imbalance", f"{imb['a']:.4g} -> {imb['b']:.4g}" if None not in imb.values() else "n/a"
    )
    console.print(table)
    loads = Table(title="Expected load per destination", title_justify="left")
    for col in ("destination", f"v{data['a']}", f"v{data['b']}"):
        loads.add_column(col, justify="left" if col == "destination" else "right")
    for d in data["destinations"]:
        la, lb = d["expected_load_a"], d["expected_load_b"]
        loads.add_row(
            d["name"], "-" if la is None else f"{la:.6g}", "-" if lb is None else f"{lb:.6g}"
        )
    console.print(loads)
    if data["top_moved_keys"]:
        console.print(
            "top moved keys: "
            + ", ".join(f"{m['key']} ({m['rate']:.3g}/s)" for m in data["top_moved_keys"])
        )
