"""The project's Kafka topics: what they must look like, and making the cluster match.

`topic_specs` is pure (settings in, specs out); `ensure_topics` is the adapter that talks to the
cluster. Existing topics keep their partition count (changing it would move keys between
partitions, breaking per-key ordering), but their configs are brought to the spec.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from confluent_kafka import KafkaException
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
    ResourceType,
)

from cacheroute.errors import CacheRouteError
from cacheroute.settings import Settings

__all__ = ["TopicOutcome", "TopicSpec", "describe_topic_configs", "ensure_topics", "topic_specs"]


@dataclass(frozen=True)
class TopicSpec:
    """A topic as CacheRoute needs it."""

    role: str
    name: str
    partitions: int
    config: dict[str, str]


@dataclass
class TopicOutcome:
    """What `ensure_topics` did to one topic."""

    spec: TopicSpec
    action: str  # "created", "updated" or "unchanged"
    partitions: int
    changes: dict[str, tuple[str | None, str]] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


def topic_specs(settings: Settings) -> list[TopicSpec]:
    """The four topics: requests, rates, plans (compacted) and the dead-letter topic."""
    names = settings.topics
    retained = {"cleanup.policy": "delete", "retention.ms": str(settings.retention_ms)}
    return [
        TopicSpec("requests", names["requests"], settings.requests_partitions, dict(retained)),
        TopicSpec("rates", names["rates"], settings.rates_partitions, dict(retained)),
        TopicSpec(
            "plans",
            names["plans"],
            1,  # one partition: a plan's header and chunks must be totally ordered
            {
                "cleanup.policy": "compact",
                "segment.ms": str(settings.plans_segment_ms),
                "min.cleanable.dirty.ratio": str(settings.plans_min_cleanable_dirty_ratio),
                "delete.retention.ms": str(settings.plans_delete_retention_ms),
                "min.compaction.lag.ms": "0",
            },
        ),
        TopicSpec(
            "dead_letter",
            names["dead_letter"],
            settings.dead_letter_partitions,
            dict(retained),
        ),
    ]


def make_admin(bootstrap: str) -> AdminClient:
    """An AdminClient that does not spam stderr while a broker is unreachable."""
    return AdminClient({"bootstrap.servers": bootstrap, "log_level": 3})


def describe_topic_configs(admin: AdminClient, names: list[str]) -> dict[str, dict[str, str]]:
    """Current config values of the named topics."""
    resources = [ConfigResource(ResourceType.TOPIC, n) for n in names]
    out: dict[str, dict[str, str]] = {}
    for res, fut in admin.describe_configs(resources).items():
        entries = fut.result(timeout=30)
        out[res.name] = {k: v.value for k, v in entries.items() if v.value is not None}
    return out


def ensure_topics(settings: Settings, *, timeout: float = 30.0) -> list[TopicOutcome]:
    """Create missing topics and align configs of existing ones; return what was done."""
    admin = make_admin(settings.bootstrap)
    specs = topic_specs(settings)
    try:
        meta = admin.list_topics(timeout=timeout)
    except KafkaException as exc:
        raise CacheRouteError(
            f"no Kafka broker answers at {settings.bootstrap} ({exc}). Start one with "
            "`cacheroute kafka start` or set CACHEROUTE_BOOTSTRAP",
            retriable=True,
        ) from exc
    existing = {name: len(t.partitions) for name, t in meta.topics.items()}
    outcomes: dict[str, TopicOutcome] = {}
    missing = [s for s in specs if s.name not in existing]
    if missing:
        futures = admin.create_topics(
            [
                NewTopic(s.name, s.partitions, replication_factor=-1, config=s.config)
                for s in missing
            ],
            operation_timeout=timeout,
        )
        for spec in missing:
            try:
                futures[spec.name].result(timeout=timeout)
            except KafkaException as exc:
                if "TOPIC_ALREADY_EXISTS" not in str(exc):
                    raise CacheRouteError(f"could not create topic {spec.name}: {exc}") from exc
            outcomes[spec.name] = TopicOutcome(spec, "created", spec.partitions)
        _wait_for_leaders(admin, [s.name for s in missing], timeout)

    present = [s for s in specs if s.name in existing]
    current = describe_topic_configs(admin, [s.name for s in present]) if present else {}
    for spec in present:
        outcome = TopicOutcome(spec, "unchanged", existing[spec.name])
        if existing[spec.name] != spec.partitions:
            outcome.warnings.append(
                f"{spec.name} has {existing[spec.name]} partitions, the settings say "
                f"{spec.partitions}; left as is (changing it moves keys between partitions)"
            )
        diff = {
            k: (current[spec.name].get(k), v)
            for k, v in spec.config.items()
            if current[spec.name].get(k) != v
        }
        if diff:
            resource = ConfigResource(
                ResourceType.TOPIC,
                spec.name,
                incremental_configs=[
                    ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET)
                    for k, (_, v) in diff.items()
                ],
            )
            for fut in admin.incremental_alter_configs([resource]).values():
                fut.result(timeout=timeout)
            _wait_for_configs(admin, spec.name, {k: v for k, (_, v) in diff.items()}, timeout)
            outcome.action = "updated"
            outcome.changes = diff
        outcomes[spec.name] = outcome
    return [outcomes[s.name] for s in specs]


def _wait_for_configs(
    admin: AdminClient, name: str, expected: dict[str, str], timeout: float
) -> None:
    """Block until a describe shows the altered configs: KRaft brokers apply them asynchronously,
    and a caller that reads them back right after `ensure` must see what it asked for."""
    deadline = time.monotonic() + timeout
    while True:
        now = describe_topic_configs(admin, [name]).get(name, {})
        if all(now.get(k) == v for k, v in expected.items()):
            return
        if time.monotonic() > deadline:
            raise CacheRouteError(
                f"topic {name}: configs {expected} were accepted but are still not in effect "
                f"after {timeout:g} s (now { ({k: now.get(k) for k in expected}) })",
                retriable=True,
            )
        time.sleep(0.1)


def _wait_for_leaders(admin: AdminClient, names: list[str], timeout: float) -> None:
    """Block until every partition of the new topics has a leader (producing works at once)."""
    deadline = time.monotonic() + timeout
    while True:
        meta = admin.list_topics(timeout=timeout)
        ready = all(
            n in meta.topics
            and meta.topics[n].error is None
            and meta.topics[n].partitions
            and all(p.leader >= 0 for p in meta.topics[n].partitions.values())
            for n in names
        )
        if ready:
            return
        if time.monotonic() > deadline:
            raise CacheRouteError(f"topics {names} have no partition leaders yet", retriable=True)
        time.sleep(0.1)
