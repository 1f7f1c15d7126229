"""Configuration and counters of the gateway emitter (plain data, no behaviour beyond checks)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from cacheroute.dispatcher.errors import DispatchError

__all__ = ["EmitterConfig", "EmitterStats"]


@dataclass(frozen=True)
class EmitterConfig:
    """How the emitter batches, bounds memory and reports.

    The defaults keep an event's time in the gateway under `linger_ms + poll_interval_ms` (60 ms),
    so it reaches Kafka well within 100 ms, while one record carries up to 2000 events: the streams
    agent's cost is per record, not per event.
    """

    mode: Literal["events", "summary"] = "events"
    """`events`: one RequestBatch entry per event. `summary`: one RequestSummary row per key and
    tick (~5x fewer bytes and ~10x fewer records downstream; destinations and block hashes are
    not carried, the schema has no place for them)."""
    max_batch_events: int = 2000
    """A partition's buffer is sealed as soon as it holds this many events (summary: rows/record)."""
    linger_ms: int = 50
    """...or when its oldest event has waited this long."""
    heartbeat_ms: int = 1000
    """A partition with nothing sent for this long and nothing held gets an empty RequestBatch."""
    tick_ms: int = 1000
    """Summary mode: length of a tick, aligned to multiples since the epoch."""
    max_buffered_events: int = 500_000
    """Memory bound: events accepted but not yet delivered (summary mode: per-key rows, since
    memory there grows with keys per tick, not with events). Beyond it `emit` drops and counts."""
    max_batch_bytes: int = 900_000
    """An encoded record larger than this is split in two (Kafka's default limit is 1 MB)."""
    partitions: int | None = None
    """Partitions of the requests topic; None: read from topic metadata at construction."""
    max_key_bytes: int = 1024
    """Longer keys are rejected (the streams agent's `max_key_bytes` discards them too)."""
    partition_cache_size: int = 100_000
    """Keys per generation of the key -> partition memo (at most twice this many are held)."""
    poll_interval_ms: int = 10
    """How often the background thread checks the seal, heartbeat and tick rules."""
    log_interval_ms: int = 10_000
    """At most one log line per this interval per kind of problem."""
    background: bool = True
    """Run the sealing thread. False: the owner calls `Emitter.pump()` itself (tests, or a gateway
    that prefers its own event loop's timer)."""
    producer_overrides: Mapping[str, Any] = field(default_factory=dict, hash=False)
    """Extra librdkafka settings on top of `cacheroute.kafkaio.producer_config`."""

    def __post_init__(self) -> None:
        if self.mode not in ("events", "summary"):
            raise DispatchError(f"mode must be 'events' or 'summary', got {self.mode!r}")
        positive = (
            "max_batch_events",
            "linger_ms",
            "heartbeat_ms",
            "tick_ms",
            "max_buffered_events",
            "max_batch_bytes",
            "partition_cache_size",
            "max_key_bytes",
            "poll_interval_ms",
        )
        for name in positive:
            value = getattr(self, name)
            if type(value) is not int or value <= 0:
                raise DispatchError(f"EmitterConfig.{name} must be a positive int, got {value!r}")
        if self.partitions is not None and (
            type(self.partitions) is not int or self.partitions <= 0
        ):
            raise DispatchError(
                f"EmitterConfig.partitions must be positive, got {self.partitions!r}"
            )
        if self.log_interval_ms < 0:
            raise DispatchError("EmitterConfig.log_interval_ms must not be negative")


@dataclass(frozen=True, slots=True)
class EmitterStats:
    """A consistent snapshot of the emitter's counters (the same numbers its metrics export).

    Accounting: `accepted == events_sent + events_failed + buffered` at every snapshot.
    """

    accepted: int
    """Events `emit` took (returned True)."""
    dropped: int
    """Events refused because the memory bound was reached or the emitter was closed."""
    rejected: int
    """Events refused because their values were invalid (see `Emitter.emit`)."""
    batches_sent: int
    """Records delivered (RequestBatch, RequestSummary and heartbeats)."""
    heartbeats_sent: int
    """Of those, empty heartbeat batches."""
    events_sent: int
    """Accepted events whose record was delivered."""
    events_failed: int
    """Accepted events whose record failed for good (delivery error, unencodable)."""
    delivery_errors: int
    """Records that failed for good."""
    buffered: int
    """Accepted events not yet delivered or failed."""
