"""The live demo's conductor: topics, streams worker, planner, gateways, live view, clean-up.

Two modes. In-process (the default): G demo gateway processes replay the workload through real
dispatchers and emitters against a simulated cluster (cacheroute.demo.gateway). HTTP (`http`):
R engine stand-ins, G real `cacheroute gateway` processes and a load generator that replays the
same workload over HTTP (cacheroute.demo.httpmode, cacheroute.demo.httpload).

Everything it starts it stops again by pid (SIGTERM, then SIGKILL), in `finally`: the load
generator first (so no request meets a stopping gateway), then the gateways (they flush their
emitters), then the engines, the planner and the streams worker; its run topics are deleted at the
end unless asked to keep them. The broker is started (and stopped) by the CLI command, never here.
"""

from __future__ import annotations

import secrets
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from confluent_kafka import Consumer, TopicPartition
from rich.console import Console
from rich.live import Live

from cacheroute.demo import httpmode
from cacheroute.demo.procs import Child, start_child
from cacheroute.demo.view import DemoState, progress_line, render
from cacheroute.dispatcher.follower import FollowerConfig, PlanFollower
from cacheroute.dispatcher.reader import LivePlan
from cacheroute.kafkaio import consumer_config
from cacheroute.loopback import free_port, scrape_metrics
from cacheroute.settings import Settings
from cacheroute.topics import ensure_topics, make_admin

__all__ = ["DemoOptions", "run_demo"]

STREAMS_METRICS = (
    "cacheroute_streams_events_accepted_total",
    "cacheroute_streams_events_late_total",
    "cacheroute_streams_rates_emitted_total",
)
PLANNER_METRICS = (
    "cacheroute_planner_version",
    "cacheroute_planner_admitted_keys",
    "cacheroute_planner_slots_used",
    "cacheroute_planner_moved_rate_fraction",
    "cacheroute_planner_imbalance",
    "cacheroute_planner_tracked_keys",
)


@dataclass(frozen=True)
class DemoOptions:
    """Knobs of one demo run."""

    duration_s: float = 60.0
    interval_s: float = 5.0
    gateways: int = 2
    destinations: int = 8
    rate: float = 2000.0
    keys: int = 2000
    q_cap: float = 4.0
    warm_slots: int = 64
    cache_blocks: int = 2048
    grace_ms: int = 1000
    max_plan_age_s: float | None = None
    """Planner's --max-plan-age (None: the planner's default, 10 intervals)."""
    live: bool = True
    keep_topics: bool = False
    http: bool = False
    """Real gateways and engine stand-ins over HTTP instead of the in-process gateways; the
    engines are the destinations (`destinations` must equal `engines`)."""
    engines: int = 4
    run_id: str = field(default_factory=lambda: secrets.token_hex(4))


_STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def run_demo(settings: Settings, options: DemoOptions, console: Console) -> dict[str, Any]:
    """Run the pipeline for `options.duration_s` seconds (or until Ctrl-C); return the summary."""
    prefix = f"{settings.topic_prefix}demo-{options.run_id}."
    run_settings = settings.with_overrides(topic_prefix=prefix)
    run_dir = settings.home / "demo" / options.run_id
    console.print(f"demo run {options.run_id}: topics {prefix}*, logs in {run_dir}")
    ensure_topics(run_settings)
    state = DemoState()
    children: list[Child] = []
    follower: PlanFollower | None = None
    cluster: httpmode.HttpCluster | None = None
    interrupted = False
    started = time.monotonic()
    # SIGTERM (kill, a supervisor) and SIGHUP (terminal closed) stop the demo like Ctrl-C, so the
    # children it started never outlive it
    on_main = threading.current_thread() is threading.main_thread()
    saved = {sig: signal.signal(sig, _interrupt) for sig in _STOP_SIGNALS} if on_main else {}
    try:
        streams_port, planner_port = free_port(), free_port()
        base = ["-m", "cacheroute", "--bootstrap", settings.bootstrap, "--topic-prefix", prefix]
        children.append(
            start_child(
                "streams",
                [
                    *base,
                    "streams",
                    "run",
                    "--window-ms",
                    str(int(options.interval_s * 1000)),
                    "--grace-ms",
                    str(options.grace_ms),
                    "--buckets",
                    "8",
                    "--app-id",
                    f"demo-{options.run_id}-streams",
                    "--flush-interval",
                    "0.5",
                    "--metrics-port",
                    str(streams_port),
                    "--loglevel",
                    "warn",
                ],
                run_dir / "streams.log",
            )
        )
        children.append(
            start_child(
                "planner",
                [
                    *base,
                    "planner",
                    "run",
                    "--destinations",
                    str(options.destinations),
                    "--q-cap",
                    str(options.q_cap),
                    "--warm-slots",
                    str(options.warm_slots),
                    "--interval",
                    str(options.interval_s),
                    "--group",
                    f"demo-{options.run_id}-planner",
                    "--planner-id",
                    f"demo-{options.run_id}",
                    "--metrics-port",
                    str(planner_port),
                    *(
                        []
                        if options.max_plan_age_s is None
                        else ["--max-plan-age", str(options.max_plan_age_s)]
                    ),
                ],
                run_dir / "planner.log",
            )
        )
        if options.http:
            cluster = httpmode.start_cluster(
                engines=options.engines,
                gateways=options.gateways,
                cache_blocks=options.cache_blocks,
                bootstrap=settings.bootstrap,
                prefix=prefix,
                run_dir=run_dir,
                children=children,
            )
            console.print(
                f"engines ready: {', '.join(f'{e}=:{p}' for e, p in cluster.engines.items())}; "
                f"gateways ready: {', '.join(f'{g}=:{p}' for g, p in cluster.gateways.items())}"
            )
            children.append(
                httpmode.start_loadgen(
                    cluster,
                    rate=options.rate,
                    keys=options.keys,
                    cache_blocks=options.cache_blocks,
                    duration_s=options.duration_s + 60,
                    run_dir=run_dir,
                    on_line=_loadgen_reader(state),
                )
            )
        for g in range(0 if options.http else options.gateways):
            gw = f"gw-{g}"
            children.append(
                start_child(
                    gw,
                    [
                        "-m",
                        "cacheroute.demo.gateway",
                        "--bootstrap",
                        settings.bootstrap,
                        "--topic-prefix",
                        prefix,
                        "--gateway-id",
                        gw,
                        "--index",
                        str(g),
                        "--gateways",
                        str(options.gateways),
                        "--destinations",
                        str(options.destinations),
                        "--rate",
                        str(options.rate),
                        "--keys",
                        str(options.keys),
                        "--cache-blocks",
                        str(options.cache_blocks),
                        "--interval",
                        str(options.interval_s),
                        "--duration",
                        str(options.duration_s + 60),
                    ],
                    run_dir / f"{gw}.log",
                    on_line=_gateway_reader(state),
                )
            )
        console.print(
            "started "
            + ", ".join(f"{c.name} (pid {c.pid})" for c in children)
            + f"; running {options.duration_s:g} s (Ctrl-C stops early)"
        )

        def on_plan(live: LivePlan) -> None:
            with state.lock:
                state.plan = live
                state.plan_versions.append(live.version)

        follower = PlanFollower(
            run_settings,
            FollowerConfig(build_index=False, client_id=f"demo-{options.run_id}-view"),
            on_plan=on_plan,
        ).start()
        dlq = Consumer(consumer_config(run_settings, group_id=f"demo-{options.run_id}-dlq"))
        try:
            interrupted = _watch(
                state,
                options,
                children,
                streams_port,
                planner_port,
                dlq,
                run_settings,
                console,
                cluster,
            )
        finally:
            dlq.close()
    except KeyboardInterrupt:
        interrupted = True
    finally:
        _shutdown(
            children,
            follower,
            before_gateways=None
            if cluster is None
            else lambda: _poll_http(state, cluster, final=True),
            options=options,
            run_settings=run_settings,
            console=console,
            saved=saved,
        )
    return _summary(state, options, prefix, time.monotonic() - started, interrupted, children)


def _shutdown(
    children: list[Child],
    follower: PlanFollower | None,
    *,
    before_gateways: Callable[[], None] | None,
    options: DemoOptions,
    run_settings: Settings,
    console: Console,
    saved: dict[signal.Signals, Any],
) -> None:
    """Stop every child by pid, close the view's follower, delete the run topics.

    `before_gateways` runs once the load generator is stopped and the gateways still answer
    (HTTP mode: the last scrape of their counters)."""
    shield = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if shield else None
    for sig in saved:  # cleanup must not be cut short by a second signal
        signal.signal(sig, signal.SIG_IGN)
    console.print("stopping " + ", ".join(f"{c.name} (pid {c.pid})" for c in children))
    _stop_load(children, before_gateways, console)
    gateways = [c for c in children if c.name.startswith("gw-")]
    for c in gateways:  # all at once: each flushes its emitter on SIGTERM
        if c.alive():
            c.proc.terminate()
    for c in gateways:  # up to 10 s of emitter flush, then the follower's close, then stats
        c.stop(timeout=30.0)
    for c in children:
        if c not in gateways:
            c.stop()
    if follower is not None:
        follower.close()
    if not options.keep_topics:
        _delete_topics(run_settings, options.run_id, console)
    if shield:
        signal.signal(signal.SIGINT, previous)
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def _stop_load(
    children: list[Child], before_gateways: Callable[[], None] | None, console: Console
) -> None:
    """HTTP mode: stop the load generator first (no request meets a stopping gateway; it drains
    for up to 3 s and reports), then let `before_gateways` scrape what the gateways counted."""
    for c in children:
        if c.name == "loadgen":
            c.stop(timeout=20.0)
    if before_gateways is not None:
        try:
            before_gateways()
        except Exception as exc:  # a last scrape is not worth leaving processes behind
            console.print(f"[yellow]last scrape of the gateways failed: {exc}[/]")


