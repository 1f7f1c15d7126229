"""`cacheroute doctor`: health checks of a CacheRoute deployment, each with what to do about it.

The checks are pure functions over plain values (`check_topics`, `check_plan`, `check_lag`,
`check_dlq`, `check_clocks`), so they are unit-tested without a broker; `run_doctor` is the adapter
that gathers those values from Kafka once (topic metadata and configs, one read of the plans topic,
the streams group's committed offsets, watermarks of the dead-letter topic and the headers of its
newest records) and returns a `DoctorReport`.

Gateway clocks are judged from the dead-letter topic because that is where the streams agent puts
the evidence: every future-dated or late record it drops carries `cacheroute.clock`,
`cacheroute.gateway` and `cacheroute.events` headers (streams/app.py). Reading them needs no
access to the workers, and names the gateway whatever worker saw it. The `gateway-clocks` finding
appears only when such records exist.

Exit codes (`DoctorReport.exit_code`): 0 all good, 1 problems found, 2 the broker is unreachable.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cacheroute.settings import Settings
from cacheroute.topics import TopicSpec

__all__ = [
    "DoctorOptions",
    "DoctorReport",
    "Finding",
    "GatewayClock",
    "PartitionReplicas",
    "check_access",
    "check_clocks",
    "check_dlq",
    "check_lag",
    "check_plan",
    "check_replication",
    "check_topics",
    "deny_topics",
    "run_doctor",
    "tally_clock_headers",
]

OK, WARN, FAIL = "ok", "warn", "fail"


@dataclass(frozen=True)
class Finding:
    """The outcome of one check: a status, a message, and what to do when it is not ok."""

    check: str
    status: str  # "ok", "warn" (informational, does not fail) or "fail"
    message: str
    fix: str = ""
    detail: Mapping[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """Whether this finding is not a problem."""
        return self.status != FAIL

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        return {
            "check": self.check,
            "status": self.status,
            "message": self.message,
            "fix": self.fix,
            "detail": dict(self.detail),
        }


@dataclass(frozen=True)
class DoctorReport:
    """Every finding of one doctor run."""

    bootstrap: str
    broker_reachable: bool
    findings: tuple[Finding, ...]

    @property
    def problems(self) -> tuple[Finding, ...]:
        """The failed findings."""
        return tuple(f for f in self.findings if not f.ok)

    @property
    def exit_code(self) -> int:
        """0 all good, 1 problems, 2 broker unreachable."""
        if not self.broker_reachable:
            return 2
        return 1 if self.problems else 0

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        return {
            "bootstrap": self.bootstrap,
            "broker_reachable": self.broker_reachable,
            "ok": self.exit_code == 0,
            "exit_code": self.exit_code,
            "findings": [f.to_dict() for f in self.findings],
        }


@dataclass(frozen=True)
class DoctorOptions:
    """Thresholds of the checks."""

    streams_group: str = "cacheroute-streams"
    max_plan_age_s: float | None = None
    """None: 3 control intervals of the live plan (the dispatcher's staleness limit)."""
    staleness_intervals: float = 3.0
    max_lag: int = 100_000
    """Records of `requests` not yet processed by the streams group before it is a problem."""
    dlq_window_min: float | None = None
    """Also count dead letters of the last N minutes (None: only the total)."""
    max_dlq_recent: int = 0
    """Dead letters allowed in that window before it is a problem."""
    dlq_scan_max: int = 10_000
    """Newest dead letters read per partition (within `dlq_window_min`, if given) for the
    `gateway-clocks` check: bounds the time doctor spends on a large DLQ."""
    timeout_s: float = 10.0


# ------------------------------------------------------------------------------ pure checks
def check_broker(
    bootstrap: str, error: str | None, *, security: Mapping[str, Any] | None = None
) -> Finding:
    """Whether the broker answered a metadata request (`security`: the redacted connection
    summary, `KafkaSecurity.describe()`, kept in the detail so `--json` says how doctor connected)."""
    if error is None:
        detail = {"security": dict(security)} if security else {}
        return Finding("broker", OK, f"broker answers at {bootstrap}", "", detail)
    return Finding(
        "broker",
        FAIL,
        f"no Kafka broker answers at {bootstrap}: {error}",
        "start it (`cacheroute kafka start` for the local broker) or point --bootstrap / "
        "CACHEROUTE_BOOTSTRAP at a running one; gateways keep routing on their last plan meanwhile",
    )


def check_access(kind: str, message: str, principal: str | None) -> Finding:
    """A connection refused for who we are, not for where we are: authentication (wrong user,
    password or mechanism), TLS (untrusted certificate, hostname) or authorization (no ACL).

    `message` is `explain_kafka_error`'s line; it never holds a secret.
    """
    fixes = {
        "authentication": "check the username/password and SASL mechanism the doctor runs with "
        "(--kafka-config FILE, CACHEROUTE_KAFKA_USERNAME/PASSWORD); the broker logs a failed SCRAM "
        "login with the client's address only, so compare the user with `kafka-configs "
        "--describe --entity-type users` on the cluster",
        "tls": "check CACHEROUTE_KAFKA_SSL_CA_FILE (the CA that signed the broker's certificate) "
        "and that the certificate names the address in --bootstrap",
        "authorization": "run the doctor with credentials that may describe the topics and groups "
        "(the admin role), or grant the ACLs `cacheroute topics acls` prints",
    }
    return Finding(
        "kafka-" + kind,
        FAIL,
        message,
        fixes.get(kind, "check the connection settings"),
        {"principal": principal},
    )


def deny_topics(
    findings: Sequence[Finding],
    specs: Sequence[TopicSpec],
    denied: Iterable[str],
    principal: str | None,
) -> list[Finding]:
    """Replace "topic does not exist" by "not authorized" for the topics the broker hid from us:
    Kafka lists only the topics a principal may describe, so without this an ACL problem would
    read as a missing topic (and `topics ensure` would be the wrong advice)."""
    hidden = {s.name: s.role for s in specs if s.name in set(denied)}
    out: list[Finding] = []
    for f in findings:
        role = next((r for n, r in hidden.items() if f.check == f"topic:{r}"), None)
        if role is None:
            out.append(f)
            continue
        name = next(n for n, r in hidden.items() if r == role)
        out.append(
            Finding(
                f.check,
                FAIL,
                f"not authorized to describe topic {name} as {principal or 'this principal'} "
                "(Kafka hides topics a principal may not describe)",
                "run the doctor with the admin credentials (--kafka-config admin.properties), or "
                "grant DESCRIBE on the topic (`cacheroute topics acls`)",
                {"authorized": False},
            )
        )
    return out


@dataclass(frozen=True)
class PartitionReplicas:
    """Who holds one partition: its leader (-1: none), assigned replicas and in-sync replicas."""

    leader: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]


