"""The pure checks of `cacheroute doctor`: topic drift, plan freshness, consumer lag, DLQ growth."""

from __future__ import annotations

from cacheroute.doctor import (
    DoctorReport,
    Finding,
    check_broker,
    check_dlq,
    check_lag,
    check_plan,
    check_topics,
)
from cacheroute.settings import Settings
from cacheroute.topics import topic_specs

NOW = 1_800_000_000_000


def _healthy(settings: Settings) -> tuple[dict[str, int], dict[str, dict[str, str]]]:
    specs = topic_specs(settings)
    return {s.name: s.partitions for s in specs}, {s.name: dict(s.config) for s in specs}


def test_topics_as_specified_are_ok() -> None:
    settings = Settings.from_env(topic_prefix="t.")
    partitions, configs = _healthy(settings)
    findings = check_topics(topic_specs(settings), partitions, configs)
    assert [f.check for f in findings] == [
        "topic:requests",
        "topic:rates",
        "topic:plans",
        "topic:dead_letter",
    ]
    assert all(f.status == "ok" for f in findings)


def test_missing_topic_drifted_config_and_partitions_are_problems_with_a_fix() -> None:
    settings = Settings.from_env(topic_prefix="t.")
    partitions, configs = _healthy(settings)
    del partitions["t.rates"]
    configs["t.plans"]["cleanup.policy"] = "delete"
    partitions["t.requests"] = 3
    by = {f.check: f for f in check_topics(topic_specs(settings), partitions, configs)}
    assert by["topic:rates"].status == "fail"
    assert "does not exist" in by["topic:rates"].message
    assert "cacheroute topics ensure" in by["topic:rates"].fix
    plans = by["topic:plans"]
    assert plans.status == "fail"
    assert "cleanup.policy=delete (want compact)" in plans.message
    assert "cacheroute topics ensure" in plans.fix
    assert plans.detail["drift"] == {"cleanup.policy": ["delete", "compact"]}
    assert by["topic:requests"].status == "fail"
    assert "3 partitions, the settings say 8" in by["topic:requests"].message
    assert by["topic:dead_letter"].ok


def test_plan_missing_fresh_stale_and_explicit_limit() -> None:
    none = check_plan(version=None, created_ms=None, control_interval_s=None, now_ms=NOW)
    assert none.status == "fail"
    assert "planner run" in none.fix
    fresh = check_plan(version=4, created_ms=NOW - 100_000, control_interval_s=60.0, now_ms=NOW)
    assert fresh.status == "ok"
    assert fresh.detail["max_age_s"] == 180.0
    stale = check_plan(version=4, created_ms=NOW - 181_000, control_interval_s=60.0, now_ms=NOW)
    assert stale.status == "fail"
    assert "181 s old (limit 180 s)" in stale.message
    assert "cacheroute_planner_active" in stale.fix
    strict = check_plan(
        version=4, created_ms=NOW - 100_000, control_interval_s=60.0, now_ms=NOW, max_age_s=30
    )
    assert strict.status == "fail"
    rejected = check_plan(
        version=4, created_ms=NOW - 1000, control_interval_s=60.0, now_ms=NOW, rejected=2
    )
    assert rejected.status == "warn"
    assert rejected.ok


def test_lag_ok_too_high_and_group_never_committed() -> None:
    high = {0: 100, 1: 50}
    low = {0: 0, 1: 10}
    ok = check_lag("g", "requests", {0: 90, 1: 50}, low, high, max_lag=20)
    assert ok.status == "ok"
    assert ok.detail["total"] == 10
    assert ok.detail["by_partition"] == {"0": 10, "1": 0}
    bad = check_lag("g", "requests", {0: 10, 1: None}, low, high, max_lag=20)
    assert bad.status == "fail"
    assert bad.detail["total"] == 90 + 40  # partition 1 counts from its low watermark
    assert "worst partition 0: 90" in bad.message
    assert bad.detail["uncommitted_partitions"] == [1]
    never = check_lag("g", "requests", {}, low, high, max_lag=10**9)
    assert never.status == "fail"
    assert "committed nothing" in never.message
    assert "--streams-group" in never.fix
    idle = check_lag("g", "requests", {}, {0: 0}, {0: 0}, max_lag=0)
    assert idle.status == "ok"


def test_dlq_total_is_informational_recent_growth_is_a_problem() -> None:
    assert check_dlq("dlq", 0).status == "ok"
    some = check_dlq("dlq", 7)
    assert some.status == "warn"
    assert some.ok
    assert "cacheroute.reason" in some.fix
    quiet = check_dlq("dlq", 7, recent=0, window_min=10)
    assert quiet.status == "ok"
    growing = check_dlq("dlq", 7, recent=3, window_min=10, max_recent=2)
    assert growing.status == "fail"
    assert "3 dead letters" in growing.message


def test_exit_codes_and_json_form() -> None:
    good = DoctorReport("b:1", True, (check_broker("b:1", None), Finding("x", "warn", "m")))
    assert good.exit_code == 0
    assert good.to_dict()["ok"] is True
    bad = DoctorReport("b:1", True, (Finding("x", "fail", "m", "do this"),))
    assert bad.exit_code == 1
    assert bad.to_dict()["findings"][0]["fix"] == "do this"
    down = DoctorReport("b:1", False, (check_broker("b:1", "timeout"),))
    assert down.exit_code == 2
    assert "cacheroute kafka start" in down.findings[0].fix
