"""`cacheroute bench propagation`: how long a committed plan version takes to reach every gateway.

What is timed, per new plan version and gateway: from the planner's commit (the publisher's
call of `commit_transaction`, stamped in `_TimedPublisher._commit` just before it) to that gateway's
`Dispatcher` having applied the version (its routing table swapped in). Gateways are separate OS
processes (`python -m cacheroute.benchmarks.propagation --child ...`), each running a real
`Dispatcher(...).follow(settings)` on the real broker, so decoding and building the table happen
where they do in production, with every gateway competing for the same cores.

How the gateway side is observed: the Dispatcher offers no callback for a new version, but its
Kafka subscription hands every version to `Dispatcher.apply_plan` (dispatcher/subscription.py). The
child's `_TimedDispatcher` overrides that one method: it calls the real one and, when it returns
True (the table was swapped), stamps `time.time_ns()` and prints `{"version", "applied_ns"}` as a
JSON line on stdout. That is exact to the call and adds no polling thread that would compete for
the GIL with the table build; the stamp is taken after the swap and the staleness check that
`apply_plan` runs right after it (microseconds). Parent and children read the same host clock
(`time.time_ns()`), so the difference of the two stamps is the propagation time.

The run has two phases, in this order, on one topic: one gateway (the same-run baseline,
`single_gateway_*`), then `gateways` gateways. Each phase starts its gateways, waits until every
one has read the topic to its end, publishes one untimed warm-up version (first-use costs of the
child: imports, allocator growth), then `versions` timed ones. Plans are built from the paper-like
workload (`paper_workload`, keys `tenant/conversation`) with the planner service's default
parameters (so the plans carry sibling groups, as in production), rates drifted a little per
version (log-normal, `sigma`) and re-planned from the previous plan, as the planner service
does. A version is built and published
only after every gateway has reported the previous one and at least `interval_s` after the
previous commit: plan building never overlaps a measurement, and the only sleeps are there,
outside the timed path. The topics are per-run (`<prefix>bench-propagation-<hex>.`) and deleted
at the end; the children are stopped by pid, always.

On a 2-core machine the 8 children share the cores with the broker and this process, so the
numbers are an upper bound for gateways on their own hosts; compare figures of the same run
(`p50_ratio`, `p99_ratio`). With 5 versions, p99 over one gateway is effectively its maximum.

The result's fields, in order and each with its meaning, are `RESULT_FIELDS`.
"""

from __future__ import annotations

import logging
import queue
import signal
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
import numpy as np
import orjson
from confluent_kafka import Producer

from cacheroute.demo.procs import Child, start_child
from cacheroute.dispatcher.dispatcher import Dispatcher
from cacheroute.dispatcher.follower import PlanFollower
from cacheroute.dispatcher.routing import PlanLike, compiled_groups
from cacheroute.errors import CacheRouteError
from cacheroute.planner import Plan, build_plan
from cacheroute.planner.workload import PAPER_KEYS, default_q_cap, drift, paper_workload
from cacheroute.planservice.config import load_service_config
from cacheroute.planservice.publisher import PlanPublisher, PublishResult
from cacheroute.schemas.codec import compiled_strings
from cacheroute.settings import Settings
from cacheroute.topics import ensure_topics, make_admin

__all__ = ["RESULT_FIELDS", "PropagationBench", "run_propagation_bench", "total_steps"]

log = logging.getLogger(__name__)

