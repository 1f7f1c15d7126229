"""A flood of malformed records into `requests` while valid events flow, through a real
`cacheroute streams run` worker.

Bad records of every kind the agent knows: random bytes, a record of the wrong schema (a KeyRate),
batches with columns of unequal length (each dead-lettered whole), and inside otherwise good
batches: huge keys, empty keys, negative tokens, event times far in the future or the past (each
dead-lettered alone, the batch's good events still count). What is lost: nothing — every bad record
is on the dead-letter topic with a `cacheroute.reason` header, the worker's DLQ counters equal the
DLQ record count, every good event is counted in the emitted `KeyRate`s, the worker never
exits, and `cacheroute doctor` sees the streams group caught up and the DLQ holding the flood.
"""

from __future__ import annotations

import random
import signal
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import Producer

from cacheroute.dispatcher.emitter.partitioner import partition_for
from cacheroute.doctor import DoctorOptions, run_doctor
from cacheroute.kafkaio import KafkaRecord, producer_config, read_partition
from cacheroute.schemas import KeyRate, RequestBatch, codec_for
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
END = T0 + 3 * WINDOW + 2_000 + 500
SLICE = 10_000  # good events go out in 6 slices of event time; a flood of bad ones before each


def _flood(
    rng: random.Random, partitions: int, at_ms: int, seq: int
) -> tuple[list[tuple[int, bytes]], list[tuple[str, int, str]], int, int]:
    """Bad records for one slice: (partition, value) to send, the good events hidden among them,
    the expected whole-batch dead letters and the expected single-event dead letters."""
    batch_codec = codec_for(RequestBatch)
    out: list[tuple[int, bytes]] = []
    good: list[tuple[str, int, str]] = []
    whole = 0
    single = 0
    # random bytes (some with the right marker, so decoding gets further before failing)
    for _ in range(10):
        head = b"\xc3\x01" if rng.random() < 0.5 else b""
        out.append((rng.randrange(partitions), head + rng.randbytes(rng.randrange(1, 300))))
        whole += 1
    # a record of the wrong schema
    rate = KeyRate("k", at_ms, at_ms + WINDOW, 3, 0.15)
    out.append((rng.randrange(partitions), codec_for(KeyRate).encode(rate)))
    whole += 1
    # unequal column lengths
    for cols in ((3, 2, 3), (3, 3, 1), (1, 0, 1)):
        n_keys, n_times, n_tokens = cols
        batch = RequestBatch(
            gateway_id="gw-bad",
            seq=seq,
            created_ms=at_ms,
            keys=["uneq"] * n_keys,
            event_time_ms=[at_ms] * n_times,
            prompt_tokens=[10] * n_tokens,
        )
        out.append((rng.randrange(partitions), batch_codec.encode(batch, validate=False)))
        whole += 1
    # batches whose bad events sit among good ones
    bad_events: list[tuple[str, int, int]] = [
        ("x" * 5000, at_ms + 10, 10),  # key far above max_key_bytes
        ("é" * 600, at_ms + 11, 10),  # 1200 bytes of UTF-8
        ("", at_ms + 12, 10),  # empty key
        ("mixed", at_ms + 13, -7),  # negative prompt tokens
        ("mixed", at_ms + 10**9, 10),  # 11 days in the future of its batch
        ("mixed", at_ms - 10**10, 10),  # 115 days in the past
    ]
    p = partition_for("mixed", partitions)
    for i in range(3):
        keys, times, tokens = [], [], []
        for j in range(4):  # good events of key "mixed" on the same partition
            t = at_ms + 100 * i + j
            keys.append("mixed")
            times.append(t)
            tokens.append(100)
            good.append(("mixed", t, "gw-mixed"))
        for key, t, tok in bad_events:
            keys.append(key)
            times.append(t)
            tokens.append(tok)
            single += 1
        order = list(range(len(keys)))
        rng.shuffle(order)
        batch = RequestBatch(
            gateway_id="gw-mixed",
            seq=seq * 10 + i,
            created_ms=at_ms + 100 * i + 50,
            keys=[keys[o] for o in order],
            event_time_ms=[times[o] for o in order],
            prompt_tokens=[tokens[o] for o in order],
            prefix_tokens=[60] * len(order),
        )
        out.append((p, batch_codec.encode(batch, validate=False)))
    return out, good, whole, single


@dataclass
class Flood:
    """What went into `requests` so far: the good events and the bad records' expected counts."""

    settings: Settings
    rng: random.Random = field(default_factory=lambda: random.Random(8))
    events: list[tuple[str, int, str]] = field(default_factory=lambda: synthetic_events(seed=8))
    good: list[tuple[str, int, str]] = field(default_factory=list)
    whole: int = 0
    single: int = 0

    def send(self, slices: range) -> None:
        """For each slice: a flood of bad records, then the slice's good events."""
        partitions = self.settings.requests_partitions
        producer = Producer(producer_config(self.settings))
        topic = self.settings.topics["requests"]
        for s in slices:
            start = T0 + s * SLICE
            bad, hidden, whole, single = _flood(self.rng, partitions, start, s)
            for p, value in bad:
                producer.produce(topic, value, key=b"gw-bad", partition=p)
            assert producer.flush(30) == 0
            self.good += hidden
            self.whole += whole
            self.single += single
            chunk = [e for e in self.events if start <= e[1] < start + SLICE]
            self.good += chunk
            produce_batches(
                self.settings, chunk, partitions, final_heartbeat_ms=END if s == 5 else None
            )


