"""Prometheus metrics of the plan follower a gateway embeds (private registries)."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["LATENCY_BUCKETS", "FollowerMetrics"]

LATENCY_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
"""Seconds: the histogram buckets of plan apply and publish times (the planner's metrics too)."""


@dataclass
class FollowerMetrics:
    """A plan follower: which version is live, how old, and what it refused."""

    registry: CollectorRegistry
    live_version: Gauge
    plan_age_seconds: Gauge
    caught_up: Gauge
    applied: Counter
    rejected: Counter
    ignored: Counter
    apply_seconds: Histogram

    @classmethod
    def create(
        cls, registry: CollectorRegistry | None = None, prefix: str = "cacheroute_plan_follower_"
    ) -> FollowerMetrics:
        """Metrics registered in `registry` (a new private one by default)."""
        reg = registry or CollectorRegistry()
        p = prefix
        return cls(
            registry=reg,
            live_version=Gauge(
                p + "live_version", "Version of the live plan (0: none)", registry=reg
            ),
            plan_age_seconds=Gauge(
                p + "plan_age_seconds", "Now minus the live plan's created time", registry=reg
            ),
            caught_up=Gauge(
                p + "caught_up", "1 once the topic was read to its end once", registry=reg
            ),
            applied=Counter(p + "versions_applied", "Plan versions applied", registry=reg),
            rejected=Counter(
                p + "versions_rejected",
                "Versions not applied (incomplete, checksum, invalid, stale, out-of-range)",
                ["reason"],
                registry=reg,
            ),
            ignored=Counter(
                p + "records_ignored",
                "Records that belong to no applied version, by reason",
                ["reason"],
                registry=reg,
            ),
            apply_seconds=Histogram(
                p + "apply_seconds",
                "Time to verify, decode and validate one version",
                registry=reg,
                buckets=LATENCY_BUCKETS,
            ),
        )
