"""Settings: defaults, CACHEROUTE_* environment variables, flag overrides, clear errors."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from cacheroute.errors import ConfigError
from cacheroute.localkafka.settings import LocalBrokerSettings
from cacheroute.settings import Settings


def test_defaults_without_environment() -> None:
    s = Settings.from_env({})
    assert s.bootstrap == "127.0.0.1:9092"
    assert s.topics == {
        "requests": "requests",
        "rates": "rates",
        "plans": "plans",
        "dead_letter": "dead-letter",
    }
    # the connection only: the local broker's jars, version and heap are not a client's business
    names = {f.name for f in dataclasses.fields(s)}
    assert names.isdisjoint({f.name for f in dataclasses.fields(LocalBrokerSettings)} - {"home"})
    local = LocalBrokerSettings.from_env({})
    assert (local.kafka_home, local.kafka_version, local.kafka_source) == (None, "4.1.1", "auto")


def test_environment_then_overrides() -> None:
    env = {
        "CACHEROUTE_BOOTSTRAP": "127.0.0.1:19092",
        "CACHEROUTE_TOPIC_PREFIX": "t1.",
        "CACHEROUTE_REQUESTS_PARTITIONS": "3",
        "CACHEROUTE_PLANS_MIN_CLEANABLE_DIRTY_RATIO": "0.5",
        "CACHEROUTE_HOME": "/srv/cacheroute",
        "KAFKA_HOME": "/opt/kafka",
    }
    s = Settings.from_env(env, topic_prefix="t2.", bootstrap=None)
    assert s.bootstrap == "127.0.0.1:19092"
    assert s.topic_prefix == "t2."  # flag beats environment; None means "flag not given"
    assert s.requests_partitions == 3
    assert s.plans_min_cleanable_dirty_ratio == 0.5
    assert s.home == Path("/srv/cacheroute")
    local = LocalBrokerSettings.from_env(env, kafka_version="4.0.0", kafka_heap=None)
    assert (local.home, local.kafka_home) == (Path("/srv/cacheroute"), Path("/opt/kafka"))
    assert (local.kafka_version, local.kafka_heap) == ("4.0.0", "512m")  # flag; None: not given
    assert s.topics["plans"] == "t2.plans"
    assert s.host_port == ("127.0.0.1", 19092)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"CACHEROUTE_REQUESTS_PARTITIONS": "many"}, "CACHEROUTE_REQUESTS_PARTITIONS='many'"),
        ({"CACHEROUTE_REQUESTS_PARTITIONS": "0"}, "must be positive"),
        ({"CACHEROUTE_BOOTSTRAP": "localhost"}, "is not host:port"),
        ({"CACHEROUTE_PLANS_MIN_CLEANABLE_DIRTY_RATIO": "2"}, r"must be in \(0, 1\]"),
    ],
)
def test_bad_values_name_the_variable(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Settings.from_env(env)


def test_with_overrides_validates() -> None:
    s = Settings.from_env({})
    assert s.with_overrides(topic_prefix=None) is s
    assert s.with_overrides(topic_prefix="x.").topic_prefix == "x."
    with pytest.raises(ConfigError):
        s.with_overrides(requests_partitions=0)
    with pytest.raises(ConfigError, match="auto, maven or tarball"):
        LocalBrokerSettings.from_env({"CACHEROUTE_KAFKA_SOURCE": "ftp"})
    with pytest.raises(ConfigError, match="unknown local broker settings"):
        LocalBrokerSettings.from_env({}, bootstrap="x")
