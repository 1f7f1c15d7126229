"""The broker stops mid-run and comes back: the streams worker survives and rates resume.

A `cacheroute streams run` worker on a private broker (free loopback ports, state in tmp_path)
emits exact rates for a first window; the broker is stopped for several seconds and started again;
events of a later window, sent after the restart, come out as exact rates from the same worker
process. What is lost: nothing.
"""

from __future__ import annotations

import time
from pathlib import Path

from cacheroute.localkafka import LocalBroker, resolve_distribution
from cacheroute.localkafka.settings import LocalBrokerSettings
from cacheroute.loopback import free_port_block
from cacheroute.settings import Settings
from cacheroute.topics import ensure_topics
from tests.integration.streams_support import (
    T0,
    produce_batches,
    read_rates,
    streams_worker,
    synthetic_events,
    truth,
)

WINDOW = 20_000


def test_rates_resume_after_a_broker_restart(tmp_path: Path, kafka_settings: Settings) -> None:
    broker = LocalBroker(tmp_path / "broker", port=free_port_block(2), heap="384m")
    broker.start(resolve_distribution(LocalBrokerSettings.from_env()), timeout=120)
    settings = kafka_settings.with_overrides(bootstrap=broker.bootstrap, topic_prefix="resume.")
    try:
        ensure_topics(settings)
        events = synthetic_events(seed=5, seconds=40)
        expected = truth(events, WINDOW)
        first = [e for e in events if e[1] < T0 + WINDOW]
        second = [e for e in events if e[1] >= T0 + WINDOW]
        with streams_worker(settings, "resume-streams", tmp_path / "w", window_ms=WINDOW) as worker:
            # window 1, closed by a heartbeat past its end + grace (2 s)
            produce_batches(
                settings,
                first,
                settings.requests_partitions,
                final_heartbeat_ms=T0 + WINDOW + 2_500,
            )
            got1 = read_rates(settings, {k for k in expected if k[1] == T0})
            broker.stop(timeout=60)
            time.sleep(8.0)  # the worker now sees connection errors
            assert worker.proc.poll() is None, "the worker died during the outage"
            broker.start(resolve_distribution(LocalBrokerSettings.from_env()), timeout=120)
            produce_batches(
                settings,
                second,
                settings.requests_partitions,
                final_heartbeat_ms=T0 + 2 * WINDOW + 2_500,
            )
            got2 = read_rates(settings, set(expected), timeout=120)
            assert worker.proc.poll() is None, worker.tail()
        for key_window, want in expected.items():
            rate = (got1 if key_window[1] == T0 else got2)[key_window]
            assert rate.count == want["count"], key_window
        assert any(k[1] == T0 + WINDOW for k in got2)
    finally:
        broker.stop(timeout=60)
