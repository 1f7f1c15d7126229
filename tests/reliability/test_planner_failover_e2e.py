"""End-to-end variant of the planner tests: garbage on `plans` AND a SIGKILLed active planner, while
gateways route.

Two `cacheroute planner run` processes (active + hot standby) publish from real rates; a gateway
`Dispatcher` follows the topic and routes on its own thread. Garbage lands on the plans topic (junk
under the header and chunk keys, an unknown key, a header with a far higher version and a wrong
checksum); then the active planner is SIGKILLed and the standby takes over, recovering its next
version from a topic that holds the garbage. What is lost: nothing — no route fails, the gateway
never applies the garbage, the versions it applies strictly increase, the standby's versions reach
it, and every committed complete version on the topic is in strictly increasing order with the
killed planner's versions first, then only the standby's.
"""

from __future__ import annotations

import dataclasses
import random
import signal
import threading
import time
from pathlib import Path

from confluent_kafka import Producer

from cacheroute.dispatcher.dispatcher import Dispatcher
from cacheroute.dispatcher.reader import read_plan_history
from cacheroute.kafkaio import produce_sync, producer_config
from cacheroute.planner.protocol import HEADER_KEY, chunk_key, encode_plan
from cacheroute.schemas import PlanHeader, codec_for
from cacheroute.settings import Settings
from cacheroute.topics import ensure_topics
from tests.integration.planservice_support import make_plan, planner_process, produce_rates
from tests.integration.test_planservice_kafka import window_rates, write_config

WINDOW_MS = 10_000
NAMES = ["d0", "d1", "d2", "d3"]
BOGUS = 50  # the garbage header claims the live version + this


def test_garbage_then_sigkill_of_the_active_planner_while_gateways_route(
    settings: Settings, tmp_path: Path
) -> None:
    ensure_topics(settings)
    now_ms = int(time.time() * 1000) // WINDOW_MS * WINDOW_MS
    rates = [window_rates(200, s) for s in (1, 2)]
    produce_rates(settings, rates, window_ms=WINDOW_MS, end_ms=now_ms)
    config = write_config(tmp_path / "planner.toml", interval_s=2.0, max_plan_age_s=2.0)
    keys = list(rates[1])
    seen: list[int] = []
    failures: list[BaseException] = []
    stop = threading.Event()
    dispatcher = Dispatcher(NAMES, rng=random.Random(0)).follow(settings)

    def drive() -> None:
        try:
            while not stop.is_set():
                for key in keys:
                    with dispatcher.request(key) as dest:
                        assert dest in NAMES
                v = dispatcher.version
                if v is not None and (not seen or seen[-1] != v):
                    seen.append(v)
                time.sleep(0.01)
        except BaseException as exc:  # recorded and asserted on
            failures.append(exc)

    router = threading.Thread(target=drive, daemon=True)
    try:
        with (
            planner_process(settings, config, "A", tmp_path) as a,
            planner_process(settings, config, "B", tmp_path) as b,
        ):
            deadline = time.monotonic() + 60
            while a.metric("cacheroute_planner_active") + b.metric("cacheroute_planner_active") < 1:
                assert time.monotonic() < deadline, a.tail() + b.tail()
                time.sleep(0.2)
            active, standby = (a, b) if a.metric("cacheroute_planner_active") == 1 else (b, a)
            active.wait_metric("cacheroute_planner_version", 1)
            router.start()
            deadline = time.monotonic() + 30
            while (dispatcher.version or 0) < 1:
                assert time.monotonic() < deadline, "the gateway never applied a plan"
                time.sleep(0.05)

            live = dispatcher.version or 0
            template = encode_plan(make_plan(50, version=live + BOGUS)).header
            bogus = codec_for(PlanHeader).encode(dataclasses.replace(template, checksum="0" * 64))
            producer = Producer(producer_config(settings))
            topic = settings.topics["plans"]
            for key, value in (
                (HEADER_KEY, b"garbage"),
                (chunk_key(0), random.Random(1).randbytes(64)),
                (b"something-else", b"{}"),
                (HEADER_KEY, bogus),
            ):
                produce_sync(producer, topic, value, key=key)
            # the active planner publishes on top of the garbage
            before_kill = active.wait_metric("cacheroute_planner_version", live + 1)
            active.proc.send_signal(signal.SIGKILL)
            active.proc.wait(timeout=10)
            standby.wait_metric("cacheroute_planner_active", 1, timeout=60)
            taken = standby.wait_metric("cacheroute_planner_version", live + BOGUS + 1)
            deadline = time.monotonic() + 30
            while (dispatcher.version or 0) < taken:
                assert time.monotonic() < deadline, f"gateway at {dispatcher.version}, not {taken}"
                time.sleep(0.05)
            time.sleep(0.5)
    finally:
        stop.set()
        router.join(timeout=10)
        dispatcher.close()

    assert not failures, failures
    assert seen == sorted(set(seen)), seen  # strictly increasing, never back
    assert live + BOGUS not in seen  # the garbage header was never applied
    assert seen[-1] >= taken > before_kill
    history = read_plan_history(settings)
    assert list(history.applied) == sorted(set(history.applied))
    assert live + BOGUS not in history.applied
    assert any(r.version == live + BOGUS for r in history.rejected)  # seen, refused
    ids = [history.versions[v].header.planner_id for v in history.applied]
    switch = ids.index(standby.planner_id)
    assert set(ids[:switch]) == {active.planner_id}
    assert set(ids[switch:]) == {standby.planner_id}
