"""Hostile records and skewed gateway clocks against a real `cacheroute streams run` worker.

Once, one empty heartbeat dated 2100 moved a partition's watermark to 2100: every later
event counted as late, nothing reached the dead-letter topic, doctor saw nothing, and a restart
restored the poisoned watermark from the changelog. Here, on the real broker:

(a) the 2100 heartbeat among good batches: every good event counted exactly, the heartbeat is on
    the DLQ with its reason, the worker keeps running;
(b) restarts: the poisoned value never reaches the changelog, and a changelog poisoned by the old
    code is healed on restore (discarded, logged), so later events still count exactly;
(c) a gateway 10 minutes ahead: each of its events is dead-lettered as future-dated, every other
    gateway's event counts exactly, metrics and `cacheroute doctor` name that gateway;
(d) a gateway 10 minutes behind: its events are late, counted per gateway, kept on the DLQ (so
    nothing is lost silently), and named by doctor; every other gateway's event counts exactly.
"""

from __future__ import annotations

import time
import urllib.request
from collections import Counter
from pathlib import Path

from confluent_kafka import Producer

from cacheroute.dispatcher.emitter.partitioner import partition_for
from cacheroute.doctor import DoctorOptions, run_doctor
from cacheroute.kafkaio import KafkaRecord, producer_config, read_partition
from cacheroute.schemas import KeyRate, RequestBatch, codec_for
from cacheroute.schemas.codec import dump_json, load_json
from cacheroute.settings import Settings
from cacheroute.topics import ensure_topics, make_admin
from tests.integration.streams_support import (
    T0,
    WorkerProcess,
    produce_batches,
    read_rates,
    streams_worker,
    synthetic_events,
    truth,
)

WINDOW = 20_000
Y2100 = 4_102_444_800_000  # 2100-01-01T00:00:00Z
TEN_MIN = 600_000
Event = tuple[str, int, str]


