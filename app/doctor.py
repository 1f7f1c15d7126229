"""`cacheroute doctor`: health checks of a CacheRoute deployment, each with what to do about it.

The checks are pure functions over plain values (`check_topics`, `check_plan`, `check_lag`,
`check_dlq`), so they are unit-tested without a broker; `run_doctor` is the adapter that gathers
those values from Kafka once (topic metadata and configs, one read of the plans topic, the streams
group's committed offsets, watermarks of the dead-letter topic) and returns a `DoctorReport`.

Exit codes (`DoctorReport.exit_code`): 0 all good, 1 problems found, 2 the broker is unreachable.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cacheroute.settings import Settings
from cacheroute.topics import TopicSpec

__all__ = [
    "DoctorOptions",
    "DoctorReport",
    "Finding",
    "check_dlq",
    "check_lag",
    "check_plan",
    "check_topics",
    "run_doctor",
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
    timeout_s: float = 10.0


# ------------------------------------------------------------------------------ pure checks
def check_broker(bootstrap: str, error: str | None) -> Finding:
    """Whether the broker answered a metadata request."""
    if error is None:
        return Finding("broker", OK, f"broker answers at {bootstrap}")
    return Finding(
        "broker",
        FAIL,
        f"no Kafka broker answers at {bootstrap}: {error}",
        "start it (`cacheroute kafka start` for the local broker) or point --bootstrap / "
        "CACHEROUTE_BOOTSTRAP at a running one; gateways keep routing on their last plan meanwhile",
    )


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
) -> Finding:
    """Is there a complete plan, and is it younger than the limit (default: the staleness rule)."""
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


# --------------------------------------------------------------------------------- adapter
def run_doctor(settings: Settings, options: DoctorOptions | None = None) -> DoctorReport:
    """Run every check against the broker of `settings`."""
    from confluent_kafka import (  # noqa: PLC0415 - Kafka client only when run
        Consumer,
        ConsumerGroupTopicPartitions,
        KafkaException,
        TopicPartition,
    )
    from confluent_kafka.admin import AdminClient  # noqa: PLC0415

    from cacheroute.kafkaio import consumer_config  # noqa: PLC0415
    from cacheroute.topics import describe_topic_configs, make_admin, topic_specs  # noqa: PLC0415

    opts = options or DoctorOptions()
    probe = AdminClient({"bootstrap.servers": settings.bootstrap, "log_level": 0})
    try:
        probe.list_topics(timeout=opts.timeout_s)
    except KafkaException as exc:
        err = exc.args[0] if exc.args else exc
        why = err.str() if hasattr(err, "str") else str(err)
        return DoctorReport(settings.bootstrap, False, (check_broker(settings.bootstrap, why),))
    admin = make_admin(settings.bootstrap)
    meta = admin.list_topics(timeout=opts.timeout_s)
    findings = [check_broker(settings.bootstrap, None)]
    specs = topic_specs(settings)
    partitions = {n: len(t.partitions) for n, t in meta.topics.items() if t.error is None}
    present = [s.name for s in specs if s.name in partitions]
    configs = describe_topic_configs(admin, present) if present else {}
    findings += check_topics(specs, partitions, configs)

    plans = settings.topics["plans"]
    if plans in partitions:
        findings.append(_plan_finding(settings, opts))

    consumer = Consumer(consumer_config(settings, group_id="cacheroute-doctor"))
    try:
        requests = settings.topics["requests"]
        if requests in partitions:
            tps = [TopicPartition(requests, p) for p in range(partitions[requests])]
            low: dict[int, int] = {}
            high: dict[int, int] = {}
            for tp in tps:
                lo, hi = consumer.get_watermark_offsets(tp, timeout=opts.timeout_s)
                low[tp.partition], high[tp.partition] = lo, hi
            committed: dict[int, int | None] = {}
            try:
                futures = admin.list_consumer_group_offsets(
                    [ConsumerGroupTopicPartitions(opts.streams_group, tps)]
                )
                result = futures[opts.streams_group].result(timeout=opts.timeout_s)
                for tp in result.topic_partitions or []:
                    committed[tp.partition] = tp.offset if tp.offset >= 0 else None
            except KafkaException:
                committed = {}
            findings.append(
                check_lag(opts.streams_group, requests, committed, low, high, max_lag=opts.max_lag)
            )

        dlq = settings.topics["dead_letter"]
        if dlq in partitions:
            findings.append(_dlq_finding(consumer, dlq, partitions[dlq], opts))
    finally:
        consumer.close()
    return DoctorReport(settings.bootstrap, True, tuple(findings))


def _plan_finding(settings: Settings, opts: DoctorOptions) -> Finding:
    """Read the plans topic once and judge its live version."""
    from cacheroute.errors import CacheRouteError  # noqa: PLC0415
    from cacheroute.planservice.reader import read_plan_history  # noqa: PLC0415

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


def _dlq_finding(consumer: Any, dlq: str, n_partitions: int, opts: DoctorOptions) -> Finding:
    """Count dead letters: all retained, and those of the last `opts.dlq_window_min` minutes."""
    from confluent_kafka import TopicPartition  # noqa: PLC0415

    total = 0
    recent: int | None = None
    highs: dict[int, int] = {}
    for p in range(n_partitions):
        lo, hi = consumer.get_watermark_offsets(TopicPartition(dlq, p), timeout=opts.timeout_s)
        total += hi - lo
        highs[p] = hi
    if opts.dlq_window_min is not None:
        since = time.time_ns() // 1_000_000 - int(opts.dlq_window_min * 60_000)
        found = consumer.offsets_for_times(
            [TopicPartition(dlq, p, since) for p in highs], timeout=opts.timeout_s
        )
        recent = sum(highs[tp.partition] - tp.offset if tp.offset >= 0 else 0 for tp in found)
    return check_dlq(
        dlq, total, recent=recent, window_min=opts.dlq_window_min, max_recent=opts.max_dlq_recent
    )
