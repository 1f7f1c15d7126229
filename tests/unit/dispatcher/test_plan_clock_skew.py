"""A plan from the future: gateways treat it as stale (one log line), within the skew margin not.

That is the rule for a first version (at start, or after a silence past the limit); versions that
keep coming are judged by their arrival, so one planner host's wrong clock never stops a fleet
from routing by plan.

A planner whose clock runs a day ahead stamps plans with a negative age, and a
negative age used to count as fresh forever, so gateways stayed on a dead planner's last plan.
"""

from __future__ import annotations

import logging
import random
import threading
import time

import numpy as np
import pytest

from cacheroute.dispatcher.dispatcher import Dispatcher, DispatcherConfig
from cacheroute.dispatcher.routing import RouteKind
from cacheroute.planner import Plan, PlannerParams, build_plan

NAMES = ["d0", "d1", "d2"]
NOW_S = 1_700_000_000.0
DAY_MS = 86_400_000


def plan(version: int, created_ms: int) -> Plan:
    return build_plan(
        [f"k{i}" for i in range(50)],
        np.linspace(10.0, 1.0, 50),
        NAMES,
        PlannerParams(q_cap=4.0, warm_slots=10, control_interval_s=10.0),
        version=version,
        created_ms=created_ms,
    )


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def stale(d: Dispatcher) -> bool:
    """The router's stale flag (a call, so mypy does not narrow it between assertions)."""
    return d.router.stale


def future_lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if "in the future of this gateway's clock" in r.message]


def test_a_plan_a_day_in_the_future_is_stale_with_one_log_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock(NOW_S)
    d = Dispatcher(NAMES, rng=random.Random(0), clock=clock)
    with caplog.at_level(logging.WARNING, logger="cacheroute.dispatcher"):
        assert d.apply_plan(plan(1, int(NOW_S * 1000) + DAY_MS))
        assert d.router.stale
        for i in range(1000):
            d.route(f"k{i % 50}")
            clock.t += 0.5  # 500 s later: still a day ahead
            assert d.check_staleness()
    assert d.router.counts[RouteKind.STALE] == 1000
    assert d.router.counts[RouteKind.PLAN] == 0
    lines = future_lines(caplog)
    assert len(lines) == 1
    assert "plan v1 was created 86400 s in the future" in lines[0].message


