"""The Kafka ACLs a CacheRoute deployment needs: one least-privilege principal per role.

Roles and what each may do (nothing else; the broker denies what is not granted):
- gateway: write `requests` (the emitter); read `plans` (the dispatcher's follower, an assign-only
  reader that never commits but still names its group `cacheroute-plan-reader`).
- streams: read `requests`; write `rates` and the dead-letter topic; create, read and write its own
  Faust topics (table changelogs, the assignor's leader topic: all named `<app id>-...`); its
  consumer group is the app id.
- planner: read `rates` (assign-only group `cacheroute-planner-rates`); read and write `plans`
  transactionally (transactional id and leadership group `<topic prefix><group>`); read `plans`
  for recovery (`cacheroute-plan-reader`); write the dead-letter topic.
- admin: manage the topics (create, describe, alter configs) and read what `cacheroute doctor`
  reads (the topics, the streams group's offsets). On the local secure broker it is a super user.

`deployment_acls` is pure (settings in, rules out); `kafka_acls_commands` renders the rules as
`kafka-acls.sh` commands for operators who manage ACLs by hand; `apply_acls` creates them through
an AdminClient (idempotent: Kafka ignores an ACL that already exists).
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from cacheroute.errors import CacheRouteError
from cacheroute.settings import Settings

__all__ = [
    "DEFAULT_PRINCIPALS",
    "ROLES",
    "AclRule",
    "apply_acls",
    "deployment_acls",
    "kafka_acls_commands",
]

ROLES = ("gateway", "streams", "planner", "admin")
DEFAULT_PRINCIPALS: Mapping[str, str] = {role: f"User:{role}" for role in ROLES}

PLAN_READER_GROUP = "cacheroute-plan-reader"
PLANNER_RATES_GROUP = "cacheroute-planner-rates"
DOCTOR_GROUP = "cacheroute-doctor"


@dataclass(frozen=True, order=True)
class AclRule:
    """Allow `principal` to do `operation` on a resource (from any host)."""

    role: str
    principal: str
    resource: str  # "topic", "group", "transactional-id" or "cluster"
    name: str
    pattern: str  # "literal" or "prefixed"
    operation: str  # Kafka's names: READ, WRITE, DESCRIBE, CREATE, DESCRIBE_CONFIGS, ...


def deployment_acls(
    settings: Settings,
    *,
    principals: Mapping[str, str] | None = None,
    streams_app_id: str = "cacheroute-streams",
    planner_group: str = "cacheroute-planner",
) -> list[AclRule]:
    """Every ACL the four roles need for the topics of `settings` (prefix included)."""
    who = {**DEFAULT_PRINCIPALS, **(principals or {})}
    t = settings.topics
    planner_id = f"{settings.topic_prefix}{planner_group}"
    rules: list[AclRule] = []

    def allow(role: str, resource: str, name: str, *ops: str, pattern: str = "literal") -> None:
        rules.extend(AclRule(role, who[role], resource, name, pattern, op) for op in ops)

    allow("gateway", "topic", t["requests"], "WRITE", "DESCRIBE")
    allow("gateway", "topic", t["plans"], "READ", "DESCRIBE")
    allow("gateway", "group", PLAN_READER_GROUP, "READ")

    allow("streams", "topic", t["requests"], "READ", "DESCRIBE")
    allow("streams", "topic", t["rates"], "WRITE", "DESCRIBE")
    allow("streams", "topic", t["dead_letter"], "WRITE", "DESCRIBE")
    allow(
        "streams",
        "topic",
        f"{streams_app_id}-",
        "CREATE",
        "READ",
        "WRITE",
        "DESCRIBE",
        "DESCRIBE_CONFIGS",
        pattern="prefixed",
    )
    allow("streams", "group", streams_app_id, "READ")

    allow("planner", "topic", t["rates"], "READ", "DESCRIBE")
    allow("planner", "topic", t["plans"], "READ", "WRITE", "DESCRIBE")
    allow("planner", "topic", t["dead_letter"], "WRITE", "DESCRIBE")
    allow("planner", "group", planner_id, "READ")
    allow("planner", "group", PLANNER_RATES_GROUP, "READ")
    allow("planner", "group", PLAN_READER_GROUP, "READ")
    allow("planner", "transactional-id", planner_id, "WRITE", "DESCRIBE")

    for name in t.values():
        allow("admin", "topic", name, "CREATE", "DESCRIBE", "DESCRIBE_CONFIGS", "ALTER_CONFIGS")
        allow("admin", "topic", name, "READ")  # doctor reads plans and the dead letters
    allow("admin", "group", streams_app_id, "DESCRIBE")  # doctor: the streams group's lag
    allow("admin", "group", DOCTOR_GROUP, "READ")
    allow("admin", "group", PLAN_READER_GROUP, "READ")
    return rules


_RESOURCE_FLAG = {"topic": "--topic", "group": "--group", "transactional-id": "--transactional-id"}


def kafka_acls_commands(
    rules: Iterable[AclRule],
    *,
    bootstrap: str,
    command_config: str = "admin.properties",
    tool: str = "kafka-acls.sh",
) -> list[str]:
    """`kafka-acls.sh --add` commands that create `rules`, one per principal and resource."""
    grouped: dict[tuple[str, str, str, str, str], list[str]] = {}
    for r in rules:
        grouped.setdefault((r.role, r.principal, r.resource, r.name, r.pattern), []).append(
            r.operation
        )
    out = []
    for (_role, principal, resource, name, pattern), ops in grouped.items():
        argv = [
            tool,
            "--bootstrap-server",
            bootstrap,
            "--command-config",
            command_config,
            "--add",
            "--allow-principal",
            principal,
        ]
        for op in ops:
            argv += ["--operation", "".join(w.capitalize() for w in op.split("_"))]
        if resource == "cluster":
            argv.append("--cluster")
        else:
            argv += [_RESOURCE_FLAG[resource], name]
        if pattern != "literal":
            argv += ["--resource-pattern-type", pattern]
        out.append(shlex.join(argv))
    return out


def apply_acls(settings: Settings, rules: Iterable[AclRule], *, timeout: float = 30.0) -> int:
    """Create `rules` on the cluster of `settings` (run as a principal allowed to alter ACLs);
    return how many were sent."""
    from confluent_kafka import KafkaException  # noqa: PLC0415 - Kafka client only when used
    from confluent_kafka.admin import (  # noqa: PLC0415
        AclBinding,
        AclOperation,
        AclPermissionType,
        ResourcePatternType,
        ResourceType,
    )

    from cacheroute.kafkaio import connect_admin, explain_kafka_error  # noqa: PLC0415

    resource_type = {
        "topic": ResourceType.TOPIC,
        "group": ResourceType.GROUP,
        "transactional-id": ResourceType.TRANSACTIONAL_ID,
        "cluster": ResourceType.BROKER,
    }
    bindings = [
        AclBinding(
            resource_type[r.resource],
            "kafka-cluster" if r.resource == "cluster" else r.name,
            ResourcePatternType.PREFIXED
            if r.pattern == "prefixed"
            else ResourcePatternType.LITERAL,
            r.principal,
            "*",
            AclOperation[r.operation],
            AclPermissionType.ALLOW,
        )
        for r in sorted(set(rules))
    ]
    if not bindings:
        return 0
    admin = connect_admin(settings, timeout=timeout, doing="creating ACLs")
    for binding, future in admin.create_acls(bindings, request_timeout=timeout).items():
        try:
            future.result(timeout=timeout)
        except KafkaException as exc:
            _, why = explain_kafka_error(settings, exc, doing=f"creating the ACL {binding}")
            raise CacheRouteError(why) from None
    return len(bindings)
