"""librdkafka's own log lines go through Python logging, rate-limited (cacheroute.kafkaio.RdkafkaLog),
and a CLI command against a broker that is down prints one line, not one per reconnect attempt."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest

from cacheroute.kafkaio import RDKAFKA_LOGGER, RdkafkaLog, connection_config
from cacheroute.settings import Settings

# how confluent-kafka calls a `logger`: level, "%s [%s] %s", facility, client name, the line
FMT = "%s [%s] %s"
REFUSED = "127.0.0.1:1/bootstrap: Connect to ipv4#127.0.0.1:1 failed: Connection refused (after {}ms in state CONNECT)"


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_same_kind_of_line_is_logged_once_per_interval_with_the_count_held_back(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    rd = RdkafkaLog(every_s=10.0, clock=clock)
    caplog.set_level(logging.DEBUG, logger=RDKAFKA_LOGGER)
    for i in range(100):  # 100 reconnect attempts in 5 s: one line
        clock.now = i * 0.05
        rd.log(3, FMT, "FAIL", "rdkafka#producer-1", REFUSED.format(i))
    rd.log(3, FMT, "FAIL", "rdkafka#producer-1", "127.0.0.1:2/2: Disconnected")  # another kind
    clock.now = 10.5  # the interval has passed: the next one is logged, with the 99 held back
    rd.log(3, FMT, "FAIL", "rdkafka#producer-1", REFUSED.format(7))
    lines = [r.getMessage() for r in caplog.records if r.name == RDKAFKA_LOGGER]
    head = "librdkafka: FAIL [rdkafka#producer-1] "
    assert lines == [
        head + REFUSED.format(0),
        head + "127.0.0.1:2/2: Disconnected",
        head + REFUSED.format(7) + " (99 more like it in the last 10 s)",
    ]
    assert all(r.levelno == logging.DEBUG for r in caplog.records)


def test_nothing_is_formatted_when_debug_is_off(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=RDKAFKA_LOGGER)
    rd = RdkafkaLog()
    rd.log(3, "%s %s", "needs", "two")  # would raise on formatting if it were formatted wrongly
    assert not caplog.records


def test_every_client_config_logs_through_python_logging() -> None:
    assert isinstance(connection_config(Settings())["logger"], RdkafkaLog)


def test_plan_show_against_a_broker_that_is_down_prints_one_line() -> None:
    env = os.environ | {"CACHEROUTE_BOOTSTRAP": "127.0.0.1:1"}
    run = subprocess.run(
        [sys.executable, "-m", "cacheroute", "plan", "show", "--timeout", "5"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert run.returncode == 1
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, run.stderr[:2000]
    assert "no Kafka broker answers at 127.0.0.1:1" in lines[0]
    assert "rdkafka" not in run.stdout + run.stderr
