"""Helpers for the streams integration tests: worker processes, synthetic gateways, rate readers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from confluent_kafka import Consumer, KafkaError, TopicPartition

from cacheroute.dispatcher.emitter.partitioner import partition_for
from cacheroute.kafkaio import consumer_config, producer_config
from cacheroute.loopback import free_port, scrape_metrics
from cacheroute.schemas import KeyRate, RequestBatch, codec_for
from cacheroute.settings import Settings

T0 = 1_700_000_040_000  # aligned to 20 s windows


@dataclass
class WorkerProcess:
    """One `cacheroute streams run` subprocess."""

    proc: subprocess.Popen[bytes]
    metrics_port: int
    log: Path

    def metric(self, name: str) -> float:
        """Sum of a Prometheus metric's samples (0 when absent or the worker is down)."""
        return scrape_metrics(self.metrics_port, (name,)).get(name, 0.0)

    def wait_metric(self, name: str, at_least: float, timeout: float = 60) -> float:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = self.metric(name)
            if value >= at_least:
                return value
            if self.proc.poll() is not None:
                raise AssertionError(f"worker exited: {self.tail()}")
            time.sleep(0.2)
        raise AssertionError(f"{name} stayed below {at_least}; worker log:\n{self.tail()}")

    def tail(self) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-40:])


@contextmanager
def streams_worker(
    settings: Settings,
    app_id: str,
    home: Path,
    *,
    window_ms: int = 20_000,
    commit_interval: float = 2.8,
) -> Iterator[WorkerProcess]:
    """Run a worker until the block ends (then SIGTERM, SIGKILL if needed)."""
    port = free_port()
    log = home / f"worker-{port}.log"
    home.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, CACHEROUTE_HOME=str(home))
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
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
                str(window_ms),
                "--grace-ms",
                "2000",
                "--reorder-ms",
                "1000",
                "--buckets",
                "8",
                "--app-id",
                app_id,
                "--flush-interval",
                "0.3",
                "--commit-interval",
                str(commit_interval),
                "--metrics-port",
                str(port),
                "--loglevel",
                "info",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    worker = WorkerProcess(proc, port, log)
    try:
        yield worker
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


def synthetic_events(seed: int = 1, seconds: int = 60) -> list[tuple[str, int, str]]:
    """(key, event time, gateway): A Poisson 50/s, B periodic 5/s, C gamma CV 2 at 10/s, and two
    events on a window boundary; each event goes through one of three gateways at random."""
    rng = np.random.default_rng(seed)
    span = seconds * 1000
    a = np.cumsum(rng.exponential(20.0, 4000))
    b = np.arange(0, span, 200.0)
    shape = 0.25
    c = np.cumsum(rng.gamma(shape, 100.0 / shape, 2000))
    events: list[tuple[str, int]] = []
    for key, times in (("A", a), ("B", b), ("C", c)):
        events += [(key, T0 + int(t)) for t in times if t < span]
    events += [("edge", T0 + 19_999), ("edge", T0 + 20_000)]
    gateways = ["gw-0", "gw-1", "gw-2"]
    return [(k, t, gateways[int(rng.integers(3))]) for k, t in events]


def truth(
    events: list[tuple[str, int, str]], window_ms: int = 20_000
) -> dict[tuple[str, int], dict[str, float | None]]:
    by: dict[tuple[str, int], list[int]] = defaultdict(list)
    for k, t, _ in events:
        by[(k, t - t % window_ms)].append(t)
    out: dict[tuple[str, int], dict[str, float | None]] = {}
    for kw, times in by.items():
        arr = np.sort(np.array(times, dtype=np.int64))
        gaps = np.diff(arr).astype(float)
        cv = float(gaps.std() / gaps.mean()) if len(gaps) >= 2 and gaps.mean() > 0 else None
        out[kw] = {"count": len(arr), "cv": cv}
    return out


def produce_batches(
    settings: Settings,
    events: list[tuple[str, int, str]],
    partitions: int,
    span_ms: int = 100,
    final_heartbeat_ms: int | None = None,
) -> int:
    """Send events as each gateway would: per partition, one RequestBatch per `span_ms` of event
    time, gateways interleaved by seal time (gateway i lags 40*i ms). Returns messages sent."""
    from confluent_kafka import Producer  # noqa: PLC0415

    producer = Producer(producer_config(settings))
    topic = settings.topics["requests"]
    encode = codec_for(RequestBatch).encode
    groups: dict[tuple[str, int, int], list[tuple[str, int]]] = defaultdict(list)
    for key, t, gw in events:
        groups[(gw, partition_for(key, partitions), t // span_ms)].append((key, t))
    seqs: dict[tuple[str, int], int] = defaultdict(int)
    sends = []
    for (gw, p, chunk), items in groups.items():
        items.sort(key=lambda e: e[1])
        sealed = (chunk + 1) * span_ms + 40 * int(gw.split("-")[1])
        sends.append((sealed, gw, p, items))
    sends.sort(key=lambda s: (s[0], s[1], s[2]))
    for sealed, gw, p, items in sends:
        seq = seqs[(gw, p)]
        seqs[(gw, p)] += 1
        batch = RequestBatch(
            gateway_id=gw,
            seq=seq,
            created_ms=sealed,
            keys=[k for k, _ in items],
            event_time_ms=[t for _, t in items],
            prompt_tokens=[100] * len(items),
            prefix_tokens=[60] * len(items),
        )
        producer.produce(topic, value=encode(batch), key=gw.encode(), partition=p)
        producer.poll(0)
    count = len(sends)
    if final_heartbeat_ms is not None:
        for p in range(partitions):
            hb = RequestBatch("gw-0", 10**6, final_heartbeat_ms, [], [], [])
            producer.produce(topic, value=encode(hb), key=b"gw-0", partition=p)
            count += 1
    assert producer.flush(30) == 0
    return count


def read_rates(
    settings: Settings,
    until: set[tuple[str, int]],
    timeout: float = 90,
    worker: WorkerProcess | None = None,
) -> dict[tuple[str, int], KeyRate]:
    """Consume `rates` from the start until every (key, window) in `until` has a record.

    `worker`: the worker expected to write them; its log's tail goes into the failure message
    (a CI run once waited 90 s for a restarted worker's rates, and nothing said why)."""
    consumer = Consumer(consumer_config(settings, group_id=f"rates-reader-{time.time_ns()}"))
    topic = settings.topics["rates"]
    meta = consumer.list_topics(topic, timeout=10)
    consumer.assign([TopicPartition(topic, p, 0) for p in meta.topics[topic].partitions])
    decode = codec_for(KeyRate).decode
    got: dict[tuple[str, int], KeyRate] = {}
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline and not until <= set(got):
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            err = msg.error()
            if err is not None:
                if err.code() != KafkaError._PARTITION_EOF:
                    raise AssertionError(str(err))
                continue
            rate = decode(msg.value())
            got[(rate.key, rate.window_start_ms)] = rate
    finally:
        consumer.close()
    missing = until - set(got)
    log = "" if worker is None else f"; worker log:\n{worker.tail()}"
    assert not missing, f"no rates for {sorted(missing)[:10]} after {timeout}s{log}"
    return got
