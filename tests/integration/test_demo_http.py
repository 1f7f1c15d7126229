"""`cacheroute demo --http` end to end: streams worker, planner, real gateways, engines, load.

Two `cacheroute gateway` processes in front of four `cacheroute engine` stand-ins, driven over
HTTP by the demo's load generator, must follow the run's plans (some requests routed by plan on
every gateway), report to its requests topic (events, no dead letters), and the summary must carry
the HTTP figures: TTFT, the engines' hit rate and the Flat-LB shadow's. Afterwards every process
it started is gone and so are its topics.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from cacheroute.settings import Settings
from tests.integration.demo_support import assert_cleaned_up, run_headless_demo

pytestmark = pytest.mark.kafka


@pytest.mark.timeout(200)
def test_http_demo_routes_over_http_measures_and_cleans_up(
    settings: Settings, tmp_path: Path
) -> None:
    summary, stderr = run_headless_demo(settings, tmp_path, "--http")
    assert summary["mode"] == "http"
    assert summary["plan_versions"] >= 1, stderr[-4000:]
    assert summary["events"] > 0
    assert summary["dead_letters"] == 0
    gateways = summary["gateways"]
    assert [g["gateway"] for g in gateways] == ["gw-0", "gw-1"]
    for g in gateways:
        assert g["routed"] > 0
        assert g["final"] is True
        assert sum(g["load_total"]) > 0  # answers came back, naming their backend
    assert all(g["routed_by_plan"] > 0 for g in gateways), stderr[-4000:]
    # what the load generator measured, and what the engines and the shadow cluster report
    requests = summary["requests"]
    assert requests["ok"] > 0
    assert requests["final"] is True
    assert sum(e["requests"] for e in summary["engines"]) >= requests["ok"]
    assert 0 < summary["ttft_p50_ms"] <= summary["ttft_p99_ms"]
    for g in gateways:
        assert 0 < g["ttft_p50_ms"] <= g["ttft_p99_ms"]
    assert 0.0 <= summary["engine_hit_rate"] <= 1.0
    assert 0.0 <= summary["flat_lb_hit_rate"] <= 1.0
    assert summary["engine_hit_rate"] > 0  # requests of a key share their prefix text
    assert summary["observed_max_over_mean"] >= 1.0
    # everything it started is gone (2 gateways, 4 engines, load generator, streams, planner),
    # and so are its run topics
    names = sorted(p["name"] for p in summary["processes"])
    assert names == sorted(
        ["streams", "planner", "gw-0", "gw-1", "loadgen"] + [f"engine-d{i}" for i in range(4)]
    )
    assert_cleaned_up(settings, summary)