def check_replication(
    state: Mapping[str, Mapping[int, PartitionReplicas]],
    min_insync: Mapping[str, int],
    *,
    want_replicas: int = 1,
    show: int = 6,
) -> Finding:
    """Partitions without a leader, below `min.insync.replicas` or under-replicated.

    Under-replicated (fewer in-sync replicas than assigned) still takes writes, but one more broker
    loss away from refusing them; below min.insync.replicas, producers with acks=all (all of
    CacheRoute's) are refused already; without a leader nothing is read or written.
    """
    offline: list[str] = []
    below: list[str] = []
    under: list[str] = []
    thin: list[str] = []
    total = 0
    for topic, parts in sorted(state.items()):
        for p, r in sorted(parts.items()):
            total += 1
            where = f"{topic}[{p}]"
            missing = sorted(set(r.replicas) - set(r.isr))
            if r.leader < 0:
                offline.append(where)
            elif len(r.isr) < min_insync.get(topic, 1):
                below.append(
                    f"{where} (in sync {len(r.isr)}/{len(r.replicas)}, needs "
                    f"{min_insync.get(topic, 1)})"
                )
            elif missing:
                under.append(
                    f"{where} (in sync {len(r.isr)}/{len(r.replicas)}, lagging or down: "
                    f"broker {', '.join(map(str, missing))})"
                )
            if len(r.replicas) < want_replicas:
                thin.append(where)

    def listing(items: list[str]) -> str:
        more = f" and {len(items) - show} more" if len(items) > show else ""
        return ", ".join(items[:show]) + more

    detail = {
        "partitions": total,
        "offline": offline,
        "below_min_insync": below,
        "under_replicated": under,
        "fewer_replicas_than_wanted": thin,
    }
    problems = []
    if offline:
        problems.append(
            f"{len(offline)} partition(s) without a leader: {listing(offline)} — "
            "nothing is read or written there"
        )
    if below:
        problems.append(
            f"{len(below)} partition(s) below min.insync.replicas: {listing(below)} — "
            "writes (acks=all) are refused"
        )
    if under:
        problems.append(
            f"{len(under)} under-replicated partition(s): {listing(under)} — writes go "
            "on, but one more broker loss can stop them"
        )
    if problems:
        return Finding(
            "replication",
            FAIL,
            "; ".join(problems),
            "bring the named broker(s) back (`cacheroute kafka status`, the broker's log); "
            "replicas catch up by themselves once it runs. A broker gone for good needs its "
            "partitions reassigned (kafka-reassign-partitions.sh)",
            detail,
        )
    if thin:
        return Finding(
            "replication",
            WARN,
            f"{len(thin)} partition(s) have fewer than {want_replicas} replicas: {listing(thin)}",
            "raise their replication factor with a partition reassignment",
            detail,
        )
    return Finding("replication", OK, f"all {total} partitions fully replicated", "", detail)


