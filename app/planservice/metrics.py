"""Prometheus metrics of the planner service and of plan followers (a private registry each).

Private registries (not prometheus_client's global one) so that two planners, or a planner and a
follower, in one process (tests, a gateway embedding a follower) never collide, and so each
service's endpoint shows only its own numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from cacheroute.dispatcher.follower_metrics import LATENCY_BUCKETS

__all__ = ["PlannerMetrics"]


@dataclass
class PlannerMetrics:
    """What an operator watches on a planner: is it active, are plans fresh, good and cheap."""

    registry: CollectorRegistry
    active: Gauge
    takeovers: Counter
    fenced: Counter
    build_seconds: Histogram
    publish_seconds: Histogram
    publish_bytes: Gauge
    publish_chunks: Gauge
    publishes: Counter
    skips: Counter
    version: Gauge
    admitted_keys: Gauge
    slots_used: Gauge
    imbalance: Gauge
    moved_rate_fraction: Gauge
    input_lag_seconds: Gauge
    rates_lag_records: Gauge
    rates_records: Counter
    tracked_keys: Gauge
    windows_folded: Counter
    plan_records_ignored: Counter
    foreign_records: Counter
    repairs: Counter

    @classmethod
    def create(cls, registry: CollectorRegistry | None = None) -> PlannerMetrics:
        """Metrics registered in `registry` (a new private one by default)."""
        reg = registry or CollectorRegistry()
        p = "cacheroute_planner_"
        return cls(
            registry=reg,
            active=Gauge(p + "active", "1 while this instance is the active planner", registry=reg),
            takeovers=Counter(
                p + "takeovers", "Times this instance became the active planner", registry=reg
            ),
            fenced=Counter(
                p + "fenced",
                "Publishes refused because a newer instance fenced this one",
                registry=reg,
            ),
            build_seconds=Histogram(
                p + "build_seconds",
                "Time to build one plan",
                registry=reg,
                buckets=LATENCY_BUCKETS,
            ),
            publish_seconds=Histogram(
                p + "publish_seconds",
                "Time to publish one version (transaction begin to commit)",
                registry=reg,
                buckets=LATENCY_BUCKETS,
            ),
            publish_bytes=Gauge(
                p + "publish_bytes", "Record bytes of the last published version", registry=reg
            ),
            publish_chunks=Gauge(
                p + "publish_chunks", "Chunks of the last published version", registry=reg
            ),
            publishes=Counter(p + "publishes", "Plan versions published", ["reason"], registry=reg),
            skips=Counter(
                p + "publish_skips",
                "Control intervals that published nothing, by reason",
                ["reason"],
                registry=reg,
            ),
            version=Gauge(p + "version", "Version of the live plan", registry=reg),
            admitted_keys=Gauge(
                p + "admitted_keys", "Admitted keys of the live plan", registry=reg
            ),
            slots_used=Gauge(p + "slots_used", "Sum of k_b of the live plan", registry=reg),
            imbalance=Gauge(
                p + "imbalance", "Expected max/mean load of the live plan", registry=reg
            ),
            moved_rate_fraction=Gauge(
                p + "moved_rate_fraction",
                "Share of the admitted rate sent to a replica not warm for its key in the last "
                "published version (new keys, and moved keys' traffic to their new replicas)",
                registry=reg,
            ),
            input_lag_seconds=Gauge(
                p + "input_lag_seconds",
                "Now minus the end of the newest rate window folded into the averages",
                registry=reg,
            ),
            rates_lag_records=Gauge(
                p + "rates_lag_records", "Records of `rates` not read yet", registry=reg
            ),
            rates_records=Counter(
                p + "rates_records",
                "KeyRate records read, by outcome (accepted, replaced, late, invalid, garbage; error: "
                "skipped after an unforeseen exception; clamped: key-window rates clamped to "
                "max_surge x the cluster total; scaled: key-window rates cut down to keep a "
                "window's total within max_total_growth x the cluster total)",
                ["outcome"],
                registry=reg,
            ),
            tracked_keys=Gauge(p + "tracked_keys", "Keys with a smoothed rate", registry=reg),
            windows_folded=Counter(
                p + "windows_folded", "Rate windows folded into the averages", registry=reg
            ),
            plan_records_ignored=Counter(
                p + "plan_records_ignored",
                "Records on `plans` whose version recovery did not count, by reason "
                "(out-of-range, implausible-version)",
                ["reason"],
                registry=reg,
            ),
            foreign_records=Counter(
                p + "foreign_records",
                "Records on `plans` under header or chunk keys that this planner did not write, by "
                "key kind (header, chunk)",
                ["kind"],
                registry=reg,
            ),
            repairs=Counter(
                p + "repairs",
                "Times the live version was re-published over foreign records",
                registry=reg,
            ),
        )