def _loadgen_reader(state: DemoState) -> Callable[[bytes], None]:
    """HTTP mode: keep the load generator's last stats line."""

    def on_line(line: bytes) -> None:
        try:
            stats = orjson.loads(line)
        except orjson.JSONDecodeError:
            return
        if isinstance(stats, dict) and stats.get("loadgen"):
            with state.lock:
                state.loadgen = stats

    return on_line


def _poll_http(state: DemoState, cluster: httpmode.HttpCluster, *, final: bool = False) -> None:
    """HTTP mode: scrape the gateways and the engines into the per-gateway stats."""
    gws, engines = httpmode.poll(cluster)
    with state.lock:
        per_gateway = state.loadgen.get("gateways", {})
        for g, scraped in gws.items():
            state.gateways[g] = httpmode.merge_gateway(
                cluster, g, scraped, per_gateway.get(g), state.gateways.get(g), final=final
            )
        for e, m in engines.items():
            if m:  # an engine that did not answer keeps its last counters
                state.engines[e] = m


def _gateway_reader(state: DemoState) -> Callable[[bytes], None]:
    def on_line(line: bytes) -> None:
        try:
            stats = orjson.loads(line)
        except orjson.JSONDecodeError:
            return
        if isinstance(stats, dict) and "gateway" in stats:
            with state.lock:
                state.gateways[str(stats["gateway"])] = stats

    return on_line


def _watch(  # noqa: PLR0912, PLR0917 - the conductor's loop takes the run's parts
    state: DemoState,
    options: DemoOptions,
    children: list[Child],
    streams_port: int,
    planner_port: int,
    dlq: Consumer,
    settings: Settings,
    console: Console,
    cluster: httpmode.HttpCluster | None = None,
) -> bool:
    """Poll metrics once a second and draw the view until the duration is over; True on Ctrl-C."""
    deadline = time.monotonic() + options.duration_s
    dlq_topic = settings.topics["dead_letter"]
    dlq_parts = [TopicPartition(dlq_topic, p) for p in range(settings.dead_letter_partitions)]
    last_events, last_t = 0.0, time.monotonic()
    last_progress = 0.0
    live = Live(console=console, refresh_per_second=2, transient=False) if options.live else None
    try:
        if live is not None:
            live.start()
        while True:
            now = time.monotonic()
            if now >= deadline:
                return False
            for c in children:
                if not c.alive():
                    console.print(f"[red]{c.name} exited ({c.proc.returncode})[/]:\n{c.tail()}")
                    state.failed = c.name
                    return False
            if cluster is not None:
                _poll_http(state, cluster)
            streams = scrape_metrics(streams_port, STREAMS_METRICS, timeout=1.0)
            planner = scrape_metrics(planner_port, PLANNER_METRICS, timeout=1.0)
            dead = 0
            for tp in dlq_parts:
                try:
                    low, high = dlq.get_watermark_offsets(tp, timeout=1.0)
                    dead += max(0, high - low)
                except Exception:
                    dead = state.dead_letters
                    break
            events = streams.get("cacheroute_streams_events_accepted_total", 0.0)
            with state.lock:
                state.streams.update(streams)
                old_version = state.planner.get("cacheroute_planner_version")
                state.planner.update(planner)
                version = planner.get("cacheroute_planner_version")
                if version and version != old_version:
                    state.moved.append(
                        (int(version), planner.get("cacheroute_planner_moved_rate_fraction"))
                    )
                state.events_per_s = (events - last_events) / max(now - last_t, 1e-9)
                state.dead_letters = dead
            last_events, last_t = events, now
            if live is not None:
                live.update(render(state, options, deadline - now))
            elif now - last_progress >= 5.0:
                last_progress = now
                console.print(progress_line(state, deadline - now))
            time.sleep(1.0)
    except KeyboardInterrupt:
        return True
    finally:
        if live is not None:
            live.stop()


