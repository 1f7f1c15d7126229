"""Run `cacheroute demo` headless against the test broker and check what it leaves behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from cacheroute.settings import Settings
from cacheroute.topics import make_admin


def run_headless_demo(settings: Settings, home: Path, mode: str) -> tuple[dict[str, Any], str]:
    """(the one JSON summary, stderr) of a 40 s headless demo in `mode` (--http / --in-process).

    40 s because the first plan needs the streams worker and the planner up, which is slow on a
    busy 2-core machine.
    """
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
            str(home),
            "demo",
            mode,
            "--no-broker",
            "--headless",
            "--json",
            "--duration",
            "40",
            "--interval",
            "4",
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=190,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary: dict[str, Any] = json.loads(proc.stdout)  # stdout is exactly the one JSON object
    return summary, proc.stderr


def assert_cleaned_up(settings: Settings, summary: dict[str, Any]) -> None:
    """Every process the demo started is gone, and so are its run topics."""
    assert all(_gone(p["pid"]) for p in summary["processes"])
    assert summary["topic_prefix"].startswith(settings.topic_prefix + "demo-")
    left = [
        t
        for t in make_admin(settings.bootstrap).list_topics(timeout=10).topics
        if t.startswith((summary["topic_prefix"], f"demo-{summary['run_id']}-"))
    ]
    assert left == []


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False
