"""`cacheroute doctor` on the real broker: healthy after `topics ensure` plus a fresh plan, then a
drifted topic config, an unprocessed backlog and dead letters are reported with exit code 1."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

from cacheroute.doctor import DoctorOptions, run_doctor
from cacheroute.kafkaio import producer_config
from cacheroute.settings import Settings
from cacheroute.topics import ensure_topics, make_admin
from tests.integration.planservice_support import make_plan, started_publisher

pytestmark = pytest.mark.kafka


def _cli(settings: Settings, *args: str) -> tuple[int, dict[str, object]]:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "cacheroute",
            "--bootstrap",
            settings.bootstrap,
            "--topic-prefix",
            settings.topic_prefix,
            "doctor",
            "--json",
            *args,
        ],
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert proc.stdout.strip(), proc.stderr.decode(errors="replace")[-3000:]
    return proc.returncode, json.loads(proc.stdout)


def test_doctor_healthy_then_reports_drift_backlog_and_dead_letters(settings: Settings) -> None:
    ensure_topics(settings)
    group = settings.topic_prefix + "streams"
    opts = DoctorOptions(streams_group=group, dlq_window_min=5)
    with started_publisher(settings, settings.topic_prefix + "doctor") as publisher:
        publisher.publish(make_plan(200, version=1, created_ms=int(time.time() * 1000) - 1))
    report = run_doctor(settings, opts)
    assert report.exit_code == 0, [f.to_dict() for f in report.problems]
    by = {f.check: f for f in report.findings}
    assert set(by) == {
        "broker",
        "topic:requests",
        "topic:rates",
        "topic:plans",
        "topic:dead_letter",
        "replication",
        "plan",
        "streams-lag",
        "dead-letter",
    }
    assert by["replication"].status == "ok"  # one broker: one replica is all there is
    assert by["plan"].detail["version"] == 1
    assert by["plan"].detail["max_age_s"] == 15.0  # 3 x the plan's 5 s control interval
    code, out = _cli(settings, "--streams-group", group)
    assert code == 0
    assert out["ok"] is True

    # drift: someone turned compaction off on plans
    admin = make_admin(settings.bootstrap)
    resource = ConfigResource(
        ResourceType.TOPIC,
        settings.topics["plans"],
        incremental_configs=[
            ConfigEntry("cleanup.policy", "delete", incremental_operation=AlterConfigOpType.SET)
        ],
    )
    for fut in admin.incremental_alter_configs([resource]).values():
        fut.result(timeout=30)
    # a backlog nobody consumes, and dead letters
    producer = Producer(producer_config(settings))
    for _ in range(5):
        producer.produce(settings.topics["requests"], b"x", partition=0)
    producer.produce(settings.topics["dead_letter"], b"bad", headers=[("cacheroute.reason", b"t")])
    assert producer.flush(10) == 0

    report = run_doctor(settings, opts)
    assert report.exit_code == 1
    bad = {f.check: f for f in report.problems}
    assert set(bad) == {"topic:plans", "streams-lag", "dead-letter"}
    assert "cleanup.policy=delete (want compact)" in bad["topic:plans"].message
    assert "cacheroute topics ensure" in bad["topic:plans"].fix
    assert "committed nothing" in bad["streams-lag"].message
    assert bad["streams-lag"].detail["total"] == 5
    assert bad["dead-letter"].detail["recent"] == 1
    code, out = _cli(settings, "--streams-group", group, "--max-plan-age", "0.001")
    assert code == 1
    failed = {f["check"] for f in out["findings"] if f["status"] == "fail"}  # type: ignore[attr-defined]
    assert {"topic:plans", "streams-lag", "plan"} <= failed

    ensure_topics(settings)  # the advised fix
    by = {f.check: f for f in run_doctor(settings, opts).findings}
    assert by["topic:plans"].status == "ok"


def test_doctor_exit_code_2_when_no_broker_answers() -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "cacheroute",
            "--bootstrap",
            "127.0.0.1:1",
            "doctor",
            "--json",
            "--timeout",
            "2",
        ],
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2
    out = json.loads(proc.stdout)
    assert out["broker_reachable"] is False
    assert "cacheroute kafka start" in out["findings"][0]["fix"]