def _labelled(worker: WorkerProcess, name: str) -> dict[str, float]:
    """label value -> sample of a metric with one label (e.g. `gateway`)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{worker.metrics_port}/metrics") as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(name + "{"):
            head, _, value = line.rpartition(" ")
            out[head.split('"')[1]] = float(value)
    return out


def _read_dlq(settings: Settings, want: int, timeout: float = 60) -> list[KafkaRecord]:
    deadline = time.monotonic() + timeout
    while True:
        records = read_partition(settings, settings.topics["dead_letter"])
        if len(records) >= want or time.monotonic() > deadline:
            return records
        time.sleep(0.5)


def _exact(rates: dict[tuple[str, int], KeyRate], events: list[Event]) -> None:
    """Every event counted once, in its window, with its tokens; no other (key, window)."""
    expected = truth(events, WINDOW)
    assert set(rates) == set(expected)
    for kw, want in expected.items():
        assert rates[kw].count == want["count"], kw
        assert rates[kw].prompt_tokens_sum == 100 * want["count"], kw
    assert sum(r.count for r in rates.values()) == len(events)


def _doctor_clocks(settings: Settings, app_id: str) -> dict[str, dict[str, int]]:
    report = run_doctor(settings, DoctorOptions(streams_group=app_id, dlq_window_min=10))
    by = {f.check: f for f in report.findings}
    clocks = by["gateway-clocks"]
    assert clocks.status == "fail"
    gateways: dict[str, dict[str, int]] = clocks.detail["gateways"]
    for name in gateways:
        assert name in clocks.message
    return gateways


def _shifted(events: list[Event], by_ms: int) -> list[Event]:
    return [(k, t + by_ms, g) for k, t, g in events]


def test_heartbeat_from_2100_among_good_batches_loses_nothing(
    settings: Settings, faust_cleanup: str, tmp_path: Path
) -> None:
    ensure_topics(settings)
    parts = settings.requests_partitions
    events = synthetic_events(seed=13)
    first = [e for e in events if e[1] < T0 + WINDOW + WINDOW // 2]
    rest = [e for e in events if e[1] >= T0 + WINDOW + WINDOW // 2]
    hostile = RequestBatch("gw-hostile", 0, Y2100, [], [], [])
    hostile_value = codec_for(RequestBatch).encode(hostile)
    p = partition_for("A", parts)  # the busiest key's partition
    with streams_worker(settings, faust_cleanup, tmp_path, window_ms=WINDOW) as worker:
        produce_batches(settings, first, parts)
        producer = Producer(producer_config(settings))
        producer.produce(settings.topics["requests"], hostile_value, key=b"gw-hostile", partition=p)
        assert producer.flush(10) == 0
        produce_batches(settings, rest, parts, final_heartbeat_ms=T0 + 3 * WINDOW + 2_500)
        rates = read_rates(settings, set(truth(events, WINDOW)))
        worker.wait_metric("cacheroute_streams_events_accepted_total", len(events))
        dlq = _read_dlq(settings, 1)
        time.sleep(1.0)  # nothing more arrives
        assert worker.metric("cacheroute_streams_events_accepted_total") == len(events)
        assert worker.metric("cacheroute_streams_events_late_total") == 0
        assert worker.metric("cacheroute_streams_batches_dead_lettered_total") == 1
        assert _labelled(worker, "cacheroute_streams_gateway_batches_future_total") == {
            "gw-hostile": 1.0
        }
        assert worker.proc.poll() is None, worker.tail()
        named = _doctor_clocks(settings, faust_cleanup)
    _exact(rates, events)
    assert len(dlq) == 1
    (record,) = dlq
    assert record.value == hostile_value
    reason = (record.header("cacheroute.reason") or b"").decode()
    assert reason.startswith("created_ms 4102444800000 is ")
    assert "ahead of the Kafka timestamp" in reason
    assert reason.endswith("gateway clock skew? (an empty batch)")
    assert record.header("cacheroute.gateway") == b"gw-hostile"
    assert record.header("cacheroute.clock") == b"ahead"
    source = (record.header("cacheroute.source") or b"").decode()
    assert source.startswith(f"{settings.topics['requests']}[{p}]@"), source
    assert set(named) == {"gw-hostile"}
    assert named["gw-hostile"]["ahead_empty_batches"] == 1


def _changelog(settings: Settings, app_id: str) -> str:
    admin = make_admin(settings.bootstrap)
    names = [t for t in admin.list_topics(timeout=10).topics if t.startswith(app_id)]
    (changelog,) = [t for t in names if t.endswith("rate-windows-changelog")]
    return changelog


def _last_meta(settings: Settings, changelog: str, p: int) -> dict[str, int]:
    metas = [r for r in read_partition(settings, changelog, p) if r.key == b"%d|meta" % p]
    assert metas, f"no meta entry on {changelog}[{p}]"
    value = load_json(metas[-1].value or b"{}")
    return {"watermark": int(value["watermark"]), "offset": int(value["offset"])}


def _wait_meta(settings: Settings, changelog: str, p: int, watermark: int) -> dict[str, int]:
    """The partition's last meta entry once it carries `watermark`. A worker writes the meta
    after the window's rates are durable (rates first, state second), so a reader that has seen
    the rates can be a moment ahead of the changelog; stopping the worker then would leave the
    previous meta (safe: the unacked messages are re-delivered, but not what this test checks)."""
    deadline = time.monotonic() + 30.0
    while True:
        meta = _last_meta(settings, changelog, p)
        if meta["watermark"] == watermark or time.monotonic() > deadline:
            return meta
        time.sleep(0.2)


def test_restart_never_restores_a_poisoned_watermark(
    settings: Settings, faust_cleanup: str, tmp_path: Path
) -> None:
    ensure_topics(settings)
    parts = settings.requests_partitions
    events = synthetic_events(seed=17)
    end1 = T0 + 3 * WINDOW + 2_500
    p = partition_for("A", parts)
    producer = Producer(producer_config(settings))
    encode = codec_for(RequestBatch).encode
    with streams_worker(settings, faust_cleanup, tmp_path / "first", window_ms=WINDOW) as first:
        produce_batches(settings, events[: len(events) // 2], parts)
        producer.produce(
            settings.topics["requests"],
            encode(RequestBatch("gw-hostile", 0, Y2100, [], [], [])),
            partition=p,
        )
        assert producer.flush(10) == 0
        produce_batches(settings, events[len(events) // 2 :], parts, final_heartbeat_ms=end1)
        rates1 = read_rates(settings, set(truth(events, WINDOW)))
        first.wait_metric("cacheroute_streams_events_accepted_total", len(events))
        changelog = _changelog(settings, faust_cleanup)
        meta = _wait_meta(settings, changelog, p, end1)
    _exact(rates1, events)
    # the hostile value never reached the changelog: a plain restart restores sane watermarks
    assert meta["watermark"] == end1
    metas = [r for r in read_partition(settings, changelog, p) if r.key == b"%d|meta" % p]
    assert all(load_json(r.value or b"{}")["watermark"] < Y2100 for r in metas)

    # a changelog poisoned by the old code (watermark 2100) must not poison the next worker
    producer.produce(
        changelog,
        key=b"%d|meta" % p,
        value=dump_json({"watermark": Y2100, "offset": meta["offset"]}),
        partition=p,
    )
    assert producer.flush(10) == 0
    later = _shifted(synthetic_events(seed=19), 3 * WINDOW)
    with streams_worker(settings, faust_cleanup, tmp_path / "second", window_ms=WINDOW) as second:
        produce_batches(settings, later, parts, final_heartbeat_ms=end1 + 3 * WINDOW)
        rates = read_rates(settings, set(truth(events + later, WINDOW)))
        second.wait_metric("cacheroute_streams_events_accepted_total", len(later))
        time.sleep(1.0)
        assert second.metric("cacheroute_streams_events_accepted_total") == len(later)
        assert second.metric("cacheroute_streams_events_late_total") == 0
        assert second.proc.poll() is None, second.tail()
        log = second.log.read_text(errors="replace")
        assert f"partition {p}: the changelog's watermark {Y2100} is " in log, second.tail()
        assert "Discarded it and restarted the watermark" in log
        meta = _wait_meta(settings, changelog, p, end1 + 3 * WINDOW)
    # the new windows exact, the old ones not re-emitted with other counts
    _exact(rates, events + later)
    assert meta["watermark"] == end1 + 3 * WINDOW


def test_gateway_ten_minutes_ahead_is_dead_lettered_and_named(
    settings: Settings, faust_cleanup: str, tmp_path: Path
) -> None:
    """Real-time event times (the bound is against the records' Kafka timestamps): gw-2 stamps
    its requests 10 minutes ahead; its batches go first, to poison the watermark if they could."""
    ensure_topics(settings)
    parts = settings.requests_partitions
    now = time.time_ns() // 1_000_000
    base = (now // WINDOW - 4) * WINDOW  # 60-80 s before now: every good event is in the past
    events = _shifted(synthetic_events(seed=23), base - T0)
    good = [e for e in events if e[2] != "gw-2"]
    fast = _shifted([e for e in events if e[2] == "gw-2"], TEN_MIN)
    with streams_worker(settings, faust_cleanup, tmp_path, window_ms=WINDOW) as worker:
        produce_batches(settings, fast, parts)
        produce_batches(settings, good, parts, final_heartbeat_ms=base + 3 * WINDOW + 2_500)
        rates = read_rates(settings, set(truth(good, WINDOW)))
        worker.wait_metric("cacheroute_streams_events_dead_lettered_total", len(fast))
        worker.wait_metric("cacheroute_streams_events_accepted_total", len(good))
        dlq = _read_dlq(settings, len(fast))
        time.sleep(1.0)
        assert worker.metric("cacheroute_streams_events_accepted_total") == len(good)
        assert worker.metric("cacheroute_streams_events_dead_lettered_total") == len(fast)
        assert worker.metric("cacheroute_streams_events_late_total") == 0
        assert _labelled(worker, "cacheroute_streams_gateway_events_future_total") == {
            "gw-2": float(len(fast))
        }
        assert _labelled(worker, "cacheroute_streams_gateway_events_late_total") == {}
        assert worker.proc.poll() is None, worker.tail()
        named = _doctor_clocks(settings, faust_cleanup)
    _exact(rates, good)
    assert len(dlq) == len(fast)
    assert {r.header("cacheroute.gateway") for r in dlq} == {b"gw-2"}
    assert {r.header("cacheroute.clock") for r in dlq} == {b"ahead"}
    reasons = [(r.header("cacheroute.reason") or b"").decode() for r in dlq]
    assert all(
        r.startswith("event time ") and "ahead of the Kafka timestamp" in r for r in reasons
    ), reasons[:3]
    # each dead letter is one event, and they are exactly gw-2's
    dead = Counter(
        (ev["key"], ev["event_time_ms"]) for ev in (load_json(r.value or b"{}") for r in dlq)
    )
    assert dead == Counter((k, t) for k, t, _ in fast)
    # 10 min ahead of events 20-80 s old: between 520 and 600 s ahead of the records' timestamps
    skews = [int(r.header("cacheroute.skew_ms") or b"0") for r in dlq]
    assert 500_000 < min(skews) <= max(skews) <= TEN_MIN
    assert set(named) == {"gw-2"}
    assert named["gw-2"]["ahead_events"] == len(fast)
    assert named["gw-2"]["late_events"] == 0


def test_gateway_ten_minutes_behind_is_counted_late_kept_and_named(
    settings: Settings, faust_cleanup: str, tmp_path: Path
) -> None:
    """gw-2 stamps its requests 10 minutes behind; each 10 s slice of the others' batches goes
    first, then gw-2's: its events belong to windows that closed long ago."""
    ensure_topics(settings)
    parts = settings.requests_partitions
    events = synthetic_events(seed=19)  # "edge" (alone on its partition) not sent by gw-2
    good = [e for e in events if e[2] != "gw-2"]
    slow = _shifted([e for e in events if e[2] == "gw-2"], -TEN_MIN)
    slow_messages = 0
    with streams_worker(settings, faust_cleanup, tmp_path, window_ms=WINDOW) as worker:
        for s in range(6):
            lo, hi = T0 + s * 10_000, T0 + (s + 1) * 10_000
            produce_batches(settings, [e for e in good if lo <= e[1] < hi], parts)
            lagging = [e for e in slow if lo - TEN_MIN <= e[1] < hi - TEN_MIN]
            slow_messages += produce_batches(settings, lagging, parts)
        produce_batches(settings, [], parts, final_heartbeat_ms=T0 + 3 * WINDOW + 2_500)
        rates = read_rates(settings, set(truth(good, WINDOW)))
        worker.wait_metric("cacheroute_streams_events_late_total", len(slow))
        worker.wait_metric("cacheroute_streams_events_accepted_total", len(good))
        dlq = _read_dlq(settings, slow_messages)
        time.sleep(1.0)
        assert worker.metric("cacheroute_streams_events_accepted_total") == len(good)
        assert worker.metric("cacheroute_streams_events_late_total") == len(slow)
        assert worker.metric("cacheroute_streams_late_dead_letters_total") == slow_messages
        assert worker.metric("cacheroute_streams_events_dead_lettered_total") == 0
        assert _labelled(worker, "cacheroute_streams_gateway_events_late_total") == {
            "gw-2": float(len(slow))
        }
        assert worker.proc.poll() is None, worker.tail()
        named = _doctor_clocks(settings, faust_cleanup)
    _exact(rates, good)
    # one DLQ record per gw-2 message, holding exactly its late events: nothing lost silently
    assert len(dlq) == slow_messages
    assert {r.header("cacheroute.gateway") for r in dlq} == {b"gw-2"}
    assert {r.header("cacheroute.clock") for r in dlq} == {b"late"}
    assert sum(int(r.header("cacheroute.events") or b"0") for r in dlq) == len(slow)
    kept: Counter[tuple[str, int]] = Counter()
    for r in dlq:
        batch = codec_for(RequestBatch).decode(r.value or b"")
        assert batch.gateway_id == "gw-2"
        kept.update(zip(batch.keys, batch.event_time_ms, strict=True))
    assert kept == Counter((k, t) for k, t, _ in slow)
    behind = [int(r.header("cacheroute.skew_ms") or b"0") for r in dlq]
    assert TEN_MIN - 60_000 < min(behind) <= max(behind) < TEN_MIN + 60_000
    assert set(named) == {"gw-2"}
    assert named["gw-2"]["late_events"] == len(slow)
    assert named["gw-2"]["ahead_events"] == 0
