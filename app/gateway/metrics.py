"""Prometheus metrics of one gateway (`cacheroute_gateway_*`), in a private registry.

/metrics serves this registry followed by the dispatcher's (`cacheroute_dispatcher_*`), the plan
follower's and the emitter's, so one scrape shows a gateway whole.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

__all__ = ["GatewayMetrics"]

_SECONDS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class GatewayMetrics:
    """Counters and histograms the proxy updates per request."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = r = registry if registry is not None else CollectorRegistry()
        self.requests = Counter(
            "cacheroute_gateway_requests",
            "Requests answered, by endpoint and status class (2xx, 4xx, 5xx)",
            ["endpoint", "status"],
            registry=r,
        )
        self.errors = Counter(
            "cacheroute_gateway_errors",
            "Requests the gateway answered with its own error, by reason",
            ["reason"],
            registry=r,
        )
        self.backend_requests = Counter(
            "cacheroute_gateway_backend_requests",
            "Requests sent to each backend (retries included), by outcome",
            ["backend", "outcome"],
            registry=r,
        )
        self.retries = Counter(
            "cacheroute_gateway_retries",
            "Requests retried on another backend after a failure before any byte reached the client",
            registry=r,
        )
        self.disconnects = Counter(
            "cacheroute_gateway_client_disconnects",
            "Clients that went away before their response ended (backend request cancelled)",
            registry=r,
        )
        self.health_checks = Counter(
            "cacheroute_gateway_health_checks",
            "Backend health checks, by backend and result",
            ["backend", "result"],
            registry=r,
        )
        self.prompt_tokens = Counter(
            "cacheroute_gateway_prompt_tokens",
            "Prompt tokens of answered requests (backend usage, else the estimate)",
            registry=r,
        )
        self.cached_tokens = Counter(
            "cacheroute_gateway_cached_tokens",
            "Prompt tokens the backends reported served from their prefix cache",
            registry=r,
        )
        self.latency = Histogram(
            "cacheroute_gateway_request_seconds",
            "Request arrival to the last byte sent to the client",
            ["endpoint"],
            buckets=_SECONDS,
            registry=r,
        )
        self.first_byte = Histogram(
            "cacheroute_gateway_first_byte_seconds",
            "Request arrival to the first byte from the backend (streams: time to first chunk)",
            ["endpoint"],
            buckets=_SECONDS,
            registry=r,
        )
