"""The planner service and the plan-topic protocol against a real broker.

Rates in -> plan out through `cacheroute planner run`; a 200k-key plan byte-exact through the topic;
a planner killed mid-publish; restarts; a standby taking over from a SIGKILLed active planner;
compaction; garbage on the plans topic.
"""

from __future__ import annotations

import dataclasses
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import orjson
import pytest
from click.testing import CliRunner
from confluent_kafka import Producer

from cacheroute.cli.main import cli
from cacheroute.dispatcher.follower import FollowerConfig, PlanFollower
from cacheroute.errors import CacheRouteError
from cacheroute.kafkaio import produce_sync, producer_config
from cacheroute.planner.protocol import HEADER_KEY, chunk_key, encode_plan, parse_key
from cacheroute.planservice.publisher import PlanPublisher
from cacheroute.schemas import PlanChunk, PlanHeader, codec_for
from cacheroute.settings import Settings
from cacheroute.topics import ensure_topics

from .planservice_support import (
    REPO,
    PlannerProcess,
    headers,
    make_plan,
    plan_records,
    planner_process,
    produce_rates,
    started_publisher,
)

pytestmark = pytest.mark.kafka

WINDOW_MS = 10_000


@pytest.fixture
def topics(settings: Settings) -> Settings:
    ensure_topics(settings)
    return settings


@pytest.fixture
def follower(topics: Settings) -> Iterator[PlanFollower]:
    f = PlanFollower(topics, FollowerConfig(poll_timeout_s=0.2)).start()
    yield f
    f.close()


def txid(settings: Settings) -> str:
    return settings.topic_prefix + "cacheroute-planner"


def write_config(path: Path, **extra: object) -> Path:
    values: dict[str, object] = {
        "destinations": 4,
        "q_cap": 6.0,
        "warm_slots": 40,
        "interval_s": 2.0,
        "settle_s": 0.5,
        "max_wait_s": 5.0,
        "ewma_alpha": 0.5,
        "rewarm_s": 0.0,
        "rates_lookback_s": 600.0,
    }
    values.update(extra)
    path.write_text(
        "\n".join(f"{k} = {orjson.dumps(v).decode()}" for k, v in values.items()) + "\n",
        encoding="utf-8",
    )
    return path


def window_rates(n: int, seed: int) -> dict[str, float]:
    rng = np.random.default_rng(seed)
    return {f"key-{i:04d}": float(r) for i, r in enumerate(rng.lognormal(0.0, 1.0, n))}


def invoke(settings: Settings, *args: str) -> dict[str, object]:
    result = CliRunner().invoke(
        cli, ["--bootstrap", settings.bootstrap, "--topic-prefix", settings.topic_prefix, *args]
    )
    assert result.exit_code == 0, (result.output, result.exception)
    data = orjson.loads(result.stdout)
    assert isinstance(data, dict)
    return data