def check_topics(
    specs: Sequence[TopicSpec],
    partitions: Mapping[str, int],
    configs: Mapping[str, Mapping[str, str]],
) -> list[Finding]:
    """One finding per topic: exists, partition count as configured, configs as specified."""
    out: list[Finding] = []
    for spec in specs:
        check = f"topic:{spec.role}"
        if spec.name not in partitions:
            out.append(
                Finding(
                    check,
                    FAIL,
                    f"topic {spec.name} does not exist",
                    "run `cacheroute topics ensure`",
                )
            )
            continue
        problems: list[str] = []
        fixes: list[str] = []
        have = partitions[spec.name]
        if have != spec.partitions:
            problems.append(f"{have} partitions, the settings say {spec.partitions}")
            fixes.append(
                "align the partition setting (CACHEROUTE_*_PARTITIONS) with the topic; changing "
                "a live topic's partitions moves keys between partitions, so recreate it only "
                "during a planned restart"
            )
        current = configs.get(spec.name, {})
        drift = {k: (current.get(k), v) for k, v in spec.config.items() if current.get(k) != v}
        if drift:
            problems.append(
                "config drift: "
                + ", ".join(f"{k}={old} (want {new})" for k, (old, new) in sorted(drift.items()))
            )
            fixes.append("run `cacheroute topics ensure` to set the configs back")
        detail = {"partitions": have, "drift": {k: list(v) for k, v in drift.items()}}
        if problems:
            out.append(
                Finding(
                    check, FAIL, f"{spec.name}: " + "; ".join(problems), "; ".join(fixes), detail
                )
            )
        else:
            out.append(
                Finding(
                    check, OK, f"{spec.name}: {have} partitions, configs as specified", "", detail
                )
            )
    return out


def check_plan(
    *,
    version: int | None,
    created_ms: int | None,
    control_interval_s: float | None,
    now_ms: int,
    max_age_s: float | None = None,
    staleness_intervals: float = 3.0,
    rejected: int = 0,
    topic: str = "plans",
    max_clock_skew_s: float = 5.0,
) -> Finding:
    """Is there a complete plan, and is it younger than the limit (default: the staleness rule).

    A plan created more than `max_clock_skew_s` in the future is a failure too: gateways treat it
    as stale (the dispatcher's rule), and a negative age would otherwise pass as fresh forever.
    """
    if version is None or created_ms is None:
        return Finding(
            "plan",
            FAIL,
            f"no complete plan version on {topic}; gateways route everything by "
            "power-of-two-choices",
            "start the planner (`cacheroute planner run --destinations N --q-cap Q --warm-slots W`)"
            " and check that the streams agent feeds `rates`",
            {"rejected": rejected},
        )
    age = (now_ms - created_ms) / 1000.0
    interval = control_interval_s if control_interval_s and control_interval_s > 0 else 60.0
    limit = max_age_s if max_age_s is not None else staleness_intervals * interval
    detail = {
        "version": version,
        "age_s": round(age, 3),
        "max_age_s": limit,
        "control_interval_s": interval,
        "rejected": rejected,
    }
    if age < -max_clock_skew_s:
        return Finding(
            "plan",
            FAIL,
            f"plan v{version} was created {-age:.0f} s in the future of this host's clock (more "
            f"than the {max_clock_skew_s:g} s allowed for clock skew); gateways treat it as stale "
            "and route everything by the cold path",
            "check the clock (NTP/chrony) of the planner's host and of this one; an active "
            "planner re-publishes such a plan with its own time at its next interval",
            detail,
        )
    if age > limit:
        return Finding(
            "plan",
            FAIL,
            f"plan v{version} is {age:.0f} s old (limit {limit:.0f} s); gateways fall back to "
            "power-of-two-choices once it is older than 3 control intervals",
            "check that a planner is active (`cacheroute_planner_active` = 1 on one instance; its "
            "log says why it skips publishing: `cacheroute_planner_publish_skips_total`) and that "
            "`rates` receives new windows (streams agent running, consumer lag small)",
            detail,
        )
    msg = f"plan v{version} is {age:.0f} s old (limit {limit:.0f} s)"
    if rejected:
        return Finding(
            "plan",
            WARN,
            msg + f"; {rejected} version(s) on the topic were rejected (incomplete or corrupt)",
            "see `cacheroute plan show` and the planner log",
            detail,
        )
    return Finding("plan", OK, msg, "", detail)