class SlowHandler(logging.Handler):
    """Holds each warning for a while, so a second thread checks while the first one logs."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        time.sleep(0.05)
        self.messages.append(record.getMessage())


def test_threads_checking_at_once_log_a_future_plan_once() -> None:
    """The apply thread, the maintenance thread and callers all check; one transition, one line.

    (A CI run saw two lines: two threads had both seen the old mode before either set the new.)
    """
    clock = Clock(NOW_S)
    d = Dispatcher(NAMES, rng=random.Random(0), clock=clock)
    assert d.apply_plan(plan(1, int(NOW_S * 1000)))
    assert not stale(d)
    clock.t = NOW_S - 86_400.0  # the gateway's clock is set back a day: the plan is in its future
    handler = SlowHandler()
    logger = logging.getLogger("cacheroute.dispatcher.dispatcher")
    logger.addHandler(handler)
    gate = threading.Barrier(8)

    def check() -> None:
        gate.wait()
        assert d.check_staleness()

    threads = [threading.Thread(target=check) for _ in range(8)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=10)
    finally:
        logger.removeHandler(handler)
    assert stale(d)
    assert len([m for m in handler.messages if "in the future" in m]) == 1


def test_clock_skew_within_the_margin_is_fresh_and_beyond_it_is_stale(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The margin applies to a first version, one a gateway takes at start or after a silence
    # longer than the limit (3 intervals of 10 s): it may be a dead planner's last.
    now_ms = int(NOW_S * 1000)
    for ahead_ms, want_stale in ((5_000, False), (5_001, True), (-1_000, False)):
        clock = Clock(NOW_S)
        d = Dispatcher(NAMES, DispatcherConfig(max_clock_skew_s=5.0), clock=clock)
        d.apply_plan(plan(1, now_ms + ahead_ms))
        assert stale(d) is want_stale, ahead_ms
    caplog.clear()
    clock = Clock(NOW_S)
    d = Dispatcher(NAMES, DispatcherConfig(max_clock_skew_s=5.0), clock=clock)
    with caplog.at_level(logging.WARNING, logger="cacheroute.dispatcher"):
        d.apply_plan(plan(1, now_ms + 60_000))
        assert stale(d)
        clock.t += 60.0  # the clocks meet: the same plan is fresh (age 0)
        assert not d.check_staleness()
        clock.t += 31.0  # and ages normally: 3 intervals of 10 s
        assert d.check_staleness()
        d.apply_plan(plan(2, now_ms + 60_000 + 91_000 + 60_000))  # after the silence: a first
        assert stale(d)  # version again, a minute ahead
    assert len(future_lines(caplog)) == 2  # one per transition into the future, not per check
    assert sum("path (no plan) until" in r.message for r in caplog.records) == 1


@pytest.mark.parametrize("planner_offset_s", [-600.0, 6.0, 86_400.0])
def test_versions_that_keep_coming_are_fresh_whatever_the_planners_clock(
    planner_offset_s: float, caplog: pytest.LogCaptureFixture
) -> None:
    """One planner host with a wrong clock (10 min slow, 6 s or a day fast) publishes every 10 s.

    Its first version is judged by its stamp (stale: it could be a dead planner's last), each
    later one by its arrival, so the gateway routes by plan from the second version on; when the
    versions stop, the last goes stale 30 s (3 intervals) after it arrived, with its own line.
    Judged by stamps alone, every gateway routed by the cold path for as long as the clock was off.
    """
    clock = Clock(NOW_S)
    d = Dispatcher(NAMES, rng=random.Random(0), clock=clock)
    stamp_ms = int((NOW_S + planner_offset_s) * 1000)
    with caplog.at_level(logging.WARNING, logger="cacheroute.dispatcher"):
        d.apply_plan(plan(1, stamp_ms))
        assert stale(d)
        for version in range(2, 6):
            clock.t += 10.0
            d.apply_plan(plan(version, stamp_ms + (version - 1) * 10_000))
            assert not stale(d)
            d.route("k0")
        assert d.router.counts[RouteKind.PLAN] == 4
        clock.t += 30.0  # no version for exactly the limit: still fresh
        assert not d.check_staleness()
        clock.t += 0.5  # then the planner has gone quiet
        assert d.check_staleness()
        clock.t += 100.0
        assert d.check_staleness()
    silent = [r.getMessage() for r in caplog.records if "no plan newer than v5" in r.getMessage()]
    assert silent == [
        "no plan newer than v5 for 30 s (limit 30 s): routing everything by the cold path (no "
        "plan) until a new version arrives. The planner stopped publishing, or this gateway "
        "stopped receiving its versions: run `cacheroute doctor`"
    ]


@pytest.mark.parametrize(
    ("gateway_offset_s", "expected"),
    [
        (
            -600.0,  # this gateway's clock is 10 minutes behind: the plan is from its future
            "plan v1 was created 600 s in the future of this gateway's clock (more than the 5 s "
            "allowed for clock skew): either the planner's clock is ahead or this gateway's "
            "clock is behind.",
        ),
        (
            600.0,  # 10 minutes ahead: the plan looks 600 s old, twenty times the 30 s limit
            "plan v1 is 600 s old by this gateway's clock (limit 30 s): routing everything by "
            "the cold path (no plan) until a fresh plan arrives. Either the planner stopped "
            "publishing, or the clocks disagree (the planner's clock behind or this gateway's "
            "clock ahead)",
        ),
    ],
)
def test_a_gateway_clock_ten_minutes_off_falls_back_to_the_cold_path_and_names_both_clocks(
    gateway_offset_s: float, expected: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The planner's clock is right (it stamps the plan at NOW_S); this gateway's is 600 s off.

    Either way the plan cannot be trusted by age, so every request goes by the cold path, exactly
    where a gateway without any plan sends it, and one warning names both clocks. Once the
    gateway's clock is fixed the same plan routes again."""
    clock = Clock(NOW_S + gateway_offset_s)
    d = Dispatcher(NAMES, rng=random.Random(0), clock=clock)
    no_plan = Dispatcher(NAMES, rng=random.Random(0), clock=Clock(NOW_S))
    keys = [f"k{i % 50}" for i in range(500)]
    with caplog.at_level(logging.WARNING, logger="cacheroute.dispatcher"):
        assert d.apply_plan(plan(1, int(NOW_S * 1000)))  # interval 10 s: limit 3 x 10 = 30 s
        assert stale(d)
        routed = []
        for key in keys:
            routed.append(d.route(key))
            clock.t += 0.1  # 50 s pass: still 550 s or more off
            assert d.check_staleness()
    assert routed == [no_plan.route(key) for key in keys]  # the documented fallback
    assert d.router.counts[RouteKind.STALE] == len(keys)
    assert d.router.counts[RouteKind.PLAN] == 0
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    clock_lines = [m for m in lines if "the planner's clock" in m and "this gateway's clock" in m]
    assert len(clock_lines) == 1
    assert expected in clock_lines[0]
    assert "cacheroute doctor` on another host" in clock_lines[0]  # how to tell which is wrong
    clock.t = NOW_S + 1.0  # NTP fixes this gateway: the same plan is fresh and routes again
    assert not d.check_staleness()
    d.route("k0")
    assert d.router.counts[RouteKind.PLAN] == 1
