"""One settings object for every CacheRoute process.

Values come from defaults, then `CACHEROUTE_*` environment variables, then CLI flags (highest).
It is a frozen dataclass passed to whatever needs it — no module globals — so tests build their own
(`Settings(topic_prefix="test-1234.")`) without touching the environment.

It carries the connection and the topics, nothing about the local development broker (its jars,
version and heap are `cacheroute.localkafka.settings.LocalBrokerSettings`).

The connection's security (SASL, TLS) is `kafka_security`, built by `cacheroute.kafkasecurity` from
the file `kafka_config` (`--kafka-config`, CACHEROUTE_KAFKA_CONFIG) and the CACHEROUTE_KAFKA_*
variables; when that file names `bootstrap.servers` and neither CACHEROUTE_BOOTSTRAP nor
`--bootstrap` is given, the file's address is used.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cacheroute.errors import ConfigError
from cacheroute.kafkasecurity import KafkaSecurity

__all__ = ["ENV_PREFIX", "MIN_INSYNC_REPLICATED", "Settings", "check_min_insync", "default_home"]

ENV_PREFIX = "CACHEROUTE_"

DAY_MS = 24 * 3600 * 1000

_NOT_FROM_ENV = frozenset({"kafka_security"})
"""Fields built from several variables (CACHEROUTE_KAFKA_*) instead of one CACHEROUTE_<NAME>."""


MIN_INSYNC_REPLICATED = 2
"""The fewest in-sync replicas `plans`, the other topics and the streams changelogs may run with
once they have three or more replicas: with 1, an acknowledged plan version or window state can
live on one broker only, and losing that broker loses it although every producer asked for
acks=all."""


def check_min_insync(replication_factor: int, min_insync_replicas: int) -> None:
    """Refuse a `min.insync.replicas` below 2 on topics with three or more replicas.

    Refused with the setting to change, not quietly raised: the operator asked for it, so the fix
    must be theirs to see. Called by `Settings.validate` (an explicit factor) and by
    `cacheroute.topics.replication_for` (an automatic factor, known once the cluster's size is).
    """
    if replication_factor >= 3 and 0 < min_insync_replicas < MIN_INSYNC_REPLICATED:
        raise ConfigError(
            f"{ENV_PREFIX}MIN_INSYNC_REPLICAS={min_insync_replicas} with {replication_factor} "
            f"replicas: plans and the streams changelogs must never run with fewer than "
            f"{MIN_INSYNC_REPLICATED} in sync (an acknowledged plan could live on one broker "
            f"only); unset it (automatic: {MIN_INSYNC_REPLICATED}) or set it to "
            f"{MIN_INSYNC_REPLICATED} or more (`topics ensure` flag: --min-insync-replicas)"
        )


def default_home() -> Path:
    """Where CacheRoute keeps downloaded broker jars and local broker state."""
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "cacheroute"


@dataclass(frozen=True)
class Settings:
    """Every knob that more than one component reads. Field `foo_bar` <- env `CACHEROUTE_FOO_BAR`."""

    bootstrap: str = "127.0.0.1:9092"
    """Kafka bootstrap address (host:port). The local broker listens exactly here."""

    topic_prefix: str = ""
    """Prepended to every topic name (tests use a unique prefix per run)."""
    requests_topic: str = "requests"
    rates_topic: str = "rates"
    plans_topic: str = "plans"
    dead_letter_topic: str = "dead-letter"

    requests_partitions: int = 8
    rates_partitions: int = 4
    dead_letter_partitions: int = 1
    retention_ms: int = DAY_MS
    """Retention of the delete-policy topics (requests, rates, dead-letter)."""
    plans_segment_ms: int = 60_000
    """Segment roll time of the compacted plans topic; only closed segments are compacted."""
    plans_min_cleanable_dirty_ratio: float = 0.01
    plans_delete_retention_ms: int = 3_600_000
    """How long tombstones stay readable on `plans` (a consumer slower than this may miss one)."""
    replication_factor: int = 0
    """Replicas per partition of new topics; 0: min(3, brokers in the cluster)."""
    min_insync_replicas: int = 0
    """`min.insync.replicas` of the topics and the streams changelogs; 0: 2 with three or more
    replicas, else 1. Below 2 with three or more replicas is refused (`check_min_insync`)."""

    home: Path = field(default_factory=default_home)
    """Local state of every process (streams tables, demo runs, the local broker's jars and data)."""
    kafka_config: Path | None = None
    """A Kafka client properties file or a `.toml` file with the connection's security settings
    (env CACHEROUTE_KAFKA_CONFIG, flag --kafka-config); see cacheroute.kafkasecurity."""
    kafka_security: KafkaSecurity = field(default_factory=KafkaSecurity)
    """How every client connects: protocol, SASL and TLS (PLAINTEXT unless configured)."""

    @property
    def topics(self) -> dict[str, str]:
        """Logical topic role -> actual topic name (prefix applied)."""
        return {
            "requests": self.topic_prefix + self.requests_topic,
            "rates": self.topic_prefix + self.rates_topic,
            "plans": self.topic_prefix + self.plans_topic,
            "dead_letter": self.topic_prefix + self.dead_letter_topic,
        }

    @property
    def host_port(self) -> tuple[str, int]:
        """The bootstrap address split into host and port (first address if several)."""
        first = self.bootstrap.split(",")[0].strip()
        host, sep, port = first.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ConfigError(
                f"bootstrap address {self.bootstrap!r} is not host:port "
                f"(set {ENV_PREFIX}BOOTSTRAP or --bootstrap, e.g. 127.0.0.1:9092)"
            )
        return host.strip("[]"), int(port)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Defaults, overridden by `CACHEROUTE_*` variables, overridden by non-None `overrides`."""
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            if f.name in _NOT_FROM_ENV:
                continue
            raw = env.get(ENV_PREFIX + f.name.upper())
            if raw is not None and raw != "":
                values[f.name] = _parse(f.name, f.type, raw)
        given = {k: v for k, v in overrides.items() if v is not None}
        if "kafka_security" not in given:
            config_file = given.get("kafka_config", values.get("kafka_config"))
            security, file_bootstrap = KafkaSecurity.load(env, config_file)
            values["kafka_security"] = security
            if file_bootstrap and "bootstrap" not in values:
                values["bootstrap"] = file_bootstrap
        values.update(given)
        unknown = set(values) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ConfigError(f"unknown settings: {', '.join(sorted(unknown))}")
        settings = cls(**values)
        settings.validate()
        return settings

    def validate(self) -> None:
        """Reject values that cannot work, naming the variable to fix."""
        self.host_port  # noqa: B018 - parses the address, raises ConfigError if malformed
        positive = (
            "requests_partitions",
            "rates_partitions",
            "dead_letter_partitions",
            "retention_ms",
            "plans_segment_ms",
        )
        for name in positive:
            if getattr(self, name) <= 0:
                raise ConfigError(f"{ENV_PREFIX}{name.upper()} must be positive")
        for name in ("replication_factor", "min_insync_replicas"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{ENV_PREFIX}{name.upper()} must be 0 (automatic) or positive")
        if self.replication_factor and self.min_insync_replicas > self.replication_factor:
            raise ConfigError(
                f"{ENV_PREFIX}MIN_INSYNC_REPLICAS ({self.min_insync_replicas}) exceeds "
                f"{ENV_PREFIX}REPLICATION_FACTOR ({self.replication_factor}): no write could succeed "
                "(`topics ensure` flags: --min-insync-replicas, --replication-factor)"
            )
        check_min_insync(self.replication_factor, self.min_insync_replicas)
        if not 0.0 < self.plans_min_cleanable_dirty_ratio <= 1.0:
            raise ConfigError(f"{ENV_PREFIX}PLANS_MIN_CLEANABLE_DIRTY_RATIO must be in (0, 1]")
        self.kafka_security.validate()

    def with_overrides(self, **overrides: Any) -> Settings:
        """A copy with the non-None overrides applied (used for CLI flags).

        A new `kafka_config` (without an explicit `kafka_security`) replaces the security with the
        file's alone: the environment is read only by `from_env`, so tests stay hermetic.
        """
        changed = {k: v for k, v in overrides.items() if v is not None}
        if "kafka_config" in changed and "kafka_security" not in changed:
            security, file_bootstrap = KafkaSecurity.load({}, changed["kafka_config"])
            changed["kafka_security"] = security
            if file_bootstrap and "bootstrap" not in changed:
                changed["bootstrap"] = file_bootstrap
        settings = dataclasses.replace(self, **changed) if changed else self
        settings.validate()
        return settings


def _parse(name: str, type_name: Any, raw: str) -> Any:
    """Parse one environment value by the field's annotation (annotations are strings here)."""
    kind = str(type_name)
    try:
        if kind == "int":
            return int(raw)
        if kind == "float":
            return float(raw)
        if "Path" in kind:
            return Path(raw).expanduser()
    except ValueError:
        raise ConfigError(f"{ENV_PREFIX}{name.upper()}={raw!r} is not a valid {kind}") from None
    return raw
