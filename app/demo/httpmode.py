"""`cacheroute demo --http`: the demo over real HTTP - engines, gateways and a load generator.

Instead of in-process gateways against a simulated cluster, the conductor starts R engine
stand-ins (`cacheroute engine`, named d0..d{R-1}: the plan's destination names), G real gateways
(`cacheroute gateway`, each with every engine as a backend, following this run's plans topic and
emitting to its requests topic) and one load generator (`cacheroute.demo.httpload`) that replays
the demo workload against the gateways round-robin. All listen on 127.0.0.1 on free ports and are
children of the conductor, stopped by pid like the streams worker and the planner.

Here live the parts only this mode has: starting those processes in order (engines answer
/health before the gateways start, the gateways answer /ready with every backend up before the
load starts, so the first requests do not measure start-up), scraping the gateways' and engines'
Prometheus endpoints into the view's per-gateway stats, and the extra columns and summary fields.
"""

from __future__ import annotations

import re
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.table import Table
from rich.text import Text

from cacheroute.benchmarks.gateway import wait_healthy
from cacheroute.demo.procs import Child, start_child
from cacheroute.loopback import free_port, scrape_metrics

__all__ = [
    "ENGINE_BLOCK_TOKENS",
    "HttpCluster",
    "engine_rows",
    "http_summary",
    "merge_gateway",
    "poll",
    "start_cluster",
    "summary_line",
]

ENGINE_BLOCK_TOKENS = 256
"""Tokens per block of the demo workload (`paper`): --cache-blocks x this = each engine's cache."""
DEMO_HASH_BLOCK_TOKENS = 512
"""The gateways' `--hash-blocks`: `evaluate --topic`'s default block size, so a kept run replays
with no extra option (two workload blocks a hash: coarser than the engines' 256, still exact)."""
START_TIMEOUT_S = 60.0
"""Start-up of a child on a busy 2-core machine (imports, the broker connection) can be slow."""

