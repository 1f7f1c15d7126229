"""`topics ensure` against the real broker: creates, is idempotent, repairs drifted configs."""

from __future__ import annotations

import time

import pytest
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

from cacheroute.settings import Settings
from cacheroute.topics import describe_topic_configs, ensure_topics, make_admin, topic_specs

pytestmark = pytest.mark.kafka


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