def check_lag(
    group: str,
    topic: str,
    committed: Mapping[int, int | None],
    low: Mapping[int, int],
    high: Mapping[int, int],
    *,
    max_lag: int,
) -> Finding:
    """Consumer lag of `group` on `topic`: per partition high watermark minus committed offset.

    A partition without a committed offset counts from its low watermark (everything unread).
    """
    lags: dict[int, int] = {}
    for p, hi in high.items():
        c = committed.get(p)
        start = c if c is not None and c >= 0 else low.get(p, 0)
        lags[p] = max(0, hi - start)
    total = sum(lags.values())
    never = sorted(p for p in high if committed.get(p) is None or (committed.get(p) or 0) < 0)
    by_partition = {str(p): lag for p, lag in lags.items()}
    detail = {"total": total, "by_partition": by_partition, "uncommitted_partitions": never}
    if all(committed.get(p) is None for p in high) and total > 0:
        return Finding(
            "streams-lag",
            FAIL,
            f"consumer group {group} has committed nothing on {topic} ({total} records waiting)",
            "start the streams agent (`cacheroute streams run`); if it runs under another "
            "--app-id, pass that as --streams-group",
            detail,
        )
    if total > max_lag:
        worst = max(lags, key=lambda p: lags[p])
        return Finding(
            "streams-lag",
            FAIL,
            f"streams group {group} lags {total} records on {topic} (limit {max_lag}; worst "
            f"partition {worst}: {lags[worst]})",
            "check that the streams workers are alive (`cacheroute_streams_batches_total` grows) "
            "and add workers with the same --app-id (at most one per partition of requests)",
            detail,
        )
    return Finding(
        "streams-lag", OK, f"streams group {group} lags {total} records on {topic}", "", detail
    )


def check_dlq(
    topic: str,
    total: int,
    *,
    recent: int | None = None,
    window_min: float | None = None,
    max_recent: int = 0,
) -> Finding:
    """Dead letters in total (informational) and in the last `window_min` minutes (a problem
    above `max_recent`)."""
    detail: dict[str, Any] = {"total": total, "recent": recent, "window_min": window_min}
    fix = (
        "read them with the `cacheroute.reason` header (e.g. `kcat -C -t <dead-letter> -f "
        "'%h %s\\n'`); fix the gateway that sends them (its emitter version, clock or limits)"
    )
    if recent is not None and window_min is not None:
        if recent > max_recent:
            return Finding(
                "dead-letter",
                FAIL,
                f"{recent} dead letters on {topic} in the last {window_min:g} min ({total} in "
                "total)",
                fix,
                detail,
            )
        return Finding(
            "dead-letter",
            OK,
            f"{recent} dead letters on {topic} in the last {window_min:g} min ({total} in total)",
            "",
            detail,
        )
    if total:
        return Finding(
            "dead-letter",
            WARN,
            f"{total} records on {topic} (pass --dlq-window-min N to judge recent growth)",
            fix,
            detail,
        )
    return Finding("dead-letter", OK, f"{topic} is empty", "", detail)


