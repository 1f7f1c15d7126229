"""Prometheus metrics of the engine stand-in, named like vLLM's (V1 engine) so dashboards, the
gateway's health checks and the tests read the stand-in exactly as they would read vLLM.

vLLM counts prefix-cache queries and hits in tokens (`vllm:prefix_cache_queries_total`,
`vllm:prefix_cache_hits_total`); so does this. Gauges are read on scrape (no cost per request).
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["EngineMetrics"]

_LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class EngineMetrics:
    """The engine's metrics in a private registry (`.registry`)."""

    def __init__(
        self,
        model: str,
        *,
        running: Callable[[], float],
        waiting: Callable[[], float],
        cache_usage: Callable[[], float],
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.registry = r = registry if registry is not None else CollectorRegistry()
        labels = ["model_name"]
        Gauge(
            "vllm:num_requests_running", "Requests running (in a slot)", labels, registry=r
        ).labels(model).set_function(running)
        Gauge(
            "vllm:num_requests_waiting", "Requests waiting for a slot", labels, registry=r
        ).labels(model).set_function(waiting)
        Gauge(
            "vllm:kv_cache_usage_perc", "Fraction of prefix-cache blocks in use", labels, registry=r
        ).labels(model).set_function(cache_usage)
        self.cache_queries = Counter(
            "vllm:prefix_cache_queries", "Prompt tokens looked up", labels, registry=r
        ).labels(model)
        self.cache_hits = Counter(
            "vllm:prefix_cache_hits", "Prompt tokens found in the cache", labels, registry=r
        ).labels(model)
        self.prompt_tokens = Counter(
            "vllm:prompt_tokens", "Prompt tokens processed", labels, registry=r
        ).labels(model)
        self.generation_tokens = Counter(
            "vllm:generation_tokens", "Output tokens generated", labels, registry=r
        ).labels(model)
        self.success = Counter(
            "vllm:request_success",
            "Finished requests by finish reason",
            [*labels, "finished_reason"],
            registry=r,
        )
        self.model = model
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds",
            "Arrival to first output token",
            labels,
            buckets=_LATENCY_BUCKETS,
            registry=r,
        ).labels(model)
        self.e2e = Histogram(
            "vllm:e2e_request_latency_seconds",
            "Arrival to last output token",
            labels,
            buckets=_LATENCY_BUCKETS,
            registry=r,
        ).labels(model)
        self.cancelled = Counter(
            "cacheroute_engine_requests_cancelled",
            "Requests whose client went away before the end (their slot is freed at once)",
            registry=r,
        )
        self.rejected = Counter(
            "cacheroute_engine_requests_rejected",
            "Requests answered with a 4xx (bad JSON, unknown model, bad parameters)",
            ["reason"],
            registry=r,
        )

    def finished(self, reason: str) -> None:
        """Count one request that ran to its end."""
        self.success.labels(self.model, reason).inc()
