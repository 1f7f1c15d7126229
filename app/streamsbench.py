"""`cacheroute bench streams`: the streams agent's ingest rate against a plain consumer, same run.

Steps, all on the real broker in fresh topics (a unique prefix, deleted afterwards):
1. preload: N request events with log-normal key popularity through the real gateway `Emitter`
   (event times spread over one window, so the run ends with one window close per partition);
2. baseline: a plain confluent-kafka consumer reads every batch and decodes it (`raw_events_per_s`);
3. agent: one `cacheroute streams run` worker process ingests the same topic; the clock runs from
   its first batch to the moment all key rates of the window are emitted (`events_per_s`);
4. check: the emitted rates add up to exactly N events;
5. `emit_ns`: the emitter's cost per `emit()` call (dummy producer), with a list-append baseline.
Ratios matter more than absolutes: the machine is shared.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
from confluent_kafka import Consumer, KafkaError, TopicPartition
from rich.console import Console
from rich.progress import Progress

from cacheroute.dispatcher.emitter import Emitter
from cacheroute.dispatcher.emitter_bench import bench_emitter
from cacheroute.dispatcher.emitter_config import EmitterConfig
from cacheroute.errors import CacheRouteError
from cacheroute.kafkaio import consumer_config, producer_config
from cacheroute.loopback import free_port, scrape_metrics
from cacheroute.progress import progress_bar
from cacheroute.schemas import KeyRate, RequestBatch, codec_for
from cacheroute.settings import Settings
from cacheroute.topics import ensure_topics, make_admin

__all__ = ["bench_streams"]

WINDOW_MS = 60_000
GRACE_MS = 5_000


def _preload(
    settings: Settings, events: int, keys: int, *, seed: int, t0: int, progress: Progress
) -> tuple[int, int]:
    rng = np.random.default_rng(seed)
    weights = rng.lognormal(0.0, 1.5, keys)
    weights /= weights.sum()
    key_ids = rng.choice(keys, size=events, p=weights)
    times = t0 + np.sort(rng.integers(0, WINDOW_MS - 10_000, events))
    names = [f"tenant-{i:06d}/conv" for i in range(keys)]
    prompt = rng.integers(200, 4000, events)
    emitter = Emitter(settings, "bench-gw", EmitterConfig(), clock_ms=lambda: t0)
    task = progress.add_task("preload (real emitter -> broker)", total=events)
    emit = emitter.emit
    ids, ts, pr = key_ids.tolist(), times.tolist(), prompt.tolist()
    step = max(events // 100, 1)
    for i in range(events):
        emit(names[ids[i]], pr[i], prefix_tokens=pr[i] // 2, event_time_ms=ts[i])
        if i % step == 0:
            progress.update(task, completed=i)
    if not emitter.flush(120):
        raise CacheRouteError("emitter could not deliver the preload in 120 s")
    stats = emitter.stats()
    emitter.close()
    progress.update(task, completed=events)
    if stats.dropped or stats.rejected:
        raise CacheRouteError(f"emitter dropped {stats.dropped} / rejected {stats.rejected} events")
    # one heartbeat per partition past the window's end + grace closes the window everywhere
    from confluent_kafka import Producer  # noqa: PLC0415

    producer = Producer(producer_config(settings))
    encode = codec_for(RequestBatch).encode
    close_at = t0 + WINDOW_MS + GRACE_MS + 1
    for p in range(settings.requests_partitions):
        hb = RequestBatch("bench-closer", 0, close_at, [], [], [])
        producer.produce(settings.topics["requests"], encode(hb), partition=p)
    producer.flush(30)
    return len(set(ids)), int(stats.batches_sent)


def _raw_read(settings: Settings, expected_events: int, progress: Progress) -> tuple[float, int]:
    topic = settings.topics["requests"]
    consumer = Consumer(consumer_config(settings, group_id=f"bench-raw-{uuid.uuid4().hex}"))
    decode = codec_for(RequestBatch).decode
    parts = [TopicPartition(topic, p, 0) for p in range(settings.requests_partitions)]
    ends = {p.partition: consumer.get_watermark_offsets(p, timeout=10)[1] for p in parts}
    consumer.assign(parts)
    task = progress.add_task("baseline: plain consumer + decode", total=expected_events)
    seen = messages = 0
    done: set[int] = {p for p, end in ends.items() if end == 0}
    began: float | None = None  # from the first message, as for the agent: no connect time
    try:
        while len(done) < len(parts):
            for msg in consumer.consume(num_messages=500, timeout=1.0):
                if began is None:
                    began = time.perf_counter()
                err = msg.error()
                if err is not None:
                    if err.code() != KafkaError._PARTITION_EOF:
                        raise CacheRouteError(f"baseline consumer: {err}")
                    continue
                seen += len(decode(msg.value()).keys)
                messages += 1
                if (msg.offset() or 0) >= ends[msg.partition() or 0] - 1:
                    done.add(msg.partition() or 0)
            progress.update(task, completed=seen)
        elapsed = time.perf_counter() - (began or time.perf_counter())
    finally:
        consumer.close()
    return elapsed, messages


def _run_agent(
    settings: Settings, expected_rates: int, home: Path, progress: Progress
) -> tuple[float, dict[str, float], str]:
    port = free_port()
    log = home / "worker.log"
    argv = [
        sys.executable,
        "-m",
        "cacheroute",
        "--bootstrap",
        settings.bootstrap,
        "--topic-prefix",
        settings.topic_prefix,
        "streams",
        "run",
        "--window-ms",
        str(WINDOW_MS),
        "--grace-ms",
        str(GRACE_MS),
        "--app-id",
        settings.topic_prefix.rstrip(".") + "-streams",
        "--metrics-port",
        str(port),
        "--loglevel",
        "warn",
    ]
    task = progress.add_task("agent: faust worker ingest", total=expected_rates)
    with log.open("wb") as out:
        proc = subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=dict(os.environ, CACHEROUTE_HOME=str(home)),
            start_new_session=True,
        )
    first: float | None = None
    metrics: dict[str, float] = {}
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise CacheRouteError(f"the streams worker exited; see {log}")
            metrics = scrape_metrics(port)
            now = time.perf_counter()
            if first is None and metrics.get("cacheroute_streams_batches_total", 0) > 0:
                first = now
            emitted = metrics.get("cacheroute_streams_rates_emitted_total", 0)
            progress.update(task, completed=emitted)
            if first is not None and emitted >= expected_rates:
                return now - first, metrics, log.read_text(errors="replace")[-2000:]
            time.sleep(0.02)
        raise CacheRouteError(f"the agent did not emit all rates in 600 s; see {log}")
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def _rates_total(settings: Settings, expected_rates: int) -> int:
    topic = settings.topics["rates"]
    consumer = Consumer(consumer_config(settings, group_id=f"bench-rates-{uuid.uuid4().hex}"))
    meta = consumer.list_topics(topic, timeout=10)
    consumer.assign([TopicPartition(topic, p, 0) for p in meta.topics[topic].partitions])
    decode = codec_for(KeyRate).decode
    latest: dict[tuple[str, int], int] = {}
    deadline = time.monotonic() + 60
    try:
        while len(latest) < expected_rates and time.monotonic() < deadline:
            for msg in consumer.consume(num_messages=1000, timeout=0.5):
                if msg.error() is None:
                    r = decode(msg.value())
                    latest[(r.key, r.window_start_ms)] = r.count
    finally:
        consumer.close()
    return sum(latest.values())


def bench_streams(
    settings: Settings, events: int, keys: int, seed: int = 0, console: Console | None = None
) -> dict[str, Any]:
    """Run the benchmark described in the module docstring; return its figures."""
    console = console or Console(stderr=True)
    run = f"bench-{uuid.uuid4().hex[:8]}."
    bench_settings = settings.with_overrides(topic_prefix=run)
    # two windows back: every event and the closing heartbeat are in the past, as a real
    # gateway's are (the agent dead-letters records dated ahead of their Kafka timestamp)
    t0 = ((time.time_ns() // 1_000_000) // WINDOW_MS - 2) * WINDOW_MS
    ensure_topics(bench_settings)
    result: dict[str, Any] = {"events": events, "keys": keys, "seed": seed}
    try:
        with (
            progress_bar(console) as progress,
            tempfile.TemporaryDirectory(prefix="cacheroute-bench-") as tmp,
        ):
            began = time.perf_counter()
            distinct, messages = _preload(
                bench_settings, events, keys, seed=seed, t0=t0, progress=progress
            )
            result["preload_s"] = round(time.perf_counter() - began, 3)
            raw_s, raw_messages = _raw_read(bench_settings, events, progress)
            agent_s, metrics, _ = _run_agent(bench_settings, distinct, Path(tmp), progress)
        counted = _rates_total(bench_settings, distinct)
        emit = bench_emitter(events=min(events, 300_000), keys=keys, seed=seed)
    finally:
        admin = make_admin(bench_settings)
        ours = [t for t in admin.list_topics(timeout=10).topics if t.startswith(run.rstrip("."))]
        if ours:
            for fut in admin.delete_topics(ours, operation_timeout=30).values():
                fut.result(timeout=30)
    result.update(
        {
            "partitions": bench_settings.requests_partitions,
            "messages": messages,
            "batch_size": round(events / max(messages, 1), 1),
            "distinct_keys": distinct,
            "events_per_s": round(events / agent_s),
            "agent_seconds": round(agent_s, 3),
            "raw_events_per_s": round(events / raw_s),
            "raw_seconds": round(raw_s, 3),
            "raw_messages": raw_messages,
            "ratio": round((events / agent_s) / (events / raw_s), 3),
            "rates_emitted": int(metrics.get("cacheroute_streams_rates_emitted_total", 0)),
            "events_counted": counted,
            "exact": counted == events,
            "emit_ns": emit.get("emit_ns"),
            "emit_baseline_ns": emit.get("baseline_ns"),
            "emit_ratio": emit.get("ratio"),
            "window_ms": WINDOW_MS,
        }
    )
    return result