@dataclass
class GatewayClock:
    """What the dead letters say about one gateway's clock."""

    ahead_events: int = 0
    """Events dead-lettered as dated ahead of their record's trusted clock."""
    ahead_empty: int = 0
    """Empty batches (heartbeats) dead-lettered as future-dated: only their clock was wrong."""
    max_ahead_ms: int = 0
    late_events: int = 0
    """Events that arrived after their window had closed."""
    max_behind_ms: int = 0

    @property
    def events(self) -> int:
        """Every event (and empty batch) this gateway lost to its clock."""
        return self.ahead_events + self.ahead_empty + self.late_events


def tally_clock_headers(
    records: Iterable[Sequence[tuple[str, bytes | None]]],
) -> dict[str, GatewayClock]:
    """Per gateway, the clock evidence in dead-letter records' headers (others are skipped)."""
    out: dict[str, GatewayClock] = {}
    for headers in records:
        h = {k: v for k, v in headers if v is not None}
        kind, gateway = h.get("cacheroute.clock"), h.get("cacheroute.gateway")
        if kind not in (b"ahead", b"late") or gateway is None:
            continue
        try:
            events = int(h.get("cacheroute.events", b"1"))
            skew = int(h.get("cacheroute.skew_ms", b"0"))
        except ValueError:
            events, skew = 1, 0
        g = out.setdefault(gateway.decode(errors="replace"), GatewayClock())
        if kind == b"ahead":
            if events:
                g.ahead_events += events
            else:
                g.ahead_empty += 1
            g.max_ahead_ms = max(g.max_ahead_ms, skew)
        else:
            g.late_events += events
            g.max_behind_ms = max(g.max_behind_ms, skew)
    return out


def check_clocks(
    gateways: Mapping[str, GatewayClock],
    *,
    topic: str = "dead-letter",
    window_min: float | None = None,
    show: int = 5,
) -> Finding:
    """Name the gateways whose clocks cost events: future-dated or late dead letters.

    A problem (fail) when the dead letters are from the last `window_min` minutes; without a
    window they may be old and already fixed, so only a warning — as for `check_dlq`.
    """
    where = f"on {topic}" + (f" in the last {window_min:g} min" if window_min is not None else "")
    if not gateways:
        return Finding("gateway-clocks", OK, f"no future-dated or late dead letters {where}")
    ranked = sorted(gateways.items(), key=lambda kv: (-kv[1].events, kv[0]))
    parts = []
    for name, g in ranked[:show]:
        said = []
        if g.ahead_events or g.ahead_empty:
            what = [f"{g.ahead_events} future-dated event(s)"] if g.ahead_events else []
            what += [f"{g.ahead_empty} future-dated empty batch(es)"] if g.ahead_empty else []
            said.append(" and ".join(what) + f" (up to {_seconds(g.max_ahead_ms)} ahead)")
        if g.late_events:
            said.append(
                f"{g.late_events} late event(s) (up to {_seconds(g.max_behind_ms)} behind the "
                "watermark)"
            )
        parts.append(f"{name}: " + ", ".join(said))
    more = len(ranked) - show
    message = (
        f"{len(ranked)} gateway(s) with clock trouble {where}: "
        + "; ".join(parts)
        + (f"; and {more} more" if more > 0 else "")
    )
    fix = (
        "check the clock (NTP/chrony) of the named gateways' hosts. Future-dated records are "
        "dead-lettered and never move the streams watermark; late events come from a clock "
        "behind or from delivery slower than `cacheroute streams run --grace-ms` (raise it if "
        "the clock is right). Both kinds are on the DLQ with `cacheroute.gateway` and "
        "`cacheroute.clock` headers"
    )
    detail = {
        "window_min": window_min,
        "gateways": {
            name: {
                "ahead_events": g.ahead_events,
                "ahead_empty_batches": g.ahead_empty,
                "max_ahead_ms": g.max_ahead_ms,
                "late_events": g.late_events,
                "max_behind_ms": g.max_behind_ms,
            }
            for name, g in ranked
        },
    }
    return Finding("gateway-clocks", FAIL if window_min is not None else WARN, message, fix, detail)


def _seconds(ms: int) -> str:
    s = ms / 1000
    return f"{s:.3g} s" if s >= 1e5 else f"{s:.1f} s"


