"""The project's Kafka topics: what they must look like, and making the cluster match.

`topic_specs` is pure (settings and broker count in, specs out); `ensure_topics` is the adapter that
talks to the cluster. Existing topics keep their partition count (changing it would move keys between
partitions, breaking per-key ordering), but their configs are brought to the spec.

Replication follows the cluster unless set: replication factor min(3, brokers) and
`min.insync.replicas` 2 from three replicas on (1 below), so with acks=all (every CacheRoute
producer) an acknowledged record survives losing any one broker while writes go on; on the single
local broker both are 1, as before.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ClusterMetadata,
    ConfigEntry,
    ConfigResource,
    NewTopic,
    ResourceType,
)

from cacheroute.errors import CacheRouteError, ConfigError
from cacheroute.kafkaio import (
    KafkaConnectionError,
    admin_config,
    connect_admin,
    explain_kafka_error,
    is_authorization_error,
    kafka_error,
)
from cacheroute.settings import ENV_PREFIX, MIN_INSYNC_REPLICATED, Settings, check_min_insync

__all__ = [
    "TopicOutcome",
    "TopicSpec",
    "cluster_brokers",
    "cluster_size",
    "describe_topic_configs",
    "ensure_topics",
    "replication_for",
    "topic_specs",
]


@dataclass(frozen=True)
class TopicSpec:
    """A topic as CacheRoute needs it."""

    role: str
    name: str
    partitions: int
    config: dict[str, str]
    replication_factor: int = 1


@dataclass
class TopicOutcome:
    """What `ensure_topics` did to one topic."""

    spec: TopicSpec
    action: str  # "created", "updated" or "unchanged"
    partitions: int
    changes: dict[str, tuple[str | None, str]] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


def replication_for(settings: Settings, brokers: int) -> tuple[int, int]:
    """(replication factor, min.insync.replicas) of the topics on a cluster of `brokers`.

    A min.insync.replicas below 2 with three or more replicas is refused (ConfigError naming the
    setting), not quietly raised: the operator asked for it, so the fix must be theirs to see.
    So is one above the replication factor: Kafka accepts such a topic, then refuses every
    acks=all write to it.
    """
    rf = settings.replication_factor or max(1, min(3, brokers))
    min_isr = settings.min_insync_replicas or (MIN_INSYNC_REPLICATED if rf >= 3 else 1)
    if min_isr > rf:  # an explicit factor was checked by Settings.validate; this is the automatic
        raise ConfigError(
            f"{ENV_PREFIX}MIN_INSYNC_REPLICAS ({min_isr}) exceeds the replication factor ({rf}, "
            f"from the cluster's {brokers} broker(s)): no write could succeed; lower it, or set "
            f"{ENV_PREFIX}REPLICATION_FACTOR (`topics ensure` flags: --min-insync-replicas, "
            "--replication-factor)"
        )
    check_min_insync(rf, min_isr)
    return rf, min_isr


def cluster_size(meta: ClusterMetadata) -> int:
    """Brokers the topics are laid out for: those answering, or more if some topic (internal ones
    included) has more replicas — a broker that is down must not shrink the spec, or every topic
    would look drifted exactly while the cluster is degraded."""
    widest = max(
        (len(p.replicas) for t in meta.topics.values() for p in t.partitions.values()),
        default=0,
    )
    return max(len(meta.brokers), widest, 1)


def cluster_brokers(settings: Settings, *, timeout: float = 30.0, doing: str = "starting") -> int:
    """The cluster's size (`cluster_size`) as it answers now.

    For a service that creates topics of its own (the streams worker's changelog) and must
    replicate them like the project's. No answer within `timeout` is an error (one line, with
    the fix), not a guess: guessing 1 would create an unreplicated changelog on a replicated
    cluster, and Faust never fixes a topic once it exists.
    """
    try:
        admin = connect_admin(settings, timeout=timeout, doing=doing)
        return cluster_size(admin.list_topics(timeout=timeout))
    except KafkaConnectionError as exc:
        if exc.kind != "unreachable":
            raise
        raise CacheRouteError(
            f"{exc} (needed first to replicate the changelog like the topics; set "
            f"{ENV_PREFIX}REPLICATION_FACTOR to start without asking)",
            retriable=True,
        ) from None


def topic_specs(settings: Settings, brokers: int = 1) -> list[TopicSpec]:
    """The four topics: requests, rates, plans (compacted) and the dead-letter topic."""
    names = settings.topics
    rf, min_isr = replication_for(settings, brokers)
    retained = {
        "cleanup.policy": "delete",
        "retention.ms": str(settings.retention_ms),
        "min.insync.replicas": str(min_isr),
    }
    specs = [
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
                "min.insync.replicas": str(min_isr),
            },
        ),
        TopicSpec(
            "dead_letter",
            names["dead_letter"],
            settings.dead_letter_partitions,
            dict(retained),
        ),
    ]
    return [dataclasses.replace(spec, replication_factor=rf) for spec in specs]


def make_admin(settings: Settings | str) -> AdminClient:
    """An AdminClient with the deployment's connection security (SASL/TLS) that does not spam
    stderr while a broker is unreachable.

    Pass the Settings: a bare bootstrap address (still accepted for old callers and tests of the
    PLAINTEXT broker) connects without security, which a secured cluster refuses.
    """
    if isinstance(settings, str):
        return AdminClient({"bootstrap.servers": settings, "log_level": 3})
    return AdminClient(admin_config(settings))


def describe_topic_configs(
    admin: AdminClient, names: list[str], *, timeout: float = 30.0
) -> dict[str, dict[str, str]]:
    """Current config values of the named topics.

    Raises `TimeoutError` when no answer comes within `timeout` s: the request goes to one
    broker, which may be one that died and is not fenced yet. (librdkafka's own request timeout
    fires at about the same moment as ours and reports `_TIMED_OUT`: the same thing.)
    """
    resources = [ConfigResource(ResourceType.TOPIC, n) for n in names]
    out: dict[str, dict[str, str]] = {}
    for res, fut in admin.describe_configs(resources, request_timeout=timeout).items():
        try:
            entries = fut.result(timeout=timeout)
        except KafkaException as exc:
            kerr = kafka_error(exc)
            if kerr is not None and kerr.code() == KafkaError._TIMED_OUT:
                raise TimeoutError(f"no broker answered for the configs of {res.name}") from exc
            raise
        out[res.name] = {k: v.value for k, v in entries.items() if v.value is not None}
    return out


def ensure_topics(settings: Settings, *, timeout: float = 30.0) -> list[TopicOutcome]:
    """Create missing topics and align configs of existing ones; return what was done.

    A principal without the ACLs for this (only the admin role has them) gets one line that says
    so, not a traceback.
    """
    admin = connect_admin(settings, timeout=timeout, doing="managing topics")
    try:
        return _ensure(admin, settings, timeout)
    except KafkaException as exc:
        if not is_authorization_error(exc):
            raise
        _, why = explain_kafka_error(settings, exc, doing="managing topics")
        raise CacheRouteError(why) from None


def _ensure(admin: AdminClient, settings: Settings, timeout: float) -> list[TopicOutcome]:
    meta = admin.list_topics(timeout=timeout)
    brokers = len(meta.brokers)
    specs = topic_specs(settings, cluster_size(meta))
    rf = specs[0].replication_factor
    if rf > brokers and any(s.name not in meta.topics for s in specs):
        raise CacheRouteError(
            f"new topics need {rf} replicas but only {brokers} broker(s) answer at "
            f"{settings.bootstrap}: start the missing broker(s), or set "
            "CACHEROUTE_REPLICATION_FACTOR"
        )
    existing = {name: len(t.partitions) for name, t in meta.topics.items()}
    replicas = {
        name: min((len(p.replicas) for p in t.partitions.values()), default=0)
        for name, t in meta.topics.items()
    }
    outcomes: dict[str, TopicOutcome] = {}
    missing = [s for s in specs if s.name not in existing]
    if missing:
        futures = admin.create_topics(
            [
                NewTopic(
                    s.name, s.partitions, replication_factor=s.replication_factor, config=s.config
                )
                for s in missing
            ],
            operation_timeout=timeout,
        )
        for spec in missing:
            try:
                futures[spec.name].result(timeout=timeout)
            except KafkaException as exc:
                if is_authorization_error(exc):
                    _, why = explain_kafka_error(settings, exc, doing=f"creating {spec.name}")
                    raise CacheRouteError(why) from None
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
        if replicas.get(spec.name, rf) < spec.replication_factor:
            outcome.warnings.append(
                f"{spec.name} has {replicas[spec.name]} replica(s), the cluster calls for "
                f"{spec.replication_factor}; raise it with a partition reassignment "
                "(kafka-reassign-partitions.sh), ensure does not move data"
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
