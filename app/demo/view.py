"""The demo's live terminal view: what the conductor has seen, as rich tables and one log line.

The conductor (`cacheroute.demo.run`) writes `DemoState` from its reader threads; `render` draws
it about twice a second under `rich.live.Live` (plan, moved rate, destinations with planned and
observed load, gateways with routes and hit rates); `progress_line` is the same news as one line
for runs without a terminal (`--headless`).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from cacheroute.demo import httpmode
from cacheroute.dispatcher.reader import LivePlan

if TYPE_CHECKING:
    from cacheroute.demo.run import DemoOptions

__all__ = ["DemoState", "progress_line", "render"]


@dataclass
class DemoState:
    """What the conductor has seen so far (written by reader threads, read by the view)."""

    gateways: dict[str, dict[str, Any]] = field(default_factory=dict)
    plan: LivePlan | None = None
    plan_versions: list[int] = field(default_factory=list)
    moved: list[tuple[int, float | None]] = field(default_factory=list)
    streams: dict[str, float] = field(default_factory=dict)
    planner: dict[str, float] = field(default_factory=dict)
    events_per_s: float = 0.0
    dead_letters: int = 0
    failed: str | None = None
    loadgen: dict[str, Any] = field(default_factory=dict)
    """HTTP mode: the load generator's last stats line."""
    engines: dict[str, dict[str, float]] = field(default_factory=dict)
    """HTTP mode: each engine's last scraped counters."""
    lock: threading.Lock = field(default_factory=threading.Lock)


def progress_line(state: DemoState, left: float) -> str:
    with state.lock:
        gws = ", ".join(
            f"{g}: v{s.get('plan_version')} routed {s.get('routed')} by plan "
            f"{s.get('routed_by_plan')}"
            for g, s in sorted(state.gateways.items())
        )
        line = (
            f"[{left:5.0f}s left] plan versions {len(state.plan_versions)}, "
            f"events/s {state.events_per_s:.0f}, dead letters {state.dead_letters}; {gws}"
        )
        if state.loadgen:
            line += "; " + httpmode.summary_line(state.loadgen, state.engines).plain
        return line


def _fmt(x: float | None, spec: str = ".1f", none: str = "-") -> str:
    return none if x is None else format(x, spec)


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def render(state: DemoState, options: DemoOptions, left: float) -> Group:
    with state.lock:
        live = state.plan
        gws = dict(state.gateways)
        planner = dict(state.planner)
        moved = list(state.moved[-6:])
        eps, dead = state.events_per_s, state.dead_letters
        loadgen, engines = dict(state.loadgen), dict(state.engines)
    head = Text()
    if live is None:
        head.append("plan: none yet (the first window must close first)\n", style="yellow")
    else:
        plan = live.plan
        age = time.time() - plan.created_ms / 1000.0
        head.append(f"plan v{plan.version}", style="bold green")
        head.append(
            f"  age {age:.1f} s  admitted keys {plan.n_admitted}  "
            f"Σk {plan.slots_used} / {options.destinations * options.warm_slots}  "
            f"rate {plan.total_rate:.0f} req/s (cold {plan.cold_rate:.0f})  "
            f"imbalance {_fmt(planner.get('cacheroute_planner_imbalance'), '.3f')}\n"
        )
    head.append(
        "moved rate at each new plan: "
        + (
            ", ".join(f"v{v}: {_fmt(None if m is None else 100 * m, '.1f')}%" for v, m in moved)
            or "-"
        )
        + "\n"
    )
    head.append(f"events/s (streams) {eps:.0f}   dead letters {dead}   {left:.0f} s left")

    dest = Table(title="destinations", title_justify="left")
    dest.add_column("dest")
    dest.add_column("expected req/s (plan)", justify="right")
    dest.add_column("observed req/s (gateways)", justify="right")
    if options.http:
        for col in ("engine hit rate", "served", "running/waiting"):
            dest.add_column(col, justify="right")
    engine_cells = httpmode.engine_rows(engines)
    for i in range(options.destinations):
        expected = None
        if live is not None and i < len(live.plan.loads):
            expected = float(live.plan.loads[i])
        observed = sum(float(s.get("load", [0.0] * (i + 1))[i]) for s in gws.values())
        extra = engine_cells.get(f"d{i}", ("-", "-", "-")) if options.http else ()
        dest.add_row(f"d{i}", _fmt(expected), f"{observed:.1f}", *extra)

    gwt = Table(
        title="gateways (served prefix-cache hit rate, token-weighted"
        + (", as the engines reported it)" if options.http else ")"),
        title_justify="left",
    )
    for col in (
        "gateway",
        "plan",
        "age s",
        "routed",
        "by plan",
        "stale",
        "hit rate",
        "last 1 s",
    ):
        gwt.add_column(col, justify="right")
    if options.http:  # the gateway does not split its hit rate by route kind; TTFT instead
        httpmode.ttft_columns(gwt)
    else:
        gwt.add_column("plan-routed", justify="right")
        gwt.add_column("other", justify="right")
    for g, s in sorted(gws.items()):
        routed = int(s.get("routed", 0))
        by_plan = int(s.get("routed_by_plan", 0))
        gwt.add_row(
            g,
            str(s.get("plan_version") or "-"),
            _fmt(s.get("plan_age_s")),
            str(routed),
            f"{by_plan} ({100 * by_plan / routed:.0f}%)" if routed else "0",
            str(s.get("route_kinds", {}).get("stale", 0)),
            _pct(s.get("hit_rate")),
            _pct(s.get("hit_rate_recent")),
            *(
                httpmode.ttft_cells(s)
                if options.http
                else (_pct(s.get("hit_rate_plan")), _pct(s.get("hit_rate_other")))
            ),
        )
    if options.http:
        return Group(head, httpmode.summary_line(loadgen, engines), dest, gwt)
    return Group(head, dest, gwt)