# --------------------------------------------------------------------------------- adapter
def run_doctor(settings: Settings, options: DoctorOptions | None = None) -> DoctorReport:
    """Run every check against the broker of `settings`."""
    from confluent_kafka import (  # noqa: PLC0415 - Kafka client only when run
        Consumer,
        KafkaException,
    )

    from cacheroute.kafkaio import (  # noqa: PLC0415
        KafkaConnectionError,
        QuietLog,
        connect_admin,
        consumer_config,
    )

    opts = options or DoctorOptions()
    principal = settings.kafka_security.principal
    try:
        admin = connect_admin(settings, timeout=opts.timeout_s, doing="running the doctor checks")
    except KafkaConnectionError as exc:
        if exc.kind in ("authentication", "tls", "authorization"):
            finding = check_access(exc.kind, str(exc), principal)
            return DoctorReport(settings.bootstrap, True, (finding,))
        return DoctorReport(
            settings.bootstrap, False, (check_broker(settings.bootstrap, exc.detail),)
        )
    findings = [check_broker(settings.bootstrap, None, security=settings.kafka_security.describe())]
    partitions = _topic_findings(settings, admin, opts, findings)

    plans = settings.topics["plans"]
    if plans in partitions:
        findings.append(_plan_finding(settings, opts))

    consumer = Consumer(consumer_config(settings, group_id="cacheroute-doctor", logger=QuietLog()))
    try:
        requests = settings.topics["requests"]
        try:
            findings += _lag_findings(settings, consumer, partitions, opts)
        except KafkaException as exc:  # e.g. a leader election in progress: say so, never crash
            findings.append(_unreadable("streams-lag", requests, settings, exc))
        dlq = settings.topics["dead_letter"]
        if dlq in partitions:
            try:
                findings += _dlq_findings(consumer, dlq, partitions[dlq], opts)
            except KafkaException as exc:
                findings.append(_unreadable("dead-letter", dlq, settings, exc))
    finally:
        consumer.close()
    return DoctorReport(settings.bootstrap, True, tuple(findings))


def _unreadable(check: str, topic: str, settings: Settings, exc: Exception) -> Finding:
    from cacheroute.kafkaio import explain_kafka_error  # noqa: PLC0415

    return Finding(
        check,
        FAIL,
        f"could not read {topic}: {explain_kafka_error(settings, exc, doing=f'reading {topic}')[1]}",
        "run the doctor again in a minute (a broker may be electing leaders); if it persists, "
        "check the brokers' logs and `cacheroute topics ensure`",
    )


def _lag_findings(
    settings: Settings,
    consumer: Any,
    partitions: Mapping[str, int],
    opts: DoctorOptions,
) -> list[Finding]:
    """The streams group's lag on the requests topic (none if the topic is missing)."""
    from confluent_kafka import (  # noqa: PLC0415
        KafkaException,
        TopicPartition,
    )

    from cacheroute.kafkaio import explain_kafka_error, is_authorization_error  # noqa: PLC0415

    principal = settings.kafka_security.principal
    findings: list[Finding] = []
    requests = settings.topics["requests"]
    if requests not in partitions:
        return findings
    tps = [TopicPartition(requests, p) for p in range(partitions[requests])]
    low: dict[int, int] = {}
    high: dict[int, int] = {}
    for tp in tps:
        lo, hi = consumer.get_watermark_offsets(tp, timeout=opts.timeout_s)
        low[tp.partition], high[tp.partition] = lo, hi
    committed: dict[int, int | None] = {}
    denied = False
    try:
        for tp in _committed(settings, opts.streams_group, tps, opts.timeout_s):
            committed[tp.partition] = tp.offset if tp.offset >= 0 else None
    except KafkaException as exc:
        committed = {}
        if is_authorization_error(exc):
            denied = True  # the lag is unknown, not zero: no streams-lag finding
            findings.append(
                check_access(
                    "authorization",
                    explain_kafka_error(settings, exc, doing=f"reading group {opts.streams_group}")[
                        1
                    ],
                    principal,
                )
            )
    if not denied:
        findings.append(
            check_lag(opts.streams_group, requests, committed, low, high, max_lag=opts.max_lag)
        )
    return findings