RESULT_FIELDS: dict[str, str] = {
    "gateways": "gateway processes of the measured phase",
    "keys": "keys of the workload the plans are built from",
    "destinations": "destinations of the plans (and of every gateway)",
    "versions": "timed versions per phase (after one untimed warm-up version)",
    "interval_s": "least time between two commits",
    "plan_bytes": "encoded size of the last timed version (header and chunks)",
    "plan_chunks": "chunk records of the last timed version",
    "admitted_keys": "keys the last plan admits (what a gateway decodes and indexes)",
    "pairs": "(version, gateway) pairs observed in the measured phase",
    "missing_pairs": "pairs never reported within the timeout, both phases ([] when complete)",
    "p50_ms": "median commit -> applied over the measured phase's pairs",
    "p99_ms": "99th percentile of the same (linear interpolation)",
    "max_ms": "slowest pair",
    "min_ms": "fastest pair",
    "single_gateway_p50_ms": "median commit -> applied with one gateway, same run",
    "single_gateway_p99_ms": "99th percentile of the same (with few versions: about its maximum)",
    "single_gateway_max_ms": "slowest version with one gateway",
    "p50_ratio": "p50_ms / single_gateway_p50_ms",
    "p99_ratio": "p99_ms / single_gateway_p99_ms",
    "publish_ms": "median time of one publish (encode, produce, commit) in the measured phase",
    "per_version": "per timed version: publish_ms and the first and last gateway's latency",
    "observed_by": "how the gateway side is stamped (apply_plan-hook: no polling)",
    "compiled_decode": "whether the gateways read keys and groups with compiled passes (numba "
    "installed; the base install reads them in Python)",
}
"""Every key of the result object, in order, with its meaning (the test checks them all)."""

OBSERVED_BY = "apply_plan-hook"
"""How the gateway side is stamped (see the module docstring): no polling."""


@dataclass(frozen=True)
class PropagationBench:
    """Knobs of the benchmark."""

    gateways: int = 8
    keys: int = PAPER_KEYS
    versions: int = 5
    destinations: int = 30
    warm_slots: int = 2048
    """W per destination; 2048 at 30 destinations admits about half the paper-like keys."""
    interval_s: float = 3.0
    """Least time between two commits (the next version also waits for every gateway)."""
    sigma: float = 0.05
    """Log-normal drift of every rate per version: a plan that changes a little."""
    seed: int = 0
    timeout_s: float = 120.0
    """Longest wait for every gateway to report one version (or to start)."""


def total_steps(cfg: PropagationBench) -> int:
    """Progress steps of one run: per phase, starting the gateways, the warm-up and each version."""
    return 2 * (cfg.versions + 2)


# ----------------------------------------------------------------------------- parent side
class _TimedPublisher(PlanPublisher):
    """A `PlanPublisher` that stamps the moment it asks the broker to commit its transaction.

    Not when the call returns: the broker writes the commit markers before it answers, so a
    read_committed gateway can apply the version a millisecond before `commit_transaction`
    returns here, and a stamp after the call measured negative propagation times under load.
    From the call's start a pair includes the commit round trip: never shorter than the truth."""

    committed_ns = 0

    def _commit(self, producer: Producer, timeout: float) -> None:
        self.committed_ns = time.time_ns()
        super()._commit(producer, timeout)


class _Plans:
    """Successive plan versions of one drifting paper-like workload (re-planned from the last)."""

    def __init__(self, cfg: PropagationBench) -> None:
        self.rng = np.random.default_rng(cfg.seed)
        work = paper_workload(cfg.keys, self.rng)
        self.keys = work.keys
        self.rates = work.rates
        # the planner service's defaults (sibling co-location on '/', fair share, ...): the
        # gateways then build what they build in production, sibling groups included
        self.params = load_service_config(
            overrides={
                "destinations": cfg.destinations,
                "q_cap": default_q_cap(float(work.rates.sum())),
                "warm_slots": cfg.warm_slots,
            }
        ).params
        self.destinations = [f"d{i}" for i in range(cfg.destinations)]
        self.sigma = cfg.sigma
        self.prev: Plan | None = None

    def next(self, version: int) -> Plan:
        """The plan of `version`: rates drifted a little, created now."""
        if self.prev is not None:
            self.rates = drift(self.rates, self.sigma, self.rng)
        plan = build_plan(
            self.keys,
            self.rates,
            self.destinations,
            self.params,
            prev=self.prev,
            version=version,
            created_ms=time.time_ns() // 1_000_000,
        )
        self.prev = plan
        return plan


