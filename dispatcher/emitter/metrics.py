"""Prometheus export of the emitter's counters.

Why a custom collector instead of `Counter.inc()` per event: prometheus-client takes a lock on
every increment, which would cost `emit` more than all its other work. The emitter counts in plain
ints under its own lock, and this collector reads a snapshot only when the registry is scraped.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from cacheroute.dispatcher.emitter.config import EmitterStats

__all__ = ["EmitterCollector"]

_COUNTERS = (
    ("accepted", "Events accepted by emit()"),
    ("dropped", "Events dropped because the buffer was full or the emitter closed"),
    ("rejected", "Events rejected because of invalid values"),
    ("batches_sent", "Records delivered to Kafka (batches, summaries, heartbeats)"),
    ("heartbeats_sent", "Empty heartbeat batches delivered"),
    ("events_sent", "Events whose record was delivered"),
    ("events_failed", "Accepted events whose record failed for good"),
    ("delivery_errors", "Records that failed for good"),
)


class EmitterCollector(Collector):
    """Yields `cacheroute_emitter_*` metrics, labelled with the gateway id, from `stats()`."""

    def __init__(self, stats: Callable[[], EmitterStats], gateway_id: str) -> None:
        self._stats = stats
        self._gateway_id = gateway_id

    def collect(self) -> Iterator[Metric]:
        snapshot = self._stats()
        for name, doc in _COUNTERS:
            family = CounterMetricFamily(f"cacheroute_emitter_{name}", doc, labels=["gateway"])
            family.add_metric([self._gateway_id], getattr(snapshot, name))
            yield family
        gauge = GaugeMetricFamily(
            "cacheroute_emitter_buffered",
            "Accepted events not yet delivered or failed",
            labels=["gateway"],
        )
        gauge.add_metric([self._gateway_id], snapshot.buffered)
        yield gauge