def _committed(settings: Settings, group: str, tps: list[Any], timeout: float) -> list[Any]:
    """The offsets `group` has committed on `tps`, read by a consumer of that group that never
    joins it (no subscribe, no assignment, no auto-commit: the group does not see it).

    Why not `AdminClient.list_consumer_group_offsets`: librdkafka (2.16 here, and upstream as of
    this writing: confluentinc/librdkafka#5040) dereferences a NULL group handle when the
    coordinator answers NOT_COORDINATOR to an admin client's OffsetFetch, which a freshly started
    or failing-over cluster does. The doctor died by SIGSEGV there (core dump: rd_kafka_cgrp_op
    <- rd_kafka_handle_OffsetFetch <- ListConsumerGroupOffsetsResponse_parse), in about one
    run in ten right after `kafka start --brokers 3`. A consumer has a group handle, so the same
    answer is retried instead.
    """
    from confluent_kafka import Consumer, KafkaException  # noqa: PLC0415

    from cacheroute.kafkaio import QuietLog, consumer_config  # noqa: PLC0415

    reader = Consumer(consumer_config(settings, group_id=group, logger=QuietLog()))
    try:
        result = list(reader.committed(tps, timeout=timeout))
    finally:
        reader.close()
    for tp in result:  # a partition's error (say, not authorized) is the call's, as the admin's was
        if tp.error is not None:
            raise KafkaException(tp.error)
    return result


def _topic_findings(
    settings: Settings, admin: Any, opts: DoctorOptions, findings: list[Finding]
) -> dict[str, int]:
    """Append the topic findings (existence, partitions, configs, access); return the partition
    count of every topic the principal can see."""
    from confluent_kafka import KafkaException  # noqa: PLC0415

    from cacheroute.kafkaio import explain_kafka_error, is_authorization_error  # noqa: PLC0415
    from cacheroute.topics import (  # noqa: PLC0415
        cluster_size,
        describe_topic_configs,
        topic_specs,
    )

    principal = settings.kafka_security.principal
    meta = admin.list_topics(timeout=opts.timeout_s)
    specs = topic_specs(settings, cluster_size(meta))
    partitions = {n: len(t.partitions) for n, t in meta.topics.items() if t.error is None}
    present = [s.name for s in specs if s.name in partitions]
    readable = True
    unreadable_fix = "run the doctor with the admin credentials to check the configs"
    try:
        configs = describe_topic_configs(admin, present, timeout=opts.timeout_s) if present else {}
    except (KafkaException, TimeoutError) as exc:
        # never a traceback: a broker that died and is not fenced yet can swallow the request
        readable = False
        configs = {s.name: dict(s.config) for s in specs if s.name in partitions}
        if isinstance(exc, KafkaException) and is_authorization_error(exc):
            findings.append(
                check_access(
                    "authorization",
                    explain_kafka_error(settings, exc, doing="describing topic configs")[1],
                    principal,
                )
            )
        else:
            unreadable_fix = "run the doctor again in a minute (a broker may be down or electing)"
            findings.append(_unreadable("topic-configs", "the topic configs", settings, exc))
    missing = [s.name for s in specs if s.name not in partitions]
    denied = (
        _denied_topics(admin, missing, opts.timeout_s) if settings.kafka_security.uses_sasl else []
    )
    checked = check_topics(specs, partitions, configs)
    if not readable:  # the configs were not judged: say so instead of "as specified"
        checked = [
            Finding(
                f.check,
                WARN,
                f.message.replace(
                    "configs as specified", "configs not readable by " + str(principal)
                ),
                unreadable_fix,
                f.detail,
            )
            if f.status == OK
            else f
            for f in checked
        ]
    findings += deny_topics(checked, specs, denied, principal)
    state = {
        s.name: {
            p: PartitionReplicas(pm.leader, tuple(pm.replicas), tuple(pm.isrs))
            for p, pm in meta.topics[s.name].partitions.items()
        }
        for s in specs
        if s.name in partitions
    }
    if state:
        min_insync = {
            name: int(configs.get(name, {}).get("min.insync.replicas", "1")) for name in state
        }
        findings.append(
            check_replication(state, min_insync, want_replicas=specs[0].replication_factor)
        )
    return partitions


