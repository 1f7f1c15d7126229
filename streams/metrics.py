"""Prometheus metrics of the streams agent (one private registry per agent instance)."""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["OTHER_GATEWAYS", "StreamMetrics"]

OTHER_GATEWAYS = "other"
"""The `gateway` label of every gateway beyond the first `max_gateway_labels` ones."""


@dataclass
class StreamMetrics:
    """Counters a person watches: throughput, lateness, dead letters, window closes, flush time."""

    registry: CollectorRegistry
    batches: Counter
    messages_redelivered: Counter
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
    late_dead_letters: Counter
    gateway_events_late: Counter
    gateway_events_future: Counter
    gateway_batches_future: Counter
    first_batch_time: Gauge
    last_batch_time: Gauge
    last_rates_time: Gauge
    max_gateway_labels: int = 32
    _gateways: set[str] = field(default_factory=set)
    _first_batch_s: float = 0.0

    def batch_started(self, at_s: float) -> None:
        """A batch is about to be applied at Unix time `at_s` (the first one is remembered)."""
        if not self._first_batch_s:
            self._first_batch_s = at_s
            self.first_batch_time.set(at_s)

    def batch_done(self, at_s: float) -> None:
        """The agent finished handling a message at Unix time `at_s`."""
        self.last_batch_time.set(at_s)

    def gateway(self, gateway_id: str) -> str:
        """The `gateway` label of a gateway: its id, or "other" once `max_gateway_labels` are taken.

        Only gateways with clock trouble (late or future-dated records) get a label, first come
        first served, so a fleet of thousands of healthy gateways, or a flood of made-up ids, cannot
        grow the series count without bound; the skewed ones usually show up first anyway.
        """
        if gateway_id in self._gateways:
            return gateway_id
        if len(self._gateways) < self.max_gateway_labels and gateway_id != OTHER_GATEWAYS:
            self._gateways.add(gateway_id)
            return gateway_id
        return OTHER_GATEWAYS

    @classmethod
    def create(
        cls, registry: CollectorRegistry | None = None, *, max_gateway_labels: int = 32
    ) -> StreamMetrics:
        """Metrics registered in `registry` (a new private one by default)."""
        reg = registry or CollectorRegistry()
        p = "cacheroute_streams_"
        return cls(
            max_gateway_labels=max_gateway_labels,
            registry=reg,
            batches=Counter(p + "batches", "Kafka messages (batches/summaries) read", registry=reg),
            messages_redelivered=Counter(
                p + "messages_redelivered",
                "Kafka messages delivered again to the worker that already applied them (consumer "
                "seek): skipped whole",
                registry=reg,
            ),
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
                p + "flush_seconds",
                "Time of one flush (the partitions due together: rates, changelog, acks)",
                registry=reg,
            ),
            watermark_ms=Gauge(
                p + "watermark_ms", "Newest gateway time seen", ["partition"], registry=reg
            ),
            open_windows=Gauge(
                p + "open_windows", "Windows holding state", ["partition"], registry=reg
            ),
            late_dead_letters=Counter(
                p + "late_dead_letters",
                "DLQ records holding late events (one per message that had any)",
                registry=reg,
            ),
            gateway_events_late=Counter(
                p + "gateway_events_late",
                "Late events by source gateway (a clock behind, or delivery slower than grace)",
                ["gateway"],
                registry=reg,
            ),
            gateway_events_future=Counter(
                p + "gateway_events_future",
                "Events dead-lettered as dated ahead of the record's Kafka timestamp, by gateway",
                ["gateway"],
                registry=reg,
            ),
            gateway_batches_future=Counter(
                p + "gateway_batches_future",
                "Batches/summaries whose created_ms was ahead of their Kafka timestamp (ignored; "
                "empty ones dead-lettered), by gateway",
                ["gateway"],
                registry=reg,
            ),
            first_batch_time=Gauge(
                p + "first_batch_timestamp_seconds",
                "When this worker began applying its first batch (Unix time; 0 before): its "
                "start-up and group join end here",
                registry=reg,
            ),
            last_batch_time=Gauge(
                p + "last_batch_timestamp_seconds",
                "When this worker last finished handling a message (Unix time): it stops moving "
                "while nothing arrives",
                registry=reg,
            ),
            last_rates_time=Gauge(
                p + "last_rates_timestamp_seconds",
                "When a flush last emitted key rates, acknowledged by the broker (Unix time): "
                "planners see rates no newer than this",
                registry=reg,
            ),
        )
