"""Rate-limited logging: one line per interval per kind, and the count of what was suppressed."""

from __future__ import annotations

import logging

import pytest

from cacheroute.dispatcher.emitter.throttle import ThrottledLog

LOGGER = "tests.throttle"


def test_one_line_per_interval_per_kind_with_suppressed_count(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    throttle = ThrottledLog(logging.getLogger(LOGGER), interval_ms=10_000)
    logged = [
        throttle.log("timeout", t, logging.ERROR, f"failed at {t}") for t in range(0, 10_000, 100)
    ]
    assert logged[0]
    assert not any(logged[1:])
    assert throttle.log("other", 50, logging.ERROR, "another kind logs at once")
    assert throttle.suppressed() == {"timeout": 99}
    assert not throttle.due("timeout", 9_999)
    assert throttle.due("timeout", 10_000)
    assert throttle.log("timeout", 10_000, logging.ERROR, "failed again")
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "failed at 0",
        "another kind logs at once",
        "failed again (99 similar suppressed in the last 10 s)",
    ]
    assert throttle.suppressed() == {}


def test_report_suppressed_at_shutdown(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    throttle = ThrottledLog(logging.getLogger(LOGGER), interval_ms=10_000)
    for t in range(5):
        throttle.log("queue-full", t, logging.WARNING, "queue full")
    throttle.report_suppressed()
    throttle.report_suppressed()  # nothing left the second time
    assert [r.getMessage() for r in caplog.records] == [
        "queue full",
        "4 more 'queue-full' problems were not logged (rate limit)",
    ]