def _denied_topics(admin: Any, names: Sequence[str], timeout: float) -> list[str]:
    """Those of `names` the broker says we may not describe (asked one by one: a listing of all
    topics just leaves them out)."""
    from confluent_kafka import KafkaError, KafkaException  # noqa: PLC0415

    denied = []
    for name in names:
        try:
            meta = admin.list_topics(topic=name, timeout=timeout).topics.get(name)
        except KafkaException:
            continue
        error = None if meta is None else meta.error
        if error is not None and error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
            denied.append(name)
    return denied


def _plan_finding(settings: Settings, opts: DoctorOptions) -> Finding:
    """Read the plans topic once and judge its live version."""
    from cacheroute.dispatcher.reader import read_plan_history  # noqa: PLC0415
    from cacheroute.errors import CacheRouteError  # noqa: PLC0415

    plans = settings.topics["plans"]
    try:
        history = read_plan_history(
            settings, keep=lambda _v: False, timeout=max(opts.timeout_s, 30.0)
        )
    except CacheRouteError as exc:
        return Finding("plan", FAIL, f"could not read {plans}: {exc}", "check the broker and topic")
    live = history.live
    return check_plan(
        version=None if live is None else live.version,
        created_ms=None if live is None else live.plan.created_ms,
        control_interval_s=None if live is None else live.header.params.control_interval_s,
        now_ms=time.time_ns() // 1_000_000,
        max_age_s=opts.max_plan_age_s,
        staleness_intervals=opts.staleness_intervals,
        rejected=len(history.rejected),
        topic=plans,
    )


def _dlq_findings(consumer: Any, dlq: str, n_partitions: int, opts: DoctorOptions) -> list[Finding]:
    """Count dead letters (all retained, and those of the last `opts.dlq_window_min` minutes);
    read the newest ones' headers for gateways with clock trouble."""
    from confluent_kafka import TopicPartition  # noqa: PLC0415

    total = 0
    recent: int | None = None
    highs: dict[int, int] = {}
    starts: dict[int, int] = {}
    for p in range(n_partitions):
        lo, hi = consumer.get_watermark_offsets(TopicPartition(dlq, p), timeout=opts.timeout_s)
        total += hi - lo
        highs[p] = hi
        starts[p] = max(lo, hi - opts.dlq_scan_max)
    if opts.dlq_window_min is not None:
        since = time.time_ns() // 1_000_000 - int(opts.dlq_window_min * 60_000)
        found = consumer.offsets_for_times(
            [TopicPartition(dlq, p, since) for p in highs], timeout=opts.timeout_s
        )
        recent = sum(highs[tp.partition] - tp.offset if tp.offset >= 0 else 0 for tp in found)
        for tp in found:
            starts[tp.partition] = max(
                starts[tp.partition], tp.offset if tp.offset >= 0 else highs[tp.partition]
            )
    findings = [
        check_dlq(
            dlq,
            total,
            recent=recent,
            window_min=opts.dlq_window_min,
            max_recent=opts.max_dlq_recent,
        )
    ]
    gateways = tally_clock_headers(_read_headers(consumer, dlq, starts, highs, opts.timeout_s))
    if gateways:
        findings.append(check_clocks(gateways, topic=dlq, window_min=opts.dlq_window_min))
    return findings


def _read_headers(
    consumer: Any, topic: str, starts: Mapping[int, int], highs: Mapping[int, int], timeout: float
) -> list[list[tuple[str, bytes | None]]]:
    """Headers of the records of `topic` in [start, high) per partition (values are ignored)."""
    from confluent_kafka import KafkaError, TopicPartition  # noqa: PLC0415

    todo = {p for p, start in starts.items() if start < highs[p]}
    if not todo:
        return []
    out: list[list[tuple[str, bytes | None]]] = []
    consumer.assign([TopicPartition(topic, p, starts[p]) for p in sorted(todo)])
    deadline = time.monotonic() + timeout
    try:
        while todo and time.monotonic() < deadline:
            for msg in consumer.consume(num_messages=1000, timeout=0.5):
                err = msg.error()
                p = msg.partition()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        todo.discard(p)
                    continue
                if p not in todo:
                    continue
                raw = msg.headers() or []
                out.append(list(raw.items()) if isinstance(raw, dict) else list(raw))
                if msg.offset() >= highs[p] - 1:
                    todo.discard(p)
    finally:
        consumer.unassign()
    return out
