"""Dispatchers on the real broker: several gateway processes agree on T(b), versions swap, bad
versions are ignored, and a broker outage leaves routing on the last good plan."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka import Producer

from cacheroute.dispatcher.dispatcher import Dispatcher
from cacheroute.dispatcher.routing import RouteKind
from cacheroute.kafkaio import producer_config
from cacheroute.localkafka import LocalBroker, resolve_distribution
from cacheroute.localkafka.settings import LocalBrokerSettings
from cacheroute.loopback import free_port_block
from cacheroute.planner import Plan
from cacheroute.planner.protocol import HEADER_KEY
from cacheroute.schemas import Destination as DestinationRecord
from cacheroute.schemas import PlanHeader, PlanParams, codec_for
from cacheroute.settings import Settings
from cacheroute.topics import ensure_topics
from tests.integration.planservice_support import make_plan, started_publisher

pytestmark = pytest.mark.kafka

WORKER = Path(__file__).with_name("dispatcher_worker.py")
NAMES = [f"gpu-{i}" for i in range(8)]


def _now_plan(n: int, version: int, seed: int) -> Plan:
    return make_plan(n, version=version, seed=seed, created_ms=int(time.time() * 1000) - version)


def _allowed(plan: Plan) -> dict[str, set[str]]:
    names = plan.destination_names
    return {k: {names[t] for t in ts} for k, ts in plan.assignments().items()}


def test_three_gateway_processes_route_inside_the_same_replica_sets(
    settings: Settings, tmp_path: Path
) -> None:
    ensure_topics(settings)
    v1 = _now_plan(3000, version=1, seed=1)
    v2 = _now_plan(3000, version=2, seed=2)  # different rates: different placement
    keys = [*list(v1.keys)[:400], *[f"cold-{i}" for i in range(50)]]
    keys_file = tmp_path / "keys.json"
    keys_file.write_text(json.dumps(keys))
    with started_publisher(settings, "test-dispatch") as publisher:
        publisher.publish(v1)
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    str(WORKER),
                    settings.bootstrap,
                    settings.topic_prefix,
                    str(seed),
                    str(keys_file),
                    str(tmp_path),
                    "1",
                    "2",
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            )
            for seed in (11, 22, 33)
        ]
        try:
            deadline = time.monotonic() + 90
            while len(list(tmp_path.glob("*-v1.json"))) < 3:
                assert time.monotonic() < deadline, "gateways never applied version 1"
                assert all(p.poll() in (None, 0) for p in procs), [
                    p.stdout.read() if p.stdout else b"" for p in procs if p.poll()
                ]
                time.sleep(0.1)
            publisher.publish(v2)
            for p in procs:
                out, _ = p.communicate(timeout=90)
                assert p.returncode == 0, out.decode(errors="replace")[-3000:]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
    for version, plan in ((1, v1), (2, v2)):
        allowed = _allowed(plan)
        reports = [json.loads(f.read_text()) for f in tmp_path.glob(f"*-v{version}.json")]
        assert len(reports) == 3
        for report in reports:
            assert report["version"] == version
            for key, chosen in report["choices"].items():
                if key in allowed:
                    assert set(chosen) <= allowed[key], (version, key, chosen, allowed[key])
                else:
                    assert set(chosen) <= set(NAMES)
            for chosen in report["spilled"].values():  # overloaded member: the cold path
                assert set(chosen) <= set(NAMES)
            assert report["counts"][RouteKind.PLAN] > 0
            assert report["counts"][RouteKind.COLD] > 0
    moved = sum(1 for k in keys if k in _allowed(v1) and _allowed(v1)[k] != _allowed(v2).get(k))
    assert moved > 0  # the version change really changed routing


def test_a_corrupt_version_is_ignored_and_the_live_plan_stays(settings: Settings) -> None:
    ensure_topics(settings)
    with started_publisher(settings, "test-corrupt") as publisher:
        publisher.publish(_now_plan(500, version=1, seed=3))
        dispatcher = Dispatcher(NAMES, rng=random.Random(0)).follow(settings)
        try:
            deadline = time.monotonic() + 30
            while dispatcher.version != 1:
                assert time.monotonic() < deadline
                time.sleep(0.05)
            bogus = PlanHeader(
                version=99,
                created_ms=int(time.time() * 1000),
                params=PlanParams(q_cap=1.0, warm_slots=1),
                destinations=[DestinationRecord(n) for n in NAMES],
                key_count=500,
                chunk_count=1,
                checksum="0" * 64,
            )
            producer = Producer(producer_config(settings))
            topic = settings.topics["plans"]
            producer.produce(topic, key=HEADER_KEY, value=codec_for(PlanHeader).encode(bogus))
            producer.produce(topic, key=HEADER_KEY, value=b"\x00garbage")
            assert producer.flush(10) == 0
            time.sleep(2.0)
            assert dispatcher.version == 1
            assert dispatcher.subscription is not None
            status = dispatcher.subscription.status()  # type: ignore[attr-defined]
            assert sum(status.rejected.values()) + sum(status.ignored.values()) >= 1
            for i in range(100):
                assert dispatcher.route(f"tenant-{i % 97}/conversation-{i:07d}") in NAMES
        finally:
            dispatcher.close()


def test_broker_outage_keeps_routing_on_the_last_plan(
    tmp_path: Path, kafka_settings: Settings
) -> None:
    port = free_port_block(2)
    broker = LocalBroker(tmp_path / "broker", port=port, heap="384m")
    dist = resolve_distribution(LocalBrokerSettings.from_env())
    broker.start(dist, timeout=120)
    settings = kafka_settings.with_overrides(bootstrap=broker.bootstrap, topic_prefix="outage.")
    dispatcher: Dispatcher | None = None
    try:
        ensure_topics(settings)
        plan = _now_plan(800, version=1, seed=4)
        with started_publisher(settings, "test-outage") as publisher:
            publisher.publish(plan)
        dispatcher = Dispatcher(NAMES, rng=random.Random(0)).follow(settings)
        deadline = time.monotonic() + 30
        while dispatcher.version != 1:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        allowed = _allowed(plan)
        broker.stop(timeout=60)
        time.sleep(2.0)  # the follower now sees connection errors
        before = dispatcher.router.counts[RouteKind.PLAN]
        for key, dests in list(allowed.items())[:300]:
            assert dispatcher.route(key) in dests
        assert dispatcher.router.counts[RouteKind.PLAN] - before == 300
        assert dispatcher.version == 1
    finally:
        if dispatcher is not None:
            dispatcher.close()
        broker.stop(timeout=30)
