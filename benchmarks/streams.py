"""`cacheroute bench streams`: the streams agent's ingest rate against two baselines, same run.

Steps, all on the real broker in fresh topics (a unique prefix, deleted afterwards):
1. preload: N request events with log-normal key popularity through the real gateway `Emitter`
   (event times spread over one window, so the run ends with one window close per partition);
2. raw baseline: a plain confluent-kafka consumer reads every batch and decodes it;
3. agent: one `cacheroute streams run` worker process ingests the same topic;
4. numpy baseline: the batches step 2 decoded, aggregated per key in numpy (no Kafka, no Faust);
5. check: the agent's rates add up to exactly N events, and the numpy per-key figures match them;
6. `emit_ns`: the emitter's cost per `emit()` call (dummy producer), with a list-append baseline.

What each figure measures (seconds are wall clock, `perf_counter`, unless named cpu):
- `raw_seconds`, `raw_events_per_s` = N / `raw_seconds`: the clock starts before `assign()`, so
  before librdkafka's first fetch (only creating the consumer and looking up the end offsets are
  outside it), and stops when every partition has reported EOF at its end offset. Messages are
  taken with a non-blocking `consume()`; only when nothing is queued does it block in `poll()`,
  which returns on the first message or EOF. No timeout is waited out inside the clock: the
  consumer sets `fetch.wait.max.ms=10` because librdkafka reports EOF only from a fetch at the end
  offset, which the broker would otherwise hold for 500 ms (data in the log returns at once).
  `raw_fetch_seconds`: time inside those `consume()`/`poll()` calls (waiting for librdkafka's
  background fetcher and taking messages off its queue; the fetcher thread works while the main
  thread decodes, so this is wait time, not the fetch's CPU). `raw_decode_seconds`: time inside
  the agent's reader on every message: `scan_request_batch` (a batch's columns straight from its
  bytes, schemas/batch_scan.py), and `decode_any` (fastavro) for a record it declines.
  `raw_cpu_seconds`: this process's CPU time over the clock, all threads.
  `raw_messages` counts batches read (the emitter's plus one empty closing heartbeat per partition).
- `agent_seconds`, `events_per_s`: the worker's own clock (its metrics' Unix-time gauges), from
  when it began applying its first batch (`first_batch_timestamp_seconds`: worker start-up, group
  join and its first fetch are outside it) to when the broker acknowledged the flush that emitted
  the last key rates (`last_rates_timestamp_seconds`). It therefore includes the worker's flush
  cadence, closing the window and producing one `KeyRate` per key to the broker, none of which the
  baselines do. The metrics are read every 0.1 s only to notice the end; before, the clock was the
  scrapes themselves, every 20 ms, which cost the worker ~8% of its CPU samples (py-spy) and
  started up to 20 ms late. `agent_events_before_clock` is therefore 0: every event counts.
  `agent_ingest_seconds`: same start, to the end of handling the last message read by the scrape
  that shows all N events accepted (`last_batch_timestamp_seconds`).
  `agent_flush_seconds`: the worker's own `flush_seconds` histogram sum (rates out, changelog,
  acks) over the whole run. `agent_cpu_seconds`: the worker process's CPU time (/proc; null where
  unavailable) between the first scrape that shows a batch and the one that shows every rate, so
  up to 0.1 s of its first work is missed and up to 0.1 s of idle at the end is included. The
  agent's fetch (aiokafka inside Faust) and decode are not instrumented; it reads the same bytes
  with the same reader, so its decode costs about `raw_decode_seconds`.
- `numpy_seconds`, `numpy_events_per_s` = N / `numpy_seconds`: `aggregate_per_key` (sort by
  (key, time), then per key: count, mean and CV of the inter-arrival gaps, as the agent defines
  them) over the decoded key strings and event times already in memory; best of 3 runs. Building
  the numpy arrays from the decoded lists is `numpy_convert_seconds`, not included. This is the
  floor of what the agent's aggregation could cost, not a competitor: no Kafka, no state kept
  between batches, no output. `numpy_mismatched_keys`: keys whose count, mean gap or CV differ
  from the agent's emitted rates (0: both computed the same answer).
- `ratio` = `events_per_s` / `raw_events_per_s`; `ratio_numpy` = `events_per_s` /
  `numpy_events_per_s`.
One run each, on a shared machine: ratios matter more than absolutes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path
from typing import Any

import numpy as np
from confluent_kafka import Consumer, KafkaError, TopicPartition
from rich.console import Console
from rich.progress import Progress

from cacheroute.benchmarks.emitter import bench_emitter
from cacheroute.dispatcher.emitter.config import EmitterConfig
from cacheroute.dispatcher.emitter.emitter import Emitter
from cacheroute.errors import CacheRouteError
from cacheroute.kafkaio import consumer_config, producer_config
from cacheroute.loopback import free_port, scrape_metrics
from cacheroute.progress import progress_bar
from cacheroute.schemas import KeyRate, RequestBatch, codec_for, decode_any
from cacheroute.schemas.batch_scan import ScannedBatch, scan_request_batch
from cacheroute.schemas.batch_scan import warm_up as warm_up_reader
from cacheroute.settings import Settings
from cacheroute.topics import ensure_topics, make_admin

__all__ = ["KeyAggregates", "aggregate_per_key", "bench_streams"]

WINDOW_MS = 60_000
_SCRAPE_S = 0.1
"""How often the agent's metrics are read: its clock comes from the worker's own timestamps, so
this only bounds how soon the end is noticed (each scrape costs the worker a thread and a
rendering of every metric under its GIL: every 20 ms, as before, took ~8% of its samples)."""
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
    # the loop emits faster than one gateway's sealer and producer deliver: drain the emitter
    # well before its memory bound (max_buffered_events), so the preload never drops an event
    drain_every = max(EmitterConfig().max_buffered_events // 4, 1)
    for i in range(events):
        emit(names[ids[i]], pr[i], prefix_tokens=pr[i] // 2, event_time_ms=ts[i])
        if i % step == 0:
            progress.update(task, completed=i)
        if i % drain_every == drain_every - 1 and not emitter.flush(120):
            raise CacheRouteError("emitter could not deliver the preload in 120 s")
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


@dataclass(frozen=True)
class KeyAggregates:
    """Per-key figures of one window: `keys` ascending, the others aligned with it."""

    keys: np.ndarray
    counts: np.ndarray
    """Events per key (int64)."""
    mean_gap_ms: np.ndarray
    """Mean inter-arrival gap (float64): (last - first) / (count - 1); NaN below 2 events."""
    cv: np.ndarray
    """Std/mean of the gaps (population std, float64); NaN below 3 events or a zero mean."""


def aggregate_per_key(keys: np.ndarray, times_ms: np.ndarray) -> KeyAggregates:
    """The numpy baseline: group events by key and aggregate, no Kafka, no Faust, no state.

    `keys` (any sortable dtype, e.g. the decoded key strings) and `times_ms` (int) are one event
    per element, in any order. Sorting by (key, time) gives each key's merged stream in time order,
    the stream whose gaps the agent's estimator measures (streams/keyagg.py): the mean gap is
    (last - first) / (count - 1), the CV is the population std of the gaps over their mean.
    """
    n = len(keys)
    if n == 0:
        empty = np.empty(0)
        return KeyAggregates(keys[:0], np.empty(0, np.int64), empty, empty.copy())
    order = np.lexsort((times_ms, keys))
    k = keys[order]
    t = np.asarray(times_ms)[order].astype(np.int64)
    first = np.empty(n, dtype=bool)
    first[0] = True
    np.not_equal(k[1:], k[:-1], out=first[1:])
    starts = np.flatnonzero(first)
    groups = len(starts)
    counts = np.diff(np.append(starts, n)).astype(np.int64)
    same = ~first[1:]  # gap i (between events i and i+1) lies inside one key
    gap_group = (np.cumsum(first) - 1)[1:][same]
    gaps = np.diff(t)[same].astype(np.float64)
    ngaps = counts - 1
    with np.errstate(divide="ignore", invalid="ignore"):
        mean = np.bincount(gap_group, weights=gaps, minlength=groups) / ngaps
        dev = gaps - mean[gap_group]
        var = np.bincount(gap_group, weights=dev * dev, minlength=groups) / ngaps
        cv = np.sqrt(var) / mean
    mean[ngaps < 1] = np.nan
    cv[(ngaps < 2) | ~(mean > 0)] = np.nan
    return KeyAggregates(k[starts], counts, mean, cv)


@dataclass
class _RawRead:
    seconds: float = 0.0
    fetch_s: float = 0.0
    decode_s: float = 0.0
    cpu_s: float = 0.0
    messages: int = 0
    events: int = 0
    records: list[RequestBatch | ScannedBatch] = field(default_factory=list)
    """What the reader returned for each message (turned into columns after the clock)."""


def _raw_read(settings: Settings, expected_events: int, progress: Progress) -> _RawRead:
    """The plain-consumer baseline (see the module docstring for what its clock covers)."""
    topic = settings.topics["requests"]
    config = consumer_config(settings, group_id=f"bench-raw-{uuid.uuid4().hex}")
    config["enable.partition.eof"] = True  # the stop condition; consumer_config sets it too
    # librdkafka reports EOF only from a fetch *at* the end offset, which the broker holds up to
    # fetch.wait.max.ms (500 ms by default) for data that never comes: an idle wait at the end of
    # the clock. Data already in the log is returned at once whatever this setting.
    config["fetch.wait.max.ms"] = 10
    consumer = Consumer(config)
    warm_up_reader()  # its compiled loop loads outside the clock, as the agent's does at start
    parts = [TopicPartition(topic, p, 0) for p in range(settings.requests_partitions)]
    ends = {p.partition: consumer.get_watermark_offsets(p, timeout=10)[1] for p in parts}
    task = progress.add_task("baseline: plain consumer + decode", total=expected_events)
    try:
        return _read_to_eof(
            consumer, parts, ends, lambda seen: progress.update(task, completed=seen)
        )
    finally:
        consumer.close()


def _read_to_eof(
    consumer: Consumer,
    parts: list[TopicPartition],
    ends: dict[int, int],
    report: Callable[[int], object],
) -> _RawRead:
    """Assign `parts`, read and decode until each has reported EOF at its end offset; timed."""
    out = _RawRead()
    eofs: dict[int, int] = {}  # partition -> EOFs reported (at any offset)
    done: set[int] = set()  # partitions that reported EOF at their end offset
    consume, poll, clock = consumer.consume, consumer.poll, time.perf_counter
    deadline = time.monotonic() + 600
    cpu0 = time.process_time()
    began = clock()
    consumer.assign(parts)
    while len(done) < len(parts):
        t0 = clock()
        batch = consume(num_messages=500, timeout=0)  # what is queued now, no waiting
        if not batch:  # nothing queued: block until the first message or EOF arrives
            msg = poll(1.0)
            batch = [] if msg is None else [msg]
        out.fetch_s += clock() - t0
        for msg in batch:
            err = msg.error()
            if err is not None:
                if err.code() != KafkaError._PARTITION_EOF:
                    raise CacheRouteError(f"baseline consumer: {err}")
                p = msg.partition() or 0
                eofs[p] = eofs.get(p, 0) + 1
                if (msg.offset() or 0) >= ends[p]:
                    done.add(p)
                continue
            d0 = clock()
            value = msg.value()
            # the agent's reader: columns straight from the bytes, fastavro for the rest
            scanned = None if value is None else scan_request_batch(value)
            record: RequestBatch | ScannedBatch | Any = scanned or decode_any(
                value, topic=msg.topic(), partition=msg.partition(), offset=msg.offset()
            )
            out.decode_s += clock() - d0
            if not isinstance(record, RequestBatch | ScannedBatch):
                raise CacheRouteError(f"baseline: a {type(record).__name__} on {msg.topic()}")
            out.records.append(record)
            out.events += len(record)
            out.messages += 1
        if time.monotonic() > deadline:
            raise CacheRouteError(f"baseline: not every partition reached EOF in 600 s ({eofs})")
        report(out.events)
    out.seconds = clock() - began
    out.cpu_s = time.process_time() - cpu0
    return out


@dataclass
class _AgentRun:
    seconds: float
    ingest_seconds: float | None
    events_before_clock: int
    cpu_s: float | None
    metrics: dict[str, float]


def _cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of a process so far (Linux /proc), None where unavailable."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def _run_agent(
    settings: Settings, expected_events: int, expected_rates: int, home: Path, progress: Progress
) -> _AgentRun:
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
    started = False
    ingested: float | None = None
    cpu0: float | None = None
    metrics: dict[str, float] = {}
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise CacheRouteError(f"the streams worker exited; see {log}")
            metrics = scrape_metrics(port)
            if not started and metrics.get("cacheroute_streams_batches_total", 0) > 0:
                started = True
                cpu0 = _cpu_seconds(proc.pid)
            emitted = metrics.get("cacheroute_streams_rates_emitted_total", 0)
            progress.update(task, completed=emitted)
            accepted = metrics.get("cacheroute_streams_events_accepted_total", 0)
            first = metrics.get("cacheroute_streams_first_batch_timestamp_seconds", 0.0)
            if started and ingested is None and accepted >= expected_events:
                ingested = metrics["cacheroute_streams_last_batch_timestamp_seconds"] - first
            if started and emitted >= expected_rates:
                cpu1 = _cpu_seconds(proc.pid)
                cpu = None if cpu0 is None or cpu1 is None else cpu1 - cpu0
                end = metrics["cacheroute_streams_last_rates_timestamp_seconds"]
                return _AgentRun(end - first, ingested, 0, cpu, metrics)
            time.sleep(_SCRAPE_S)
        raise CacheRouteError(f"the agent did not emit all rates in 600 s; see {log}")
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def _agent_rates(settings: Settings, expected_rates: int) -> dict[tuple[str, int], KeyRate]:
    """The latest `KeyRate` per (key, window) on the rates topic."""
    topic = settings.topics["rates"]
    consumer = Consumer(consumer_config(settings, group_id=f"bench-rates-{uuid.uuid4().hex}"))
    meta = consumer.list_topics(topic, timeout=10)
    consumer.assign([TopicPartition(topic, p, 0) for p in meta.topics[topic].partitions])
    decode = codec_for(KeyRate).decode
    latest: dict[tuple[str, int], KeyRate] = {}
    deadline = time.monotonic() + 60
    try:
        while len(latest) < expected_rates and time.monotonic() < deadline:
            for msg in consumer.consume(num_messages=1000, timeout=0.5):
                if msg.error() is None:
                    r = decode(msg.value())
                    latest[(r.key, r.window_start_ms)] = r
    finally:
        consumer.close()
    return latest


def _numpy_baseline(raw: _RawRead, repeats: int = 3) -> tuple[KeyAggregates, float, float]:
    """(aggregates, best aggregation seconds of `repeats`, seconds to build the arrays)."""
    began = time.perf_counter()
    keys = np.array(
        list(
            chain.from_iterable(
                r.keys if isinstance(r, RequestBatch) else [r.key(i) for i in range(len(r))]
                for r in raw.records
            )
        )
    )
    times = np.fromiter(
        chain.from_iterable(
            r.event_time_ms if isinstance(r, RequestBatch) else r.event_time_ms.tolist()
            for r in raw.records
        ),
        dtype=np.int64,
        count=raw.events,
    )
    convert_s = time.perf_counter() - began
    best = float("inf")
    agg = aggregate_per_key(keys, times)
    for _ in range(repeats):
        began = time.perf_counter()
        agg = aggregate_per_key(keys, times)
        best = min(best, time.perf_counter() - began)
    return agg, best, convert_s


def _mismatches(agg: KeyAggregates, rates: dict[tuple[str, int], KeyRate]) -> int:
    """Keys whose count, mean gap or CV differ between the numpy baseline and the agent."""
    by_key: dict[str, list[KeyRate]] = {}
    for (key, _), rate in rates.items():
        by_key.setdefault(key, []).append(rate)

    def same(ours: float, theirs: float | None) -> bool:
        if theirs is None or np.isnan(ours):
            return theirs is None and bool(np.isnan(ours))
        return bool(abs(ours - theirs) <= 1e-6 * max(abs(theirs), 1.0))

    bad = len(set(by_key) - {str(k) for k in agg.keys.tolist()})
    for key, count, mean, cv in zip(
        agg.keys.tolist(),
        agg.counts.tolist(),
        agg.mean_gap_ms.tolist(),
        agg.cv.tolist(),
        strict=True,
    ):
        theirs = by_key.get(str(key), [])
        if not (
            len(theirs) == 1
            and theirs[0].count == count
            and same(mean, theirs[0].interarrival_mean_ms)
            and same(cv, theirs[0].interarrival_cv)
        ):
            bad += 1
    return bad


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
            raw = _raw_read(bench_settings, events, progress)
            agent = _run_agent(bench_settings, events, distinct, Path(tmp), progress)
        rates = _agent_rates(bench_settings, distinct)
        agg, numpy_s, convert_s = _numpy_baseline(raw)
        raw.records.clear()  # the decoded columns: about 100 MB at a million events
        emit = bench_emitter(events=min(events, 300_000), keys=keys, seed=seed)
    finally:
        admin = make_admin(bench_settings)
        ours = [t for t in admin.list_topics(timeout=10).topics if t.startswith(run.rstrip("."))]
        if ours:
            for fut in admin.delete_topics(ours, operation_timeout=30).values():
                fut.result(timeout=30)
    counted = sum(r.count for r in rates.values())
    agent_eps = (events - agent.events_before_clock) / agent.seconds
    raw_eps = events / raw.seconds
    numpy_eps = events / numpy_s
    result.update(
        {
            "partitions": bench_settings.requests_partitions,
            "messages": messages,
            "batch_size": round(events / max(messages, 1), 1),
            "distinct_keys": distinct,
            "events_per_s": round(agent_eps),
            "agent_seconds": round(agent.seconds, 3),
            "agent_ingest_seconds": None
            if agent.ingest_seconds is None
            else round(agent.ingest_seconds, 3),
            "agent_events_before_clock": agent.events_before_clock,
            "agent_cpu_seconds": None if agent.cpu_s is None else round(agent.cpu_s, 3),
            "agent_flush_seconds": round(
                agent.metrics.get("cacheroute_streams_flush_seconds_sum", 0.0), 3
            ),
            "raw_events_per_s": round(raw_eps),
            "raw_seconds": round(raw.seconds, 3),
            "raw_fetch_seconds": round(raw.fetch_s, 3),
            "raw_decode_seconds": round(raw.decode_s, 3),
            "raw_cpu_seconds": round(raw.cpu_s, 3),
            "raw_messages": raw.messages,
            "raw_events": raw.events,
            "numpy_events_per_s": round(numpy_eps),
            "numpy_seconds": round(numpy_s, 4),
            "numpy_convert_seconds": round(convert_s, 3),
            "numpy_keys": len(agg.keys),
            "numpy_mismatched_keys": _mismatches(agg, rates),
            "ratio": round(agent_eps / raw_eps, 3),
            "ratio_numpy": round(agent_eps / numpy_eps, 3),
            "rates_emitted": int(agent.metrics.get("cacheroute_streams_rates_emitted_total", 0)),
            "events_counted": counted,
            "exact": counted == events,
            "emit_ns": emit.get("emit_ns"),
            "emit_baseline_ns": emit.get("baseline_ns"),
            "emit_ratio": emit.get("ratio"),
            "window_ms": WINDOW_MS,
        }
    )
    return result
