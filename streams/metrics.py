"""Prometheus metrics of the streams agent (one private registry per agent instance)."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["StreamMetrics"]


@dataclass
class StreamMetrics:
    """Counters a person watches: throughput, lateness, dead letters, window closes, flush time."""

    registry: CollectorRegistry
    batches: Counter
    events_accepted: Counter
    events_late: Counter
    events_replayed: Counter
    events_dead_lettered: Counter
    batches_dead_lettered: Counter
    rates_emitted: Counter
    windows_closed: Counter
    flush_seconds: Histogram
    watermark_ms: Gauge
    open_windows: Gauge

    @classmethod
    def create(cls, registry: CollectorRegistry | None = None) -> StreamMetrics:
        """Metrics registered in `registry` (a new private one by default)."""
        reg = registry or CollectorRegistry()
        p = "cacheroute_streams_"
        return cls(
            registry=reg,
            batches=Counter(p + "batches", "Kafka messages (batches/summaries) read", registry=reg),
            events_accepted=Counter(
                p + "events_accepted", "Request events counted into a window", registry=reg
            ),
            events_late=Counter(
                p + "events_late", "Events for windows already past grace: dropped", registry=reg
            ),
            events_replayed=Counter(
                p + "events_replayed",
                "Re-delivered events skipped because their window state already had them",
                registry=reg,
            ),
            events_dead_lettered=Counter(
                p + "events_dead_lettered", "Malformed events sent to the DLQ", registry=reg
            ),
            batches_dead_lettered=Counter(
                p + "batches_dead_lettered",
                "Undecodable/malformed batches sent to the DLQ",
                registry=reg,
            ),
            rates_emitted=Counter(p + "rates_emitted", "KeyRate records produced", registry=reg),
            windows_closed=Counter(
                p + "windows_closed", "Windows closed", ["partition"], registry=reg
            ),
            flush_seconds=Histogram(
                p + "flush_seconds", "Time to flush one partition's state", registry=reg
            ),
            watermark_ms=Gauge(
                p + "watermark_ms", "Newest gateway time seen", ["partition"], registry=reg
            ),
            open_windows=Gauge(
                p + "open_windows", "Windows holding state", ["partition"], registry=reg
            ),
        )