# ----------------------------------------------------------------------------------- tests
def test_rates_in_plan_out_end_to_end(
    topics: Settings, follower: PlanFollower, tmp_path: Path
) -> None:
    now_ms = int(time.time() * 1000) // WINDOW_MS * WINDOW_MS
    windows = [window_rates(300, seed) for seed in (1, 2, 3)]
    windows[2]["whale"] = 40.0  # needs ceil(40 / 6) = 7 > 4 replicas: capped at 4
    produce_rates(topics, windows, window_ms=WINDOW_MS, end_ms=now_ms)
    config = write_config(tmp_path / "planner.toml")
    with planner_process(topics, config, "A", tmp_path) as planner:
        live = follower.wait_for_version(1, timeout=90)
        assert live is not None, planner.tail()
        # The newest window has no later window to close it: the planner folds it after its
        # settle time, so a tick can come first and publish from the two older windows only.
        while live.plan.stats.keys < 301:
            live = follower.wait_for_version(live.version + 1, timeout=60)
            assert live is not None, planner.tail()
        plan = live.plan
        plan.validate()
        assert live.header.planner_id == "A"
        assert plan.stats.keys == 301
        assert plan.n_admitted > 20
        whale = live.destinations_of("whale")
        assert whale is not None
        # k capped at all 4 destinations; their order is LPT's (a re-plan from an earlier version
        # places the whale by the loads of the keys it keeps)
        assert sorted(whale) == ["d0", "d1", "d2", "d3"]
        for key, used in zip(plan.keys, plan.rates.tolist(), strict=True):
            r1, r2, r3 = (w.get(key) for w in windows)
            # EWMA, alpha 0.5: a key starts at its first observed rate
            expected = 40.0 if key == "whale" else 0.5 * r3 + 0.25 * r2 + 0.25 * r1  # type: ignore[operator]
            assert used == pytest.approx(expected, rel=1e-12), key
        assert live.header.inputs_until_ms == now_ms
        planner.wait_metric("cacheroute_planner_version", live.version)
        assert planner.metric("cacheroute_planner_active") == 1
        assert planner.metric("cacheroute_planner_admitted_keys") == plan.n_admitted
        assert planner.metric("cacheroute_planner_build_seconds_count") >= 1
        # nothing new in the next interval: skipped, and counted with the reason
        planner.wait_metric("cacheroute_planner_publish_skips_total", 1, 'reason="no-new-rates"')

        # a new window with a new hot key whose 1,536-token prompts the engines report 512 of as
        # served from cache: 1,024 uncached, 3 units (1 + 1,024 / 512): the advisor publishes
        # version 2, planned on the reported work
        produce_rates(
            topics,
            [{**windows[2], "newcomer": 30.0}],
            window_ms=WINDOW_MS,
            end_ms=now_ms + WINDOW_MS,
            prompts={"newcomer": 1536},
            cached={"newcomer": 512},
        )
        live2 = follower.wait_for_version(live.version + 1, timeout=30)
        assert live2 is not None, planner.tail()
        assert live2.destinations_of("newcomer") is not None
        # every other key costs 1: total T stays, the newcomer's 30 req/s weigh 90 of T + 60
        planned = dict(zip(live2.plan.keys, live2.plan.rates.tolist(), strict=True))
        total = live2.plan.total_rate
        assert planned["newcomer"] == pytest.approx(90.0 * total / (total + 60.0), rel=1e-9)

    shown = invoke(topics, "plan", "show", "--json", "--key", "newcomer")
    assert shown["version"] == live2.version
    assert shown["admitted_keys"] == live2.plan.n_admitted
    key_info = shown["key"]
    assert isinstance(key_info, dict)
    assert key_info["admitted"] is True
    diff = invoke(topics, "plan", "diff", "1", str(live2.version), "--json")
    assert isinstance(diff["added_keys"], int)
    assert diff["added_keys"] >= 1


def test_200k_key_plan_round_trips_byte_exact(topics: Settings, follower: PlanFollower) -> None:
    plan = make_plan(200_000, version=1, destinations=30)
    assert plan.n_admitted == 200_000
    with started_publisher(topics, txid(topics)) as publisher:
        result = publisher.publish(plan)
    assert result.chunks >= 20
    live = follower.wait_for_version(1, timeout=60)
    assert live is not None
    assert live.plan == plan  # every array and scalar bit for bit
    on_topic = [
        r.value
        for r in plan_records(topics)
        if parse_key(r.key)[0] == "chunk" and r.value is not None
    ]
    assert tuple(on_topic) == encode_plan(live.plan).chunks  # the bytes, too
    print(
        f"\n200k keys: {result.chunks} chunks, {result.bytes} bytes, encode "
        f"{result.encode_seconds:.2f}s, publish {result.seconds:.2f}s"
    )


def test_killed_mid_publish_leaves_the_previous_version_live(
    topics: Settings, follower: PlanFollower
) -> None:
    first = make_plan(500, version=1)
    with started_publisher(topics, txid(topics)) as publisher:
        publisher.publish(first)
    assert follower.wait_for_version(1, timeout=30) is not None
    argv = [
        sys.executable,
        "-m",
        "tests.integration.planservice_support",
        "publish-and-die",
        f"--bootstrap={topics.bootstrap}",
        f"--prefix={topics.topic_prefix}",
        f"--txid={txid(topics)}",
        "--kill-after=5",
    ]
    done = subprocess.run(argv, cwd=REPO, capture_output=True, timeout=120, check=False)
    assert done.returncode == -signal.SIGKILL, done.stderr.decode()[-2000:]
    dead = [
        r
        for r in plan_records(topics, committed=False)
        if parse_key(r.key)[0] == "chunk" and r.offset > 2
    ]
    assert len(dead) >= 5  # the killed publish really left chunks on the broker

    fresh = PlanFollower(topics)
    try:
        assert fresh.wait_caught_up(timeout=30)
        assert fresh.version == 1  # the open transaction is invisible
    finally:
        fresh.close()
    time.sleep(1.0)
    assert follower.version == 1

    # restart: fencing aborts the dead transaction; its version number is never reused
    with started_publisher(topics, txid(topics)) as publisher:
        assert publisher.next_version == 3
        publisher.publish(make_plan(800, version=3, seed=3))
    live = follower.wait_for_version(3, timeout=30)
    assert live is not None
    assert live.plan.n_admitted == 800
    assert follower.status().rejected == {}  # read_committed never saw half a version


