"""Topic specs: explicit configs, plans compacted on one partition, names from the settings."""

from __future__ import annotations

from cacheroute.settings import Settings
from cacheroute.topics import topic_specs


def test_specs_follow_settings() -> None:
    settings = Settings.from_env({}, topic_prefix="x.", requests_partitions=6, plans_segment_ms=500)
    specs = {s.role: s for s in topic_specs(settings)}
    assert set(specs) == {"requests", "rates", "plans", "dead_letter"}
    assert specs["requests"].name == "x.requests"
    assert specs["requests"].partitions == 6
    assert specs["requests"].config["cleanup.policy"] == "delete"
    assert specs["requests"].config["retention.ms"] == str(settings.retention_ms)
    plans = specs["plans"]
    assert plans.partitions == 1
    assert plans.config["cleanup.policy"] == "compact"
    assert plans.config["segment.ms"] == "500"
    assert float(plans.config["min.cleanable.dirty.ratio"]) <= 0.1
    assert specs["dead_letter"].name == "x.dead-letter"