def _delete_topics(settings: Settings, run_id: str, console: Console) -> None:
    """Delete the run's topics (its prefix, and Faust's internal `demo-<id>-streams-*` topics) and
    its consumer groups."""
    admin = make_admin(settings)
    internal = f"demo-{run_id}-streams-"
    try:
        existing = set(admin.list_topics(timeout=10).topics)
        names = sorted(t for t in existing if t.startswith((settings.topic_prefix, internal)))
        for name, fut in admin.delete_topics(names, operation_timeout=15).items() if names else ():
            try:
                fut.result(timeout=20)
            except Exception as exc:  # report and go on with the others
                console.print(f"[yellow]could not delete topic {name}: {exc}[/]")
        groups = [
            g.group_id
            for g in admin.list_consumer_groups(request_timeout=10).result(timeout=15).valid
            if f"demo-{run_id}" in g.group_id
        ]
        if groups:
            for fut in admin.delete_consumer_groups(groups, request_timeout=10).values():
                try:
                    fut.result(timeout=15)
                except Exception as exc:  # a group may still be settling: not worth failing
                    console.print(f"[yellow]could not delete a consumer group: {exc}[/]")
    except Exception as exc:
        console.print(f"[yellow]could not delete the run topics: {exc}[/]")
    else:
        console.print(f"deleted {len(names)} topics and {len(groups)} consumer groups of this run")


def _summary(  # noqa: PLR0917
    state: DemoState,
    options: DemoOptions,
    prefix: str,
    seconds: float,
    interrupted: bool,
    children: list[Child],
) -> dict[str, Any]:
    with state.lock:
        plan = None if state.plan is None else state.plan.plan
        gateways = [
            {
                "gateway": g,
                "plan_version": s.get("plan_version"),
                "routed": s.get("routed", 0),
                "routed_by_plan": s.get("routed_by_plan", 0),
                "route_kinds": s.get("route_kinds", {}),
                "hit_rate": s.get("hit_rate"),
                "hit_rate_plan": s.get("hit_rate_plan"),
                "hit_rate_other": s.get("hit_rate_other"),
                "emitted": s.get("emitted", 0),
                "events_sent": s.get("events_sent", 0),
                "load_total": s.get("load_total", []),
                "final": bool(s.get("final", False)),
                "ttft_p50_ms": s.get("ttft_p50_ms"),
                "ttft_p99_ms": s.get("ttft_p99_ms"),
            }
            for g, s in sorted(state.gateways.items())
        ]
        http = (
            httpmode.http_summary(state.loadgen, state.engines)
            if options.http
            else {
                "ttft_p50_ms": None,
                "ttft_p99_ms": None,
                "engine_hit_rate": None,
                "flat_lb_hit_rate": None,
            }
        )
        return {
            "run_id": options.run_id,
            "mode": "http" if options.http else "in-process",
            "topic_prefix": prefix,
            "observed_max_over_mean": _observed_max_over_mean(gateways),
            "seconds": round(seconds, 1),
            "interrupted": interrupted,
            "failed": state.failed,
            "plan_versions": len(set(state.plan_versions)),
            "plan_version": None if plan is None else plan.version,
            "admitted_keys": None if plan is None else plan.n_admitted,
            "slots_used": None if plan is None else plan.slots_used,
            "expected_load": None if plan is None else [round(float(x), 2) for x in plan.loads],
            "moved_rate": [{"version": v, "fraction": m} for v, m in state.moved],
            "events": int(state.streams.get("cacheroute_streams_events_accepted_total", 0)),
            "events_late": int(state.streams.get("cacheroute_streams_events_late_total", 0)),
            "rates_emitted": int(state.streams.get("cacheroute_streams_rates_emitted_total", 0)),
            "dead_letters": state.dead_letters,
            "gateways": gateways,
            "processes": [
                {"name": c.name, "pid": c.pid, "returncode": c.proc.returncode} for c in children
            ],
            **http,
        }


def _observed_max_over_mean(gateways: list[dict[str, Any]]) -> float | None:
    """Requests routed per destination over the run, all gateways together: max over mean.

    The plan's `expected_load` says how even routing should be; this says how even it was.
    """
    totals: list[int] = []
    for g in gateways:
        for i, x in enumerate(g.get("load_total") or []):
            if i >= len(totals):
                totals.extend([0] * (i + 1 - len(totals)))
            totals[i] += int(x)
    mean = sum(totals) / len(totals) if totals else 0.0
    return round(max(totals) / mean, 4) if mean > 0 else None


def write_json(summary: dict[str, Any]) -> str:
    """The summary as one JSON line."""
    return orjson.dumps(summary).decode()
