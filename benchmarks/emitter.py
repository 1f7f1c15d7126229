"""Benchmark of the gateway emitter: cost of `emit()` and end-to-end throughput into Kafka.

`emit_ns` is measured the way a gateway pays it: the background sealing thread runs during the
loop (encoding competes for the GIL, so its cost lands in the number), with a null producer that
acknowledges every record at once, so the broker's speed does not. `emit_only_ns` is the request
path alone (no thread; the buffers are sealed after the timed loop), so the difference is what
sealing and encoding cost per event. Next to it, in the same run
and loop shape, `baseline_ns` appends the same (key, prompt_tokens) tuples to a list; `ratio`
compares the two, which stays meaningful on a shared, noisy machine where absolute numbers move.
With `settings`, the same events also go through a real producer into fresh topics, and
`events_per_s` is emit + flush wall time end to end (every event delivered, checked).
"""

from __future__ import annotations

import statistics
import time
import uuid
from collections.abc import Callable
from typing import Any

import numpy as np

from cacheroute.dispatcher.emitter.config import EmitterConfig
from cacheroute.dispatcher.emitter.emitter import Emitter
from cacheroute.dispatcher.emitter.transport import DeliveryCallback
from cacheroute.settings import Settings
from cacheroute.topics import ensure_topics, make_admin

__all__ = ["bench_emitter", "workload"]


class _NullProducer:
    """Accepts every record and reports it delivered on the next poll, like a broker at no cost."""

    def __init__(self) -> None:
        self._reports: list[DeliveryCallback | None] = []
        self.records = 0

    def produce(
        self,
        topic: str,
        *,
        value: bytes | None = None,
        key: bytes | None = None,
        partition: int = -1,
        on_delivery: DeliveryCallback | None = None,
    ) -> None:
        self.records += 1
        self._reports.append(on_delivery)

    def poll(self, timeout: float = -1) -> int:
        reports, self._reports = self._reports, []
        for callback in reports:
            if callback is not None:
                callback(None, None)  # type: ignore[arg-type]  # the emitter ignores the message
        return len(reports)

    def flush(self, timeout: float = -1) -> int:
        self.poll(0)
        return 0


def workload(events: int, keys: int, seed: int = 0) -> list[tuple[str, int]]:
    """(key, prompt_tokens) pairs: log-normal key popularity (sigma 2), as in chat traffic.

    Keys look like conversation-prefix hashes (20 characters); prompt lengths are log-normal
    around 1,000 tokens.
    """
    rng = np.random.default_rng(seed)
    popularity = rng.lognormal(mean=0.0, sigma=2.0, size=keys)
    chosen = rng.choice(keys, size=events, p=popularity / popularity.sum())
    names = [f"conv-{h:016x}" for h in rng.integers(0, 2**63, size=keys).tolist()]
    prompts = np.clip(rng.lognormal(np.log(1000), 1.0, size=events), 1, 2**31 - 1)
    return list(
        zip([names[i] for i in chosen.tolist()], prompts.astype(np.int64).tolist(), strict=True)
    )


def _per_call_ns(pairs: list[tuple[str, int]], call: Callable[[str, int], Any]) -> float:
    start = time.perf_counter_ns()
    for key, prompt in pairs:
        call(key, prompt)
    return (time.perf_counter_ns() - start) / len(pairs)


def _baseline(pairs: list[tuple[str, int]]) -> float:
    sink: list[tuple[str, int]] = []
    append = sink.append
    return _per_call_ns(pairs, lambda key, prompt: append((key, prompt)))


def bench_emitter(
    events: int = 1_000_000,
    keys: int = 100_000,
    seed: int = 0,
    settings: Settings | None = None,
    *,
    rounds: int = 3,
    partitions: int = 8,
) -> dict[str, Any]:
    """Measure `emit()`; returns a flat dict (the CLI prints it as one JSON object).

    Keys: `emit_ns`, `emit_only_ns` and `baseline_ns` (medians over `rounds`, same run,
    interleaved), `ratio` (emit_ns / baseline_ns), the per-round lists, the counters of the
    emitter with the thread, and with `settings` `events_per_s`, `e2e_emit_ns` and
    `e2e_flush_s` into fresh topics (deleted afterwards).
    """
    pairs = workload(events, keys, seed)
    result: dict[str, Any] = {
        "events": events,
        "keys": keys,
        "seed": seed,
        "partitions": partitions,
        "producer": "null (acknowledges at once; background sealing thread running)",
    }
    emitter = Emitter(
        Settings(),
        "bench-gw",
        EmitterConfig(partitions=partitions, max_buffered_events=max(500_000, 2 * events)),
        producer=_NullProducer(),
    )
    quiet = Emitter(
        Settings(),
        "bench-gw-quiet",
        EmitterConfig(partitions=partitions, max_buffered_events=2 * events, background=False),
        producer=_NullProducer(),
    )
    emit_rounds: list[float] = []
    base_rounds: list[float] = []
    quiet_rounds: list[float] = []
    try:
        for _ in range(rounds):
            base_rounds.append(_baseline(pairs))
            emit_rounds.append(_per_call_ns(pairs, emitter.emit))
            emitter.flush(60)
            quiet_rounds.append(_per_call_ns(pairs, quiet.emit))
            quiet.flush(60)
    finally:
        emitter.close(60)
        quiet.close(60)
    stats = emitter.stats()
    emit_ns = statistics.median(emit_rounds)
    baseline_ns = statistics.median(base_rounds)
    result |= {
        "emit_ns": round(emit_ns, 1),
        "baseline_ns": round(baseline_ns, 1),
        "ratio": round(emit_ns / baseline_ns, 2),
        "emit_only_ns": round(statistics.median(quiet_rounds), 1),
        "emit_ns_rounds": [round(x, 1) for x in emit_rounds],
        "baseline_ns_rounds": [round(x, 1) for x in base_rounds],
        "accepted": stats.accepted,
        "dropped": stats.dropped,
        "events_sent": stats.events_sent,
        "batches_sent": stats.batches_sent,
    }
    if settings is not None:
        result |= _end_to_end(settings, pairs, partitions)
    return result


def _end_to_end(
    settings: Settings, pairs: list[tuple[str, int]], partitions: int
) -> dict[str, Any]:
    """emit + flush through a real producer into fresh topics; every event must be delivered."""
    fresh = settings.with_overrides(
        topic_prefix=f"bench-{uuid.uuid4().hex[:10]}.", requests_partitions=partitions
    )
    ensure_topics(fresh)
    try:
        emitter = Emitter(
            fresh, "bench-gw", EmitterConfig(max_buffered_events=max(500_000, 2 * len(pairs)))
        )
        try:
            start = time.perf_counter()
            emit_ns = _per_call_ns(pairs, emitter.emit)
            flushed_at = time.perf_counter()
            delivered = emitter.flush(120)
            end = time.perf_counter()
        finally:
            emitter.close(60)
        stats = emitter.stats()
        return {
            "events_per_s": round(len(pairs) / (end - start)),
            "e2e_emit_ns": round(emit_ns, 1),
            "e2e_flush_s": round(end - flushed_at, 3),
            "e2e_all_delivered": delivered and stats.events_sent == len(pairs),
            "e2e_batches_sent": stats.batches_sent,
            "e2e_delivery_errors": stats.delivery_errors,
        }
    finally:
        admin = make_admin(fresh)
        names = [
            t for t in admin.list_topics(timeout=10).topics if t.startswith(fresh.topic_prefix)
        ]
        if names:
            for fut in admin.delete_topics(names, operation_timeout=30).values():
                fut.result(timeout=30)