@dataclass
class _Gateways:
    """The gateway children of one phase and what they reported (fed by their stdout readers)."""

    children: list[Child] = field(default_factory=list)
    events: queue.Queue[tuple[int, dict[str, Any]]] = field(default_factory=queue.Queue)
    ready: set[int] = field(default_factory=set)
    applied: dict[tuple[int, int], int] = field(default_factory=dict)
    """(version, gateway) -> applied_ns."""

    def start(self, n: int, settings: Settings, cfg: PropagationBench, logs: Path) -> None:
        for g in range(n):
            argv = ["-m", "cacheroute.benchmarks.propagation", "--child", f"--gateway={g}"]
            argv += [f"--bootstrap={settings.bootstrap}", f"--topic-prefix={settings.topic_prefix}"]
            argv += [f"--destinations={cfg.destinations}"]
            if settings.kafka_config is not None:
                argv.append(f"--kafka-config={settings.kafka_config}")
            self.children.append(
                start_child(
                    f"gateway-{g}", argv, logs / f"gateway-{g}.log", on_line=self._reader(g)
                )
            )

    def _reader(self, g: int) -> Callable[[bytes], None]:
        def on_line(line: bytes) -> None:
            try:
                event = orjson.loads(line)
            except orjson.JSONDecodeError:
                return  # not ours (a library printing to stdout)
            if isinstance(event, dict):
                self.events.put((g, event))

        return on_line

    def _drain(self, until: float) -> None:
        """Take the reports that arrive until `until` (monotonic) or the next one, if sooner."""
        try:
            g, event = self.events.get(timeout=max(0.0, min(0.25, until - time.monotonic())))
        except queue.Empty:
            return
        while True:
            if event.get("ready"):
                self.ready.add(g)
            elif "version" in event:
                self.applied[(int(event["version"]), g)] = int(event["applied_ns"])
            try:
                g, event = self.events.get_nowait()
            except queue.Empty:
                return

    def _check_alive(self) -> None:
        for child in self.children:
            if not child.alive():
                raise CacheRouteError(
                    f"{child.name} (pid {child.pid}) exited during the benchmark:\n{child.tail()}"
                )

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while len(self.ready) < len(self.children):
            if time.monotonic() > deadline:
                late = sorted(set(range(len(self.children))) - self.ready)
                raise CacheRouteError(
                    f"gateways {late} did not catch up with the plans topic in {timeout:.0f} s:\n"
                    + self.children[late[0]].tail()
                )
            self._check_alive()
            self._drain(deadline)

    def wait_version(self, version: int, timeout: float) -> list[int]:
        """Wait until every gateway reported `version`; the gateways that did not, on timeout."""
        deadline = time.monotonic() + timeout
        while True:
            missing = [g for g in range(len(self.children)) if (version, g) not in self.applied]
            if not missing or time.monotonic() > deadline:
                return missing
            self._check_alive()
            self._drain(deadline)

    def stop(self) -> None:
        for child in reversed(self.children):
            child.stop()


@dataclass
class _Phase:
    """What one phase measured."""

    gateways: int
    commits: dict[int, int] = field(default_factory=dict)
    """Timed version -> commit_ns."""
    applied: dict[tuple[int, int], int] = field(default_factory=dict)
    published: list[PublishResult] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)

    def samples_ms(self) -> list[float]:
        return [
            (self.applied[(v, g)] - at) / 1e6
            for v, at in sorted(self.commits.items())
            for g in range(self.gateways)
            if (v, g) in self.applied
        ]


