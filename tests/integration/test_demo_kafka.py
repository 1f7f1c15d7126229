"""`cacheroute demo` end to end: broker topics, streams worker, planner and two gateways."""

from __future__ import annotations

from pathlib import Path

import pytest

from cacheroute.settings import Settings
from tests.integration.demo_support import assert_cleaned_up, run_headless_demo

pytestmark = pytest.mark.kafka


@pytest.mark.timeout(200)
def test_headless_demo_plans_routes_and_cleans_up(settings: Settings, tmp_path: Path) -> None:
    summary, stderr = run_headless_demo(settings, tmp_path, "--in-process")
    assert summary["plan_versions"] >= 1, stderr[-4000:]
    assert summary["admitted_keys"] > 0
    assert summary["events"] > 0
    assert summary["dead_letters"] == 0
    gateways = summary["gateways"]
    assert [g["gateway"] for g in gateways] == ["gw-0", "gw-1"]
    for g in gateways:
        assert g["routed"] > 0
        assert g["final"] is True
    assert any(g["routed_by_plan"] > 0 for g in gateways), stderr[-4000:]
    # everything it started is gone, and so are its run topics
    assert len(summary["processes"]) == 4
    assert_cleaned_up(settings, summary)
