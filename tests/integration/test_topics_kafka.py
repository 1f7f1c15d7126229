"""`topics ensure` against the real broker: creates, is idempotent, repairs drifted configs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

from cacheroute.settings import Settings
from cacheroute.topics import describe_topic_configs, ensure_topics, make_admin, topic_specs

pytestmark = pytest.mark.kafka

REPO = Path(__file__).resolve().parents[2]


def test_ensure_creates_topics_with_explicit_configs(settings: Settings) -> None:
    outcomes = ensure_topics(settings)
    assert [o.action for o in outcomes] == ["created"] * 4
    admin = make_admin(settings.bootstrap)
    meta = admin.list_topics(timeout=10)
    specs = topic_specs(settings)
    configs = describe_topic_configs(admin, [s.name for s in specs])
    for spec in specs:
        assert len(meta.topics[spec.name].partitions) == spec.partitions
        for key, value in spec.config.items():
            assert configs[spec.name][key] == value, (spec.name, key)
    assert configs[settings.topics["plans"]]["cleanup.policy"] == "compact"
    assert configs[settings.topics["requests"]]["cleanup.policy"] == "delete"


def test_ensure_is_idempotent_and_repairs_drift(settings: Settings) -> None:
    ensure_topics(settings)
    assert [o.action for o in ensure_topics(settings)] == ["unchanged"] * 4

    admin = make_admin(settings.bootstrap)
    plans = settings.topics["plans"]
    drift = ConfigResource(
        ResourceType.TOPIC,
        plans,
        incremental_configs=[
            ConfigEntry("cleanup.policy", "delete", incremental_operation=AlterConfigOpType.SET)
        ],
    )
    for fut in admin.incremental_alter_configs([drift]).values():
        fut.result(timeout=30)
    deadline = time.monotonic() + 30  # the broker applies the drift asynchronously
    while describe_topic_configs(admin, [plans])[plans]["cleanup.policy"] != "delete":
        assert time.monotonic() < deadline, "the drift never showed up"
        time.sleep(0.1)
    outcomes = {o.spec.role: o for o in ensure_topics(settings)}
    assert outcomes["plans"].action == "updated"
    assert outcomes["plans"].changes["cleanup.policy"] == ("delete", "compact")
    assert describe_topic_configs(admin, [plans])[plans]["cleanup.policy"] == "compact"


def test_partition_mismatch_is_reported_not_changed(settings: Settings) -> None:
    ensure_topics(settings)
    more = settings.with_overrides(requests_partitions=settings.requests_partitions + 2)
    outcome = {o.spec.role: o for o in ensure_topics(more)}["requests"]
    assert outcome.partitions == settings.requests_partitions
    assert any("left as is" in w for w in outcome.warnings)


def _ensure_cli(settings: Settings, *flags: str) -> subprocess.CompletedProcess[str]:
    """`cacheroute topics ensure FLAGS` on the test broker, with the test's prefix."""
    env = {k: v for k, v in os.environ.items() if k != "CACHEROUTE_TOPIC_PREFIX"}
    return subprocess.run(
        [sys.executable, "-m", "cacheroute", "--bootstrap", settings.bootstrap, "--topic-prefix",
         settings.topic_prefix, "topics", "ensure", *flags],
        capture_output=True, text=True, env=env | {"COLUMNS": "80"}, cwd=REPO, timeout=120,
        check=False,
    )  # fmt: skip


def test_ensure_replication_flags_reach_the_cluster(settings: Settings) -> None:
    """--replication-factor / --min-insync-replicas override the settings; what cannot work on
    this one-broker cluster is refused in one line before anything is created."""
    admin = make_admin(settings.bootstrap)

    def ours() -> list[str]:
        return sorted(
            t for t in admin.list_topics(timeout=10).topics if t.startswith(settings.topic_prefix)
        )

    too_many = _ensure_cli(settings, "--min-insync-replicas", "2")
    assert too_many.returncode == 1
    assert too_many.stderr == (
        "error: CACHEROUTE_MIN_INSYNC_REPLICAS (2) exceeds the replication factor (1, from the "
        "cluster's 1 broker(s)): no write could succeed; lower it, or set "
        "CACHEROUTE_REPLICATION_FACTOR (`topics ensure` flags: --min-insync-replicas, "
        "--replication-factor)\n"
    )
    no_room = _ensure_cli(settings, "--replication-factor", "2")
    assert no_room.returncode == 1
    assert no_room.stderr == (
        f"error: new topics need 2 replicas but only 1 broker(s) answer at {settings.bootstrap}: "
        "start the missing broker(s), or set CACHEROUTE_REPLICATION_FACTOR\n"
    )
    assert ours() == []

    created = _ensure_cli(
        settings, "--replication-factor", "1", "--min-insync-replicas", "1", "--json"
    )
    assert created.returncode == 0, created.stderr
    assert [
        (o["action"], o["config"]["min.insync.replicas"]) for o in json.loads(created.stdout)
    ] == [("created", "1")] * 4
    assert ours() == sorted(settings.topics.values())

    # on existing topics: the config is aligned, the replica count only reported
    raised = _ensure_cli(
        settings, "--replication-factor", "2", "--min-insync-replicas", "2", "--json"
    )
    assert raised.returncode == 0, raised.stderr
    by_role = {o["role"]: o for o in json.loads(raised.stdout)}
    plans = settings.topics["plans"]
    assert by_role["plans"]["action"] == "updated"
    assert by_role["plans"]["changes"] == {"min.insync.replicas": ["1", "2"]}
    assert by_role["plans"]["warnings"] == [
        f"{plans} has 1 replica(s), the cluster calls for 2; raise it with a partition "
        "reassignment (kafka-reassign-partitions.sh), ensure does not move data"
    ]
    assert describe_topic_configs(admin, [plans])[plans]["min.insync.replicas"] == "2"
