"""The CLI as a user runs it, against the real broker."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from cacheroute.settings import Settings

pytestmark = pytest.mark.kafka


def _run(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "cacheroute",
            "--bootstrap",
            settings.bootstrap,
            "--topic-prefix",
            settings.topic_prefix,
            *args,
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


def test_status_reports_the_bootstrap_address(settings: Settings) -> None:
    proc = _run(settings, "kafka", "status", "--json")
    assert proc.returncode == 0, proc.stderr
    status = json.loads(proc.stdout)
    assert status["answering"] is True
    assert status["bootstrap"] == settings.bootstrap


def test_topics_ensure_then_describe(settings: Settings) -> None:
    proc = _run(settings, "topics", "ensure", "--json")
    assert proc.returncode == 0, proc.stderr
    assert {t["action"] for t in json.loads(proc.stdout)} == {"created"}
    proc = _run(settings, "topics", "describe", "--json")
    assert proc.returncode == 0, proc.stderr
    rows = {r["role"]: r for r in json.loads(proc.stdout)}
    assert rows["plans"]["config"]["cleanup.policy"] == "compact"
    assert rows["plans"]["partitions"] == 1


def test_demo_without_a_broker_fails_clearly(settings: Settings) -> None:
    # the live demo itself runs in test_demo_kafka.py
    proc = _run(settings.with_overrides(bootstrap="127.0.0.1:1"), "demo", "--no-broker")
    assert proc.returncode != 0
    assert "no broker answers at 127.0.0.1:1" in proc.stdout + proc.stderr


def test_status_of_an_address_without_broker_exits_3(settings: Settings) -> None:
    proc = _run(settings.with_overrides(bootstrap="127.0.0.1:1"), "kafka", "status")
    assert proc.returncode == 3
    assert "not running" in proc.stdout