def _phase(
    n: int,
    *,
    settings: Settings,
    cfg: PropagationBench,
    plans: _Plans,
    publisher: _TimedPublisher,
    logs: Path,
    advance: Callable[[str], None],
) -> _Phase:
    """Start `n` gateways, publish a warm-up and `cfg.versions` timed versions, stop them."""
    gateways = _Gateways()
    phase = _Phase(n)
    try:
        advance(f"{n} gateway(s): starting and catching up")
        gateways.start(n, settings, cfg, logs / f"phase-{n}")
        gateways.wait_ready(cfg.timeout_s)
        last_commit = 0.0
        for i in range(cfg.versions + 1):
            timed = i > 0
            version = publisher.next_version
            plan = plans.next(version)  # built before the wait: never during a measurement
            pause = last_commit + cfg.interval_s - time.monotonic()
            if pause > 0:
                time.sleep(pause)  # between versions, outside the timed path
            advance(f"{n} gateway(s): version {version}" + ("" if timed else " (warm-up)"))
            result = publisher.publish(plan)
            last_commit = time.monotonic()
            missing = gateways.wait_version(version, cfg.timeout_s)
            if timed:
                phase.commits[version] = publisher.committed_ns
                phase.published.append(result)
            elif missing:
                raise CacheRouteError(
                    f"warm-up version {version} did not reach gateways {missing} in "
                    f"{cfg.timeout_s:.0f} s:\n{gateways.children[missing[0]].tail()}"
                )
        phase.applied = dict(gateways.applied)  # late reports of a timed-out wait count too
        phase.missing = [
            f"v{v}/gateway-{g}"
            for v in phase.commits
            for g in range(n)
            if (v, g) not in phase.applied
        ]
    finally:
        gateways.stop()
    return phase


def _pct(values: Sequence[float], q: float) -> float:
    return round(float(np.percentile(values, q)), 3) if values else float("nan")


def _summary(single: _Phase, multi: _Phase, cfg: PropagationBench, admitted: int) -> dict[str, Any]:
    many = multi.samples_ms()
    one = single.samples_ms()
    last = multi.published[-1]
    per_version = []
    for (version, at), published in zip(
        sorted(multi.commits.items()), multi.published, strict=True
    ):
        got = [
            (multi.applied[(version, g)] - at) / 1e6
            for g in range(multi.gateways)
            if (version, g) in multi.applied
        ]
        per_version.append(
            {
                "version": version,
                "publish_ms": round(published.seconds * 1e3, 3),
                "first_ms": round(min(got), 3) if got else None,
                "last_ms": round(max(got), 3) if got else None,
                "gateways": len(got),
            }
        )
    result: dict[str, Any] = {
        "gateways": cfg.gateways,
        "keys": cfg.keys,
        "destinations": cfg.destinations,
        "versions": cfg.versions,
        "interval_s": cfg.interval_s,
        "plan_bytes": last.bytes,
        "plan_chunks": last.chunks,
        "admitted_keys": admitted,
        "pairs": len(many),
        "missing_pairs": single.missing + multi.missing,
        "p50_ms": _pct(many, 50),
        "p99_ms": _pct(many, 99),
        "max_ms": round(max(many), 3) if many else float("nan"),
        "min_ms": round(min(many), 3) if many else float("nan"),
        "single_gateway_p50_ms": _pct(one, 50),
        "single_gateway_p99_ms": _pct(one, 99),
        "single_gateway_max_ms": round(max(one), 3) if one else float("nan"),
        "p50_ratio": 0.0,
        "p99_ratio": 0.0,
        "publish_ms": _pct([p.seconds * 1e3 for p in multi.published], 50),
        "per_version": per_version,
        "observed_by": OBSERVED_BY,
        # the children run this interpreter with these packages
        "compiled_decode": compiled_strings() is not None and compiled_groups() is not None,
    }
    for q in ("p50", "p99"):
        base = result[f"single_gateway_{q}_ms"]
        result[f"{q}_ratio"] = round(result[f"{q}_ms"] / base, 3) if base > 0 else float("nan")
    assert tuple(result) == tuple(RESULT_FIELDS)
    return result


