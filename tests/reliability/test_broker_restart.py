"""The broker stops mid-run and comes back, end to end: a real `cacheroute planner run` process
and a gateway `Dispatcher` on a private broker (free loopback ports, state in tmp_path).

During the outage the dispatcher keeps routing every admitted key inside its T(b) on the last plan
(no failed route, no fallback); the planner process survives it. After the restart the planner
publishes again and the dispatcher applies the new version. What is lost: nothing — every version
the planner counted as published is on the topic, complete, and the versions strictly increase
(1, 2, 3, … without a gap or a repeat, also across the outage).
"""

from __future__ import annotations

import random
import time
from pathlib import Path

from cacheroute.dispatcher.dispatcher import Dispatcher
from cacheroute.dispatcher.reader import read_plan_history
from cacheroute.dispatcher.routing import RouteKind
from cacheroute.localkafka import LocalBroker, resolve_distribution
from cacheroute.localkafka.settings import LocalBrokerSettings
from cacheroute.loopback import free_port_block
from cacheroute.settings import Settings
from cacheroute.topics import ensure_topics
from tests.integration.planservice_support import planner_process, produce_rates
from tests.integration.test_planservice_kafka import window_rates, write_config

WINDOW_MS = 10_000
NAMES = ["d0", "d1", "d2", "d3"]


def _wait_version(dispatcher: Dispatcher, above: int, timeout: float, why: str) -> int:
    deadline = time.monotonic() + timeout
    while (dispatcher.version or 0) <= above:
        assert time.monotonic() < deadline, why
        time.sleep(0.05)
    return dispatcher.version or 0


def test_broker_restart_mid_run_loses_no_plan_version(
    tmp_path: Path, kafka_settings: Settings
) -> None:
    broker = LocalBroker(tmp_path / "broker", port=free_port_block(2), heap="384m")
    broker.start(resolve_distribution(LocalBrokerSettings.from_env()), timeout=120)
    # no compaction during the test: every published header stays readable
    settings = kafka_settings.with_overrides(
        bootstrap=broker.bootstrap, topic_prefix="restart.", plans_segment_ms=3_600_000
    )
    dispatcher: Dispatcher | None = None
    try:
        ensure_topics(settings)
        now_ms = int(time.time() * 1000) // WINDOW_MS * WINDOW_MS
        windows = [window_rates(300, seed) for seed in (1, 2)]
        produce_rates(settings, windows, window_ms=WINDOW_MS, end_ms=now_ms)
        # a 5 s control interval (gateways fall back to power-of-two-choices after 15 s without a
        # fresh plan); republishes every 5 s even without new rates, so it also tries during the
        # outage
        config = write_config(tmp_path / "planner.toml", interval_s=5.0, max_plan_age_s=5.0)
        with planner_process(settings, config, "P", tmp_path) as planner:
            dispatcher = Dispatcher(NAMES, rng=random.Random(0)).follow(settings)
            v_before = _wait_version(dispatcher, 0, 90, "no plan before the outage")
            planner.wait_metric("cacheroute_planner_version", v_before)
            deadline = time.monotonic() + 30
            while (dispatcher.plan_age_s() or 99.0) > 2.5:  # start the outage on a fresh plan
                assert time.monotonic() < deadline, "the planner does not republish"
                time.sleep(0.05)

            broker.stop(timeout=60)
            outage_end = time.monotonic() + 5.0  # a republish attempt fails meanwhile
            table = dispatcher.table
            assert table is not None
            live = dispatcher.version
            plan_before = dispatcher.router.counts[RouteKind.PLAN]
            admitted = [k for k in windows[1] if k in table]
            assert len(admitted) > 20
            routed = 0
            while time.monotonic() < outage_end:
                for key in windows[1]:
                    dest = dispatcher.route(key)
                    if key in table:
                        assert dest in {NAMES[i] for i in table.targets(key)}, (key, dest)
                    else:
                        assert dest in NAMES
                    routed += 1
                time.sleep(0.05)
            assert dispatcher.version == live  # still the last plan
            assert not dispatcher.router.stale
            assert dispatcher.router.counts[RouteKind.PLAN] - plan_before >= len(admitted)
            assert routed > 1000
            assert planner.proc.poll() is None, planner.tail()

            broker.start(resolve_distribution(LocalBrokerSettings.from_env()), timeout=120)
            produce_rates(
                settings,
                [{**windows[1], "newcomer": 30.0}],
                window_ms=WINDOW_MS,
                end_ms=now_ms + WINDOW_MS,
            )
            v_after = _wait_version(
                dispatcher, live or 0, 90, f"no new version after the restart:\n{planner.tail()}"
            )
            assert v_after > (live or 0)
            # the only planner must be (or become again) the active one and keep publishing
            planner.wait_metric("cacheroute_planner_active", 1, timeout=60)
            v_later = _wait_version(
                dispatcher, v_after, 60, f"no version after v{v_after}:\n{planner.tail()}"
            )
            time.sleep(1.0)
            published = planner.metric("cacheroute_planner_version")
            assert planner.proc.poll() is None, planner.tail()
        history = read_plan_history(settings)
        assert not history.rejected
        assert history.applied == tuple(range(1, len(history.applied) + 1)), history.applied
        assert history.applied[-1] >= published >= v_later
    finally:
        if dispatcher is not None:
            dispatcher.close()
        broker.stop(timeout=30)
