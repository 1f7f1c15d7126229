"""Settings of the local development broker only: which jars, where they are cached, its heap.

Kept apart from `cacheroute.settings.Settings`, the connection config every library and service
reads, so that a gateway's or a planner's settings carry nothing about a broker they never run.
The variables keep their names: CACHEROUTE_KAFKA_VERSION, CACHEROUTE_KAFKA_SOURCE,
CACHEROUTE_KAFKA_MIRROR, CACHEROUTE_KAFKA_HEAP and KAFKA_HOME (or CACHEROUTE_KAFKA_HOME); the
jar cache and broker state live under CACHEROUTE_HOME, as every process's local state does.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from cacheroute.errors import ConfigError
from cacheroute.settings import ENV_PREFIX, default_home

__all__ = ["KAFKA_SOURCES", "LocalBrokerSettings"]

KAFKA_SOURCES = ("auto", "maven", "tarball")


@dataclass(frozen=True, slots=True)
class LocalBrokerSettings:
    """How `cacheroute kafka start` (and the tests' broker) gets and runs Apache Kafka."""

    home: Path = field(default_factory=default_home)
    """Cache of broker jars and local broker state (data, logs, pid file): CACHEROUTE_HOME."""
    kafka_version: str = "4.1.1"
    """Apache Kafka version the local broker runs (fetched from Maven Central when not cached)."""
    kafka_home: Path | None = None
    """An unpacked Apache Kafka release to use instead of downloading (env: KAFKA_HOME)."""
    kafka_source: str = "auto"
    """Where to get the broker jars when not cached: auto, maven or tarball."""
    kafka_mirror: str = "https://archive.apache.org/dist/kafka"
    """Base URL of Apache Kafka release tarballs (source `tarball`)."""
    kafka_heap: str = "512m"
    """Java heap of the local broker."""

    def __post_init__(self) -> None:
        if self.kafka_source not in KAFKA_SOURCES:
            raise ConfigError(f"{ENV_PREFIX}KAFKA_SOURCE must be auto, maven or tarball")
        if not self.kafka_version or not self.kafka_heap:
            raise ConfigError(f"{ENV_PREFIX}KAFKA_VERSION and {ENV_PREFIX}KAFKA_HEAP must be set")

    @classmethod
    def from_env(
        cls, env: Mapping[str, str] | None = None, /, **overrides: str | Path | None
    ) -> LocalBrokerSettings:
        """Defaults < the variables < the non-None `overrides` (flags)."""
        env = os.environ if env is None else env
        values: dict[str, str | Path] = {}
        for name in ("kafka_version", "kafka_source", "kafka_mirror", "kafka_heap"):
            raw = env.get(ENV_PREFIX + name.upper())
            if raw:
                values[name] = raw
        for var, name in (("HOME", "home"), ("KAFKA_HOME", "kafka_home")):
            raw = env.get(ENV_PREFIX + var) or (
                env.get("KAFKA_HOME") if var == "KAFKA_HOME" else None
            )
            if raw:
                values[name] = Path(raw).expanduser()
        values.update({k: v for k, v in overrides.items() if v is not None})
        unknown = set(values) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ConfigError(f"unknown local broker settings: {', '.join(sorted(unknown))}")
        return cls(**values)  # type: ignore[arg-type]  # names checked above, str/Path by field