def test_restart_continues_versions(topics: Settings) -> None:
    with started_publisher(topics, txid(topics)) as publisher:
        assert publisher.next_version == 1
        publisher.publish(make_plan(300, version=1))
        publisher.publish(make_plan(300, version=5, seed=1))  # gaps are allowed
        with pytest.raises(CacheRouteError, match="versions must increase"):
            publisher.publish(make_plan(300, version=5, seed=2))
    restarted = PlanPublisher(topics, transactional_id=txid(topics))
    try:
        recovery = restarted.start()
        assert recovery.next_version == 6
        assert recovery.live is not None
        assert recovery.live.plan == make_plan(300, version=5, seed=1)  # prev for re-planning
        assert len(recovery.live_chunk_keys) == encode_plan(recovery.live.plan).header.chunk_count
        restarted.publish(make_plan(300, version=6, seed=4))
    finally:
        restarted.close()
    assert [h.version for h in headers(plan_records(topics))] == [1, 5, 6]


@contextmanager
def two_planners(
    topics: Settings, tmp_path: Path, interval: float
) -> Iterator[tuple[PlannerProcess, PlannerProcess]]:
    """Planners A and B on fresh rates; yields (active, standby) once one of them published."""
    now_ms = int(time.time() * 1000) // WINDOW_MS * WINDOW_MS
    produce_rates(
        topics, [window_rates(200, s) for s in (1, 2)], window_ms=WINDOW_MS, end_ms=now_ms
    )
    config = write_config(tmp_path / "planner.toml", interval_s=interval, max_plan_age_s=interval)
    with (
        planner_process(topics, config, "A", tmp_path) as a,
        planner_process(topics, config, "B", tmp_path) as b,
    ):
        a.wait_metric("cacheroute_planner_tracked_keys", 200)
        b.wait_metric("cacheroute_planner_tracked_keys", 200)
        deadline = time.monotonic() + 30
        while a.metric("cacheroute_planner_active") + b.metric("cacheroute_planner_active") < 1:
            assert time.monotonic() < deadline, a.tail() + b.tail()
            time.sleep(0.2)
        active, standby = (a, b) if a.metric("cacheroute_planner_active") == 1 else (b, a)
        active.wait_metric("cacheroute_planner_version", 1)
        assert standby.metric("cacheroute_planner_active") == 0
        yield active, standby