_ENGINE_METRICS = (
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
    "vllm:request_success_total",
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
)
_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{([^}]*)\})?\s+(\S+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


@dataclass
class HttpCluster:
    """The HTTP mode's processes: engine and gateway ports by name, and what was last scraped."""

    engines: dict[str, int] = field(default_factory=dict)
    gateways: dict[str, int] = field(default_factory=dict)
    last_tokens: dict[str, tuple[float, float]] = field(default_factory=dict)
    """Per gateway, (prompt, cached) tokens at the previous scrape: the recent hit rate's base."""


def start_cluster(
    *,
    engines: int,
    gateways: int,
    cache_blocks: int,
    bootstrap: str,
    prefix: str,
    run_dir: Path,
    children: list[Child],
) -> HttpCluster:
    """Start the engines, then the gateways, each waited for; every child goes into `children`
    at once, so a failure (or Ctrl-C) half-way still stops what was started."""
    cluster = HttpCluster()
    for e in range(engines):
        name, port = f"d{e}", free_port()
        argv = ["-m", "cacheroute", "engine", "--port", str(port), "--name", name]
        argv += ["--cache-tokens", str(cache_blocks * ENGINE_BLOCK_TOKENS)]
        children.append(start_child(f"engine-{name}", argv, run_dir / f"engine-{name}.log"))
        cluster.engines[name] = port
    for child, port in zip(children[-engines:], cluster.engines.values(), strict=True):
        wait_healthy(child, port, timeout=START_TIMEOUT_S)
    backends: list[str] = []
    for name, port in cluster.engines.items():
        backends += ["--backend", f"{name}=http://127.0.0.1:{port}"]
    ports = [free_port() for _ in range(gateways)]
    for g, port in enumerate(ports):
        gw = f"gw-{g}"
        argv = ["-m", "cacheroute", "--bootstrap", bootstrap, "--topic-prefix", prefix]
        argv += ["gateway", "--port", str(port), "--gateway-id", gw, *backends]
        # each gateway counts the others' in-flight loads on top of its own (`--peer`)
        for other in ports[:g] + ports[g + 1 :]:
            argv += ["--peer", f"http://127.0.0.1:{other}"]
        # block hashes in every event: `cacheroute evaluate --topic requests` can replay a run
        # kept with --keep-topics, prefixes included
        argv += ["--health-interval", "1", "--hash-blocks", str(DEMO_HASH_BLOCK_TOKENS)]
        children.append(start_child(gw, argv, run_dir / f"{gw}.log"))
        cluster.gateways[gw] = port
    for child, port in zip(children[-gateways:], cluster.gateways.values(), strict=True):
        wait_healthy(child, port, "/ready", timeout=START_TIMEOUT_S)
    return cluster


def start_loadgen(
    cluster: HttpCluster,
    *,
    rate: float,
    keys: int,
    cache_blocks: int,
    duration_s: float,
    run_dir: Path,
    on_line: Callable[[bytes], None],
) -> Child:
    """The load generator, sending to every gateway of `cluster` round-robin."""
    argv = ["-m", "cacheroute.demo.httpload"]
    for name, port in cluster.gateways.items():
        argv += ["--gateway", f"{name}={port}"]
    argv += ["--destinations", str(len(cluster.engines)), "--rate", str(rate)]
    argv += ["--keys", str(keys), "--cache-blocks", str(cache_blocks)]
    argv += ["--duration", str(duration_s)]
    return start_child("loadgen", argv, run_dir / "loadgen.log", on_line=on_line)


def _scrape_labelled(port: int, timeout: float = 1.0) -> list[tuple[str, dict[str, str], float]]:
    """Every sample at 127.0.0.1:port/metrics with its labels ([] when nothing answers)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout) as resp:
            text = resp.read().decode()
    except OSError:
        return []
    out = []
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m is None:
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        out.append((m.group(1), dict(_LABEL.findall(m.group(2) or "")), value))
    return out


def _gateway_metrics(port: int) -> dict[str, Any] | None:
    """What the view needs of one gateway's /metrics (None when it did not answer)."""
    samples = _scrape_labelled(port)
    if not samples:
        return None
    kinds: dict[str, int] = {}
    flat: dict[str, float] = {}
    for name, labels, value in samples:
        if name == "cacheroute_dispatcher_routed_total":
            kinds[labels.get("reason", "?")] = int(value)
        else:
            flat[name] = flat.get(name, 0.0) + value
    version = int(flat.get("cacheroute_dispatcher_plan_version", 0))
    return {
        "route_kinds": kinds,
        "plan_version": version or None,
        "plan_age_s": round(flat["cacheroute_dispatcher_plan_age_seconds"], 2) if version else None,
        "prompt_tokens": flat.get("cacheroute_gateway_prompt_tokens_total", 0.0),
        "cached_tokens": flat.get("cacheroute_gateway_cached_tokens_total", 0.0),
        "emitted": int(flat.get("cacheroute_emitter_accepted_total", 0)),
        "emit_dropped": int(
            flat.get("cacheroute_emitter_dropped_total", 0)
            + flat.get("cacheroute_emitter_rejected_total", 0)
        ),
        "events_sent": int(flat.get("cacheroute_emitter_events_sent_total", 0)),
    }


def merge_gateway(
    cluster: HttpCluster,
    name: str,
    scraped: dict[str, Any] | None,
    load: dict[str, Any] | None,
    previous: dict[str, Any] | None,
    *,
    final: bool = False,
) -> dict[str, Any]:
    """One gateway's stats in the in-process demo gateways' shape (so the view and the summary
    read both modes alike), plus the load generator's TTFT figures.

    Routing and token counts come from the gateway's own metrics; per-destination load and TTFT
    from the load generator (what it got back, by `x-cacheroute-backend`)."""
    out: dict[str, Any] = dict(previous or {"gateway": name})
    if scraped is not None:
        kinds = scraped["route_kinds"]
        prompt, cached = scraped["prompt_tokens"], scraped["cached_tokens"]
        last_prompt, last_cached = cluster.last_tokens.get(name, (0.0, 0.0))
        cluster.last_tokens[name] = (prompt, cached)
        window = prompt - last_prompt
        out.update(
            plan_version=scraped["plan_version"],
            plan_age_s=scraped["plan_age_s"],
            routed=sum(kinds.values()),
            routed_by_plan=kinds.get("plan", 0),
            route_kinds=kinds,
            hit_rate=cached / prompt if prompt else None,
            hit_rate_recent=(cached - last_cached) / window if window > 0 else None,
            emitted=scraped["emitted"],
            emit_dropped=scraped["emit_dropped"],
            events_sent=scraped["events_sent"],
        )
    if load is not None:
        out.update(
            load=load.get("load", []),
            load_total=load.get("load_total", []),
            ttft_p50_ms=load.get("ttft_p50_ms"),
            ttft_p99_ms=load.get("ttft_p99_ms"),
            ttft_recent_p50_ms=load.get("ttft_recent_p50_ms"),
            ttft_recent_p99_ms=load.get("ttft_recent_p99_ms"),
            requests_ok=load.get("ok", 0),
            requests_failed=load.get("failed", 0),
        )
    out["final"] = final
    return out


def poll(
    cluster: HttpCluster,
) -> tuple[dict[str, dict[str, Any] | None], dict[str, dict[str, float]]]:
    """Scrape every gateway (labelled) and every engine (cache and request counters)."""
    gws = {g: _gateway_metrics(port) for g, port in cluster.gateways.items()}
    engines = {
        e: scrape_metrics(port, _ENGINE_METRICS, timeout=1.0) for e, port in cluster.engines.items()
    }
    return gws, engines


def _engine_hit(m: dict[str, float]) -> float | None:
    queries = m.get("vllm:prefix_cache_queries_total", 0.0)
    return m.get("vllm:prefix_cache_hits_total", 0.0) / queries if queries else None


def engine_hit_rate(engines: dict[str, dict[str, float]]) -> float | None:
    """All engines together, token-weighted (as vLLM counts: hit tokens over queried tokens)."""
    queries = sum(m.get("vllm:prefix_cache_queries_total", 0.0) for m in engines.values())
    hits = sum(m.get("vllm:prefix_cache_hits_total", 0.0) for m in engines.values())
    return hits / queries if queries else None


def engine_rows(engines: dict[str, dict[str, float]]) -> dict[str, tuple[str, str, str]]:
    """Per engine (= destination) name: its own hit rate, requests served, running/waiting."""
    out = {}
    for name, m in engines.items():
        hit = _engine_hit(m)
        out[name] = (
            "-" if hit is None else f"{100 * hit:.1f}%",
            str(int(m.get("vllm:request_success_total", 0))),
            f"{int(m.get('vllm:num_requests_running', 0))}/"
            f"{int(m.get('vllm:num_requests_waiting', 0))}",
        )
    return out


def _ms(x: object) -> str:
    return f"{x:.0f}" if isinstance(x, int | float) else "-"


def _pct(x: object) -> str:
    return f"{100 * x:.1f}%" if isinstance(x, int | float) else "-"


def summary_line(loadgen: dict[str, Any], engines: dict[str, dict[str, float]]) -> Text:
    """The comparison the HTTP mode exists for: the engines' hit rate vs Flat-LB's, and TTFT."""
    flat = loadgen.get("flat_lb") or {}
    text = Text()
    text.append("prefix-cache hit rate: ")
    text.append(f"CacheRoute (engines) {_pct(engine_hit_rate(engines))}", style="bold green")
    text.append(f"  vs  Flat-LB (shadow P2C) {_pct(flat.get('hit_rate'))}", style="bold")
    text.append(
        f"   TTFT p50 {_ms(loadgen.get('ttft_p50_ms'))} ms  p99 {_ms(loadgen.get('ttft_p99_ms'))} ms"
        f"   requests {loadgen.get('ok', 0)} ok"
        f" / {loadgen.get('sent', 0)} sent at {loadgen.get('achieved_rate', 0)} req/s"
        f" (offered {loadgen.get('offered_rate', '-')}), failed {loadgen.get('failed') or 0}"
    )
    return text


def ttft_columns(table: Table) -> None:
    """The gateways table's extra columns in HTTP mode."""
    for col in ("TTFT p50 ms", "TTFT p99 ms", "p50 last 1 s"):
        table.add_column(col, justify="right")


def ttft_cells(stats: dict[str, Any]) -> tuple[str, str, str]:
    """One gateway's TTFT cells (over the run, and over the last stats interval)."""
    return (
        _ms(stats.get("ttft_p50_ms")),
        _ms(stats.get("ttft_p99_ms")),
        _ms(stats.get("ttft_recent_p50_ms")),
    )


def http_summary(loadgen: dict[str, Any], engines: dict[str, dict[str, float]]) -> dict[str, Any]:
    """The summary fields only the HTTP mode measures."""
    flat = loadgen.get("flat_lb") or {}
    return {
        "ttft_p50_ms": loadgen.get("ttft_p50_ms"),
        "ttft_p99_ms": loadgen.get("ttft_p99_ms"),
        "engine_hit_rate": engine_hit_rate(engines),
        "flat_lb_hit_rate": flat.get("hit_rate"),
        "flat_lb_load_total": flat.get("load_total"),
        "requests": {
            "sent": loadgen.get("sent", 0),
            "ok": loadgen.get("ok", 0),
            "failed": loadgen.get("failed", {}),
            "final": bool(loadgen.get("final", False)),
        },
        "engines": [
            {
                "engine": name,
                "hit_rate": _engine_hit(m),
                "requests": int(m.get("vllm:request_success_total", 0)),
                "prompt_tokens": int(m.get("vllm:prefix_cache_queries_total", 0)),
            }
            for name, m in sorted(engines.items())
        ],
    }