def _check_rates(rates: dict[tuple[str, int], KeyRate], good: list[tuple[str, int, str]]) -> None:
    """Every good event counted, in the right window, no more."""
    expected = truth(good, WINDOW)
    assert set(rates) == set(expected)
    for kw, want in expected.items():
        assert rates[kw].count == want["count"], kw
        assert rates[kw].prompt_tokens_sum == 100 * want["count"], kw
    assert sum(r.count for r in rates.values()) == len(good)


def _read_dlq(settings: Settings, want: int, timeout: float = 60) -> list[KafkaRecord]:
    deadline = time.monotonic() + timeout
    while True:
        records = read_partition(settings, settings.topics["dead_letter"])
        if len(records) >= want or time.monotonic() > deadline:
            return records
        time.sleep(0.5)


def test_flood_of_malformed_records_loses_no_good_event_and_dead_letters_every_bad_one(
    settings: Settings, faust_cleanup: str, tmp_path: Path
) -> None:
    ensure_topics(settings)
    flood = Flood(settings)
    with streams_worker(settings, faust_cleanup, tmp_path, window_ms=WINDOW) as worker:
        flood.send(range(6))
        whole_total, single_total = flood.whole, flood.single
        rates = read_rates(settings, set(truth(flood.good, WINDOW)))
        worker.wait_metric("cacheroute_streams_batches_dead_lettered_total", whole_total)
        worker.wait_metric("cacheroute_streams_events_dead_lettered_total", single_total)
        worker.wait_metric("cacheroute_streams_events_accepted_total", len(flood.good))
        _read_dlq(settings, whole_total + single_total)
        time.sleep(1.0)  # nothing more arrives
        assert worker.metric("cacheroute_streams_batches_dead_lettered_total") == whole_total
        assert worker.metric("cacheroute_streams_events_dead_lettered_total") == single_total
        assert worker.metric("cacheroute_streams_events_accepted_total") == len(flood.good)
        assert worker.metric("cacheroute_streams_events_late_total") == 0
        assert worker.proc.poll() is None, worker.tail()
        # `cacheroute doctor` sees the same: the Faust group caught up, the DLQ holds the flood
        deadline = time.monotonic() + 30
        while True:
            report = run_doctor(settings, DoctorOptions(streams_group=faust_cleanup, max_lag=0))
            by = {f.check: f for f in report.findings}
            if by["streams-lag"].ok or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert by["streams-lag"].ok, by["streams-lag"]
        assert by["dead-letter"].detail["total"] == whole_total + single_total
    _check_rates(rates, flood.good)

    # every bad record on the DLQ, with a reason; counters equal the record count
    dlq = read_partition(settings, settings.topics["dead_letter"])
    assert len(dlq) == whole_total + single_total
    reasons = Counter((r.header("cacheroute.reason") or b"").decode() for r in dlq)
    assert all(reason for reason in reasons), reasons
    assert all(r.header("cacheroute.source") for r in dlq)
    per_event = [r for r in dlq if r.header("cacheroute.index") is not None]
    assert len(per_event) == single_total
    assert reasons["negative prompt_tokens"] == 18
    assert reasons["empty key"] == 18
    assert reasons["key longer than 1024 bytes"] == 36
    assert reasons["event time in the future of its batch"] == 18
    assert reasons["event time too far in the past"] == 18

    def having(text: str) -> int:
        return sum(n for r, n in reasons.items() if text in r)

    assert having("a KeyRate does not belong on " + settings.topics["requests"]) == 6
    assert (
        having("unknown format marker")
        + having("unknown schema fingerprint")
        + having("truncated record")
        == 60
    )  # the random bytes
    assert sum(n for r, n in reasons.items() if r.startswith("column ")) == 18


def test_worker_killed_during_the_flood_loses_no_good_event_and_no_bad_record(
    settings: Settings, faust_cleanup: str, tmp_path: Path
) -> None:
    """End-to-end variant of the SIGKILL test: the worker dies while bad and good records flow.

    Good events are counted exactly once across the crash (restored table, re-delivered messages
    skipped). Dead letters are at-least-once: a bad record re-delivered after the crash may be
    dead-lettered again, but none is missing — every expected (source, index) is on the DLQ.
    """
    ensure_topics(settings)
    flood = Flood(settings)
    with streams_worker(
        settings, faust_cleanup, tmp_path / "first", window_ms=WINDOW, commit_interval=5.0
    ) as worker:
        flood.send(range(3))
        worker.wait_metric("cacheroute_streams_batches_dead_lettered_total", flood.whole // 2)
        worker.wait_metric("cacheroute_streams_flush_seconds_count", 2)
        worker.proc.send_signal(signal.SIGKILL)
        worker.proc.wait(timeout=10)
    flood.send(range(3, 6))
    expected = truth(flood.good, WINDOW)
    with streams_worker(settings, faust_cleanup, tmp_path / "second", window_ms=WINDOW) as second:
        rates = read_rates(settings, set(expected))
        second.wait_metric("cacheroute_streams_events_accepted_total", 1)
        assert second.proc.poll() is None, second.tail()
    _check_rates(rates, flood.good)

    dlq = _read_dlq(settings, flood.whole + flood.single)
    assert all(r.header("cacheroute.reason") for r in dlq)
    distinct = {
        ((r.header("cacheroute.source") or b"").decode(), r.header("cacheroute.index")) for r in dlq
    }
    with_index = {d for d in distinct if d[1] is not None}
    assert len(with_index) == flood.single
    assert len(distinct) - len(with_index) == flood.whole