def run_propagation_bench(
    settings: Settings,
    cfg: PropagationBench,
    advance: Callable[[str], None] = lambda _: None,
) -> dict[str, Any]:
    """Run both phases on per-run topics (deleted at the end); return the figures.

    `advance(description)` is called at the start of each of the `total_steps(cfg)` steps.
    """
    run = f"{settings.topic_prefix}bench-propagation-{uuid.uuid4().hex[:8]}."
    bench_settings = settings.with_overrides(topic_prefix=run)
    ensure_topics(bench_settings)
    publisher = _TimedPublisher(bench_settings, transactional_id=f"{run}planner")
    try:
        plans = _Plans(cfg)
        publisher.start()
        with tempfile.TemporaryDirectory(prefix="cacheroute-bench-propagation-") as tmp:
            logs = Path(tmp)
            single, multi = (
                _phase(
                    n,
                    settings=bench_settings,
                    cfg=cfg,
                    plans=plans,
                    publisher=publisher,
                    logs=logs,
                    advance=advance,
                )
                for n in (1, cfg.gateways)
            )
        admitted = plans.prev.n_admitted if plans.prev is not None else 0
    finally:
        publisher.close()
        _delete_topics(bench_settings, run)
    if single.missing or multi.missing:
        log.warning("versions that never reached a gateway: %s", single.missing + multi.missing)
    return _summary(single, multi, cfg, admitted)


def _delete_topics(settings: Settings, prefix: str) -> None:
    admin = make_admin(settings)
    ours = [t for t in admin.list_topics(timeout=10).topics if t.startswith(prefix)]
    if ours:
        for fut in admin.delete_topics(ours, operation_timeout=30).values():
            fut.result(timeout=30)


# ------------------------------------------------------------------------------ child side
class _TimedDispatcher(Dispatcher):
    """A real Dispatcher that reports each version it swapped in, stamped right after the swap."""

    def __init__(self, destinations: Sequence[str], out: Callable[[bytes], None]) -> None:
        super().__init__(destinations)
        self._out = out

    def apply_plan(self, plan: PlanLike, control_interval_s: float | None = None) -> bool:
        applied = super().apply_plan(plan, control_interval_s)
        if applied:
            at = time.time_ns()  # first thing after the swap: nothing else is timed
            self._out(orjson.dumps({"version": plan.version, "applied_ns": at}))
        return applied


@click.command(
    context_settings={"help_option_names": ["-h", "--help"]},
    help="(internal) One gateway of `cacheroute bench propagation`: follows the plans topic and "
    "prints a JSON line per applied version.",
)
@click.option("--child", is_flag=True, required=True, help="Run as the benchmark's child.")
@click.option("--gateway", type=int, required=True, help="This gateway's number.")
@click.option("--bootstrap", required=True, help="Kafka bootstrap servers.")
@click.option("--topic-prefix", required=True, help="The run's topic prefix.")
@click.option("--destinations", type=click.IntRange(min=1), required=True)
@click.option("--kafka-config", type=click.Path(dir_okay=False, path_type=Path))
def _child(  # one parameter per option
    *,
    child: bool,
    gateway: int,
    bootstrap: str,
    topic_prefix: str,
    destinations: int,
    kafka_config: Path | None,
) -> None:
    """One gateway: follow the plans topic with a `_TimedDispatcher` until SIGTERM."""
    del child
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    settings = Settings.from_env(
        bootstrap=bootstrap, topic_prefix=topic_prefix, kafka_config=kafka_config
    )
    lock = threading.Lock()

    def out(line: bytes) -> None:
        with lock:
            sys.stdout.buffer.write(line + b"\n")
            sys.stdout.buffer.flush()

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    names = [f"d{i}" for i in range(destinations)]
    dispatcher = _TimedDispatcher(names, out).follow(
        settings, client_id=f"bench-propagation-{gateway}"
    )
    try:
        follower = dispatcher.subscription
        assert isinstance(follower, PlanFollower)
        while not follower.wait_caught_up(timeout=0.5):
            if stop.is_set():
                return
        out(orjson.dumps({"ready": True, "version": dispatcher.version}))
        while not stop.wait(0.5):
            pass
    finally:
        dispatcher.close()


if __name__ == "__main__":
    _child.main(prog_name="python -m cacheroute.benchmarks.propagation")
