"""Live replay against the real broker: push a workload through the emitter, copy a topic."""

from __future__ import annotations

import time
from collections import Counter

import numpy as np
import orjson
import pytest
from click.testing import CliRunner
from confluent_kafka.admin import NewTopic

from cacheroute.cli.main import cli
from cacheroute.dispatcher.emitter.emitter import Emitter
from cacheroute.kafkaio import KafkaRecord, read_partition
from cacheroute.replay.live import copy_topic, push
from cacheroute.replay.requestset import RequestSet
from cacheroute.replay.workloads import generate, spec_for
from cacheroute.schemas import RequestBatch, decode_any
from cacheroute.settings import Settings
from cacheroute.topics import ensure_topics, make_admin

pytestmark = pytest.mark.kafka


def _records(settings: Settings, topic: str, partitions: int) -> list[KafkaRecord]:
    return [r for p in range(partitions) for r in read_partition(settings, topic, p)]


def _events(records: list[KafkaRecord]) -> list[tuple[str, int, int, int | None]]:
    out = []
    for rec in records:
        batch = decode_any(rec.value, topic=rec.topic, partition=rec.partition, offset=rec.offset)
        assert isinstance(batch, RequestBatch)
        out += [(e.key, e.event_time_ms, e.prompt_tokens, e.prefix_tokens) for e in batch.events()]
    return out


def _workload(n: int) -> RequestSet:
    return generate(spec_for("whale", requests=n, keys=100), np.random.default_rng(5))


def _create(settings: Settings, name: str, partitions: int) -> str:
    topic = settings.topic_prefix + name
    admin = make_admin(settings.bootstrap)
    for fut in admin.create_topics([NewTopic(topic, partitions, 1)]).values():
        fut.result(timeout=30)
    return topic


def test_push_delivers_every_request_with_replay_event_times(settings: Settings) -> None:
    ensure_topics(settings)
    q = _workload(1500)
    start_ms = 1_700_000_000_000
    with Emitter(settings, "replay-it") as emitter:
        stats = push(q, emitter, speed=0, start_ms=start_ms)
    assert stats.accepted == q.n
    assert stats.flushed
    got = _events(_records(settings, settings.topics["requests"], settings.requests_partitions))
    sent = [
        (
            q.keys[int(q.key_index[i])],
            start_ms + round((float(q.times[i]) - float(q.times[0])) * 1000),
            int(q.prompt_tokens[i]),
            int(q.prefix_tokens[i]),
        )
        for i in range(q.n)
    ]
    assert Counter(got) == Counter(sent)


def test_push_at_speed_takes_the_compressed_replay_time(settings: Settings) -> None:
    ensure_topics(settings)
    q = _workload(200)
    q = q.compressed(q.duration / 1.0)  # one second of replay time
    with Emitter(settings, "replay-speed") as emitter:
        t0 = time.monotonic()
        stats = push(q, emitter, speed=2.0, start_ms=0)
        wall = time.monotonic() - t0
    assert stats.replay_s == pytest.approx(0.5, rel=0.01)
    assert 0.45 <= wall < 5.0


def test_copy_a_recorded_topic_from_an_offset_or_a_time(settings: Settings) -> None:
    ensure_topics(settings)
    source = settings.topics["requests"]
    parts = settings.requests_partitions
    with Emitter(settings, "replay-copy") as emitter:
        push(_workload(800), emitter, speed=0, start_ms=0)
    original = _records(settings, source, parts)
    assert original

    everything = _create(settings, "copy-all", parts)
    stats = copy_topic(settings, source, everything, from_offset=0)
    copied = _records(settings, everything, parts)
    assert stats.records == len(original) == len(copied)
    assert sorted((r.partition, r.value, r.timestamp_ms) for r in copied) == sorted(
        (r.partition, r.value, r.timestamp_ms) for r in original
    )

    later = _create(settings, "copy-later", parts)
    cut = sorted(r.timestamp_ms for r in original)[len(original) // 2]
    stats = copy_topic(settings, source, later, from_time_ms=cut)
    expected = [r for r in original if r.timestamp_ms >= cut]
    assert stats.records == len(expected) > 0
    assert copy_topic(settings, source, later, from_time_ms=10**15).records == 0


def test_replay_command_pushes_a_workload(settings: Settings) -> None:
    ensure_topics(settings)
    args = [
        "--bootstrap", settings.bootstrap, "--topic-prefix", settings.topic_prefix,
        "replay", "workload:low-reuse", "--requests", "300", "--speed", "0", "--json",
    ]  # fmt: skip
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    assert orjson.loads(res.output.strip().splitlines()[-1])["accepted"] == 300
    got = _events(_records(settings, settings.topics["requests"], settings.requests_partitions))
    assert len(got) == 300
