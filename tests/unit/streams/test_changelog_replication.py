"""The streams worker's changelog is replicated like the project's topics (no Kafka).

Faust creates the table's changelog itself, at its `topic_replication_factor` (default 1) and
with the table's `extra_topic_configs`, and never alters it afterwards. Without these a 3-broker
cluster ran the window state on one replica: losing that broker lost the counts the changelog
exists to keep.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from cacheroute.errors import ConfigError
from cacheroute.settings import Settings
from cacheroute.streams.app import StreamsOptions, create_app
from cacheroute.streams.config import StreamConfig

CFG = StreamConfig(window_ms=1000, grace_ms=200, reorder_ms=100, buckets=4)
NOWHERE = "127.0.0.1:1"
"""Bootstrap of the runtime's (lazily connecting) producer: no broker, and nobody else's."""


@pytest.mark.parametrize(
    ("settings", "brokers", "want"),
    [
        (Settings(), 1, (1, "1")),
        (Settings(), 3, (3, "2")),
        (Settings(), 5, (3, "2")),
        (Settings(replication_factor=2), 5, (2, "1")),
        (Settings(replication_factor=3, min_insync_replicas=3), 3, (3, "3")),
    ],
    ids=["one-broker", "three-brokers", "five-brokers", "explicit-2", "explicit-3-3"],
)
def test_changelog_gets_the_topics_replication(
    tmp_path: Path, settings: Settings, brokers: int, want: tuple[int, str]
) -> None:
    settings = settings.with_overrides(topic_prefix="unit.", home=tmp_path, bootstrap=NOWHERE)
    app, runtime = create_app(
        settings, CFG, StreamsOptions(app_id="unit-rf", datadir=tmp_path / "d"), brokers=brokers
    )
    replicas, min_insync = want
    assert app.conf.topic_replication_factor == replicas
    assert runtime.table.extra_topic_configs == {"min.insync.replicas": min_insync}
    changelog = runtime.table.changelog_topic
    assert changelog.get_topic_name() == "unit-rf-rate-windows-changelog"
    assert changelog.config == {"min.insync.replicas": min_insync}
    assert changelog.partitions == settings.requests_partitions


def test_changelog_with_one_in_sync_on_three_replicas_is_refused(tmp_path: Path) -> None:
    settings = Settings(min_insync_replicas=1, home=tmp_path, bootstrap=NOWHERE)
    with pytest.raises(ConfigError, match=r"^CACHEROUTE_MIN_INSYNC_REPLICAS=1 with 3 replicas: "):
        create_app(settings, CFG, StreamsOptions(datadir=tmp_path / "d"), brokers=3)
