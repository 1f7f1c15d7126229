"""A plan as plain JSON-ready data and back (for `--prev PLAN.json`, `--json`, files, fixtures).

Pure functions over dicts: the caller chooses the JSON library (the CLI uses orjson, which writes
doubles in shortest round-trip form, so loads and rates come back bit for bit). Keys appear in
plan order and destinations by name, so the file reads well and diffs well.
"""

from __future__ import annotations

from dataclasses import asdict, fields
from typing import Any

import numpy as np

from cacheroute.planner.errors import PlannerError
from cacheroute.planner.params import PlannerParams
from cacheroute.planner.plan import Destination, Plan, PlanStats

__all__ = ["PLAN_FORMAT", "plan_from_dict", "plan_to_dict"]

PLAN_FORMAT = "cacheroute.plan/1"


def plan_to_dict(plan: Plan) -> dict[str, Any]:
    """Plan -> dict with `assignments` (key -> destination names in selection order) and `loads`."""
    names = plan.destination_names
    flat = plan.targets.tolist()
    bounds = plan.offsets.tolist()
    return {
        "format": PLAN_FORMAT,
        "version": plan.version,
        "created_ms": plan.created_ms,
        "params": asdict(plan.params),
        "destinations": [{"name": d.name, "capacity": d.capacity} for d in plan.destinations],
        "assignments": {
            key: [names[d] for d in flat[bounds[i] : bounds[i + 1]]]
            for i, key in enumerate(plan.keys)
        },
        "rates": dict(zip(plan.keys, plan.rates.tolist(), strict=True)),
        "loads": dict(zip(names, plan.loads.tolist(), strict=True)),
        "total_rate": plan.total_rate,
        "cold_rate": plan.cold_rate,
        "stats": asdict(plan.stats),
    }


def plan_from_dict(data: Any) -> Plan:
    """dict -> validated Plan; PlannerError says what is missing or wrong."""
    if not isinstance(data, dict):
        raise PlannerError("a plan must be a JSON object")
    if data.get("format") != PLAN_FORMAT:
        raise PlannerError(f"not a plan in format {PLAN_FORMAT!r} (format: {data.get('format')!r})")
    try:
        params = PlannerParams(**_section(data, "params", PlannerParams))
        dests = tuple(
            Destination(str(d["name"]), float(d.get("capacity", 1.0)))
            for d in _get(data, "destinations", list)
        )
        stats = PlanStats(**_section(data, "stats", PlanStats))
        assignments = _get(data, "assignments", dict)
        rate_of = _get(data, "rates", dict)
        load_of = _get(data, "loads", dict)
        index = {d.name: i for i, d in enumerate(dests)}
        keys = tuple(assignments)
        offsets = [0]
        targets: list[int] = []
        for key, names in assignments.items():
            if key not in rate_of:
                raise PlannerError(f"plan lists key {key!r} without a rate", key=key)
            if not isinstance(names, list):
                raise PlannerError(f"destinations of key {key!r} must be a list", key=key)
            for name in names:
                if name not in index:
                    raise PlannerError(f"key {key!r} routes to unknown destination {name!r}")
                targets.append(index[name])
            offsets.append(len(targets))
        if set(load_of) != set(index):
            raise PlannerError("loads must name every destination exactly once")
        plan = Plan(
            version=int(data["version"]),
            created_ms=int(data["created_ms"]),
            params=params,
            destinations=dests,
            keys=keys,
            rates=np.array([float(rate_of[k]) for k in keys], dtype=np.float64),
            offsets=np.array(offsets, dtype=np.int64),
            targets=np.array(targets, dtype=np.int64),
            loads=np.array([float(load_of[d.name]) for d in dests], dtype=np.float64),
            total_rate=float(data["total_rate"]),
            cold_rate=float(data["cold_rate"]),
            stats=stats,
        )
    except (KeyError, TypeError, ValueError) as exc:
        if isinstance(exc, PlannerError):
            raise
        raise PlannerError(f"malformed plan: {type(exc).__name__}: {exc}") from None
    plan.validate()
    return plan


def _get(data: dict[str, Any], name: str, kind: type) -> Any:
    value = data.get(name)
    if not isinstance(value, kind):
        raise PlannerError(f"plan field {name!r} must be a {kind.__name__}")
    return value


def _section(data: dict[str, Any], name: str, cls: type) -> dict[str, Any]:
    """A nested object, keeping only the fields `cls` knows (newer writers may add some)."""
    value = _get(data, name, dict)
    known = {f.name for f in fields(cls)}
    return {k: v for k, v in value.items() if k in known}