def wait_for_header_from(topics: Settings, planner_id: str, timeout: float) -> float | None:
    """Seconds until a committed header from `planner_id` is on the topic (None: timeout)."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if any(h.planner_id == planner_id for h in headers(plan_records(topics))):
            return time.monotonic() - started
        time.sleep(0.2)
    return None


def assert_one_writer_at_a_time(topics: Settings, first: str, then: str) -> None:
    everything = headers(plan_records(topics, committed=False))
    versions = [h.version for h in everything]
    assert versions == sorted(set(versions))  # strictly increasing, none written twice
    ids = [h.planner_id for h in headers(plan_records(topics))]
    switch = ids.index(then)
    assert set(ids[:switch]) == {first}  # the first one's versions, then only the other's
    assert set(ids[switch:]) == {then}


def test_standby_takes_over_after_sigkill(topics: Settings, tmp_path: Path) -> None:
    interval = 5.0
    with two_planners(topics, tmp_path, interval) as (active, standby):
        time.sleep(1.0)
        assert {h.planner_id for h in headers(plan_records(topics))} == {active.planner_id}
        active.proc.send_signal(signal.SIGKILL)
        active.proc.wait(10)
        took_over = wait_for_header_from(topics, standby.planner_id, 3 * interval)
        assert took_over is not None, standby.tail()
        print(f"\ntakeover: standby published {took_over:.1f}s after SIGKILL")
        assert took_over <= 2 * interval
        assert standby.metric("cacheroute_planner_active") == 1
    assert_one_writer_at_a_time(topics, active.planner_id, standby.planner_id)


def test_frozen_active_planner_is_fenced_when_it_wakes_up(topics: Settings, tmp_path: Path) -> None:
    interval = 4.0
    with two_planners(topics, tmp_path, interval) as (zombie, standby):
        zombie.proc.send_signal(signal.SIGSTOP)  # frozen past its session timeout
        try:
            assert wait_for_header_from(topics, standby.planner_id, 4 * interval) is not None
        finally:
            zombie.proc.send_signal(signal.SIGCONT)
        time.sleep(2 * interval)  # the zombie wakes up believing it is active
        assert zombie.metric("cacheroute_planner_active") == 0, zombie.tail()
        assert standby.metric("cacheroute_planner_active") == 1
        log = zombie.log.read_text(errors="replace")
        assert "standby" in log, zombie.tail()
    assert_one_writer_at_a_time(topics, zombie.planner_id, standby.planner_id)


def test_after_compaction_one_header_and_exactly_the_live_chunks(settings: Settings) -> None:
    fast = settings.with_overrides(plans_segment_ms=1000, plans_delete_retention_ms=1000)
    ensure_topics(fast)
    sizes = {}
    with started_publisher(fast, txid(fast), max_chunk_bytes=4096) as publisher:
        for version, n_keys in ((1, 600), (2, 300), (3, 450)):
            result = publisher.publish(make_plan(n_keys, version=version, seed=version))
            sizes[version] = result.chunks
            if version == 2:
                assert result.tombstones == sizes[1] - sizes[2]
    assert sizes[1] > sizes[3] > sizes[2]
    live_keys = {chunk_key(i) for i in range(sizes[3])}
    producer = Producer(producer_config(fast))
    deadline = time.monotonic() + 90
    while True:
        time.sleep(1.1)  # each write after segment.ms rolls a segment; closed ones get cleaned
        produce_sync(producer, fast.topics["plans"], b"f", key=b"filler")
        records = plan_records(fast)
        ours = [r for r in records if r.key != b"filler"]
        header_count = sum(1 for r in ours if r.key == HEADER_KEY)
        chunk_keys = [r.key or b"" for r in ours if parse_key(r.key)[0] == "chunk"]
        if (
            header_count == 1
            and sorted(chunk_keys) == sorted(live_keys)
            and all(r.value is not None for r in ours)
        ):
            break
        if time.monotonic() > deadline:
            pytest.fail(f"not compacted after 90 s: {len(ours)} records, {header_count} headers")
    fresh = PlanFollower(fast)
    try:
        assert fresh.wait_caught_up(30)
        assert fresh.live is not None
        assert fresh.live.plan == make_plan(450, version=3, seed=3)
        assert set(fresh.status().ignored) <= {"unknown-key"}  # the filler only
    finally:
        fresh.close()


def test_garbage_on_the_plans_topic_is_ignored(topics: Settings, follower: PlanFollower) -> None:
    with started_publisher(topics, txid(topics)) as publisher:
        publisher.publish(make_plan(400, version=1))
    assert follower.wait_for_version(1, timeout=30) is not None
    topic = topics.topics["plans"]
    producer = Producer(producer_config(topics))
    chunk = codec_for(PlanChunk).encode(PlanChunk(2, 0, ["k"], [1], [0], [1.0]))
    template = encode_plan(make_plan(50, version=2)).header
    bad_sum = codec_for(PlanHeader).encode(
        dataclasses.replace(template, chunk_count=1, checksum="0" * 64)
    )
    incomplete = codec_for(PlanHeader).encode(
        dataclasses.replace(template, version=3, chunk_count=3)
    )
    # (a record without a key cannot exist here: a compacted topic rejects it)
    for key, value in (
        (HEADER_KEY, b"garbage"),
        (HEADER_KEY, b"\xc3\x01 not a record"),
        (b"something-else", b"{}"),
        (chunk_key(0), b"\x00" * 40),
        (chunk_key(0), chunk),
        (HEADER_KEY, bad_sum),  # version 2: checksum mismatch
        (HEADER_KEY, incomplete),  # version 3: chunks 1 and 2 missing
    ):
        produce_sync(producer, topic, value, key=key)
    deadline = time.monotonic() + 30
    while sum(follower.status().rejected.values()) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    status = follower.status()
    assert status.version == 1
    assert status.rejected == {"checksum": 1, "incomplete": 1}
    assert status.ignored == {"unknown-key": 1, "undecodable": 3}

    with started_publisher(topics, txid(topics)) as publisher:
        assert publisher.next_version == 4  # 2 and 3 were written (badly): never reused
        publisher.publish(make_plan(400, version=4, seed=4))
    assert follower.wait_for_version(4, timeout=30) is not None
    fresh = PlanFollower(topics)
    try:
        assert fresh.wait_caught_up(30)
        assert fresh.version == 4
    finally:
        fresh.close()
