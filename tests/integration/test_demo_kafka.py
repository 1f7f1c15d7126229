"""`cacheroute demo` end to end: broker topics, streams worker, planner and two gateways."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cacheroute.settings import Settings
from cacheroute.topics import make_admin

pytestmark = pytest.mark.kafka


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.timeout(200)
def test_headless_demo_plans_routes_and_cleans_up(settings: Settings, tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "cacheroute",
            "--bootstrap",
            settings.bootstrap,
            "--topic-prefix",
            settings.topic_prefix,
            "--home",
            str(tmp_path),
            "demo",
            "--in-process",
            "--no-broker",
            "--headless",
            "--json",
            "--duration",
            "40",  # the first plan needs streams and planner up: slow on a busy 2-core machine
            "--interval",
            "4",
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=190,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary = json.loads(proc.stdout)  # stdout is exactly the one JSON object
    assert summary["plan_versions"] >= 1, proc.stderr[-4000:]
    assert summary["admitted_keys"] > 0
    assert summary["events"] > 0
    assert summary["dead_letters"] == 0
    gateways = summary["gateways"]
    assert [g["gateway"] for g in gateways] == ["gw-0", "gw-1"]
    for g in gateways:
        assert g["routed"] > 0
        assert g["final"] is True
    assert any(g["routed_by_plan"] > 0 for g in gateways), proc.stderr[-4000:]
    # everything it started is gone, and so are its run topics
    pids = [p["pid"] for p in summary["processes"]]
    assert len(pids) == 4
    assert all(_gone(pid) for pid in pids)
    assert summary["topic_prefix"].startswith(settings.topic_prefix + "demo-")
    left = [
        t
        for t in make_admin(settings.bootstrap).list_topics(timeout=10).topics
        if t.startswith((summary["topic_prefix"], f"demo-{summary['run_id']}-"))
    ]
    assert left == []
