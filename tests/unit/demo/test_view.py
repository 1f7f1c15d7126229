"""The demo's live view draws what the conductor has seen (no broker, no processes)."""

from __future__ import annotations

from rich.console import Console

from cacheroute.demo.run import DemoOptions
from cacheroute.demo.view import DemoState, progress_line, render


def _text(state: DemoState, options: DemoOptions) -> str:
    console = Console(record=True, width=200)
    console.print(render(state, options, 12.0))
    return console.export_text()


def test_before_the_first_plan_the_view_says_so_and_shows_each_gateway() -> None:
    state = DemoState(events_per_s=1234.0, dead_letters=2)
    state.gateways["gw-0"] = {
        "plan_version": None,
        "routed": 200,
        "routed_by_plan": 50,
        "load": [60.0, 40.0],
        "hit_rate": 0.5,
        "route_kinds": {"stale": 3},
    }
    text = _text(state, DemoOptions(destinations=2))
    assert "plan: none yet" in text
    assert "events/s (streams) 1234   dead letters 2   12 s left" in text
    assert "50 (25%)" in text  # by plan: 50 of 200
    assert "50.0%" in text  # the hit rate
    cells = {
        line.split()[1]: line for line in text.splitlines() if " d0 " in line or " d1 " in line
    }
    assert "60.0" in cells["d0"]  # observed req/s per destination, summed over gateways
    assert "40.0" in cells["d1"]
    line = progress_line(state, 12.0)
    assert "gw-0: vNone routed 200 by plan 50" in line
    assert "dead letters 2" in line
