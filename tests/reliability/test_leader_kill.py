"""Losing a broker mid-run: the node that leads `plans` and a `requests` partition is SIGKILLed.

The cluster is started the way a user starts it, `cacheroute kafka start --brokers 3 --json` (free
loopback ports, CACHEROUTE_HOME in tmp_path, the nodes stopped by their pids at the end), and laid
out by `cacheroute topics ensure --json`: replication factor 3, `min.insync.replicas=2`. The whole
pipeline runs on it: a gateway thread routes every request with a `Dispatcher` that follows the
plans and reports it with the project's `Emitter`; a `cacheroute streams run` worker turns the
events into rates; a `cacheroute planner run` process turns the rates into plan versions.

In the middle of the run the node leading `plans` (and a `requests` partition, so both the
planner's and the gateway's writes lose their leader) is killed by pid. What the test asserts:

- the gateway routes throughout — every route() returns one of its destinations, admitted keys go
  to their planned targets, nothing falls back to "stale" or "no plan" — and it applies a version
  the planner published while the node was down, then a later one after it came back;
- the planner and streams processes that were started before the kill (the same pids) keep
  working: rates of windows that began after the kill come out of the worker while the node is
  down, the planner folds them into a version it publishes meanwhile;
- no committed plan version is lost: the plan history is 1, 2, ..., n, every version by that one
  planner process;
- every event the emitter got acknowledged is counted exactly once: the counts of the `KeyRate`
  records the streams worker wrote (one record per key and window; a window written twice keeps
  its latest record) sum to the emitter's delivered events, and nothing was dead-lettered;
- `cacheroute doctor` names the under-replicated partitions and the missing broker while it is
  down, and is clean again once it is back.
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from confluent_kafka import Consumer, ElectionType, KafkaError, TopicPartition
from confluent_kafka.admin import AdminClient

from cacheroute.dispatcher.dispatcher import Dispatcher, DispatcherConfig
from cacheroute.dispatcher.emitter.emitter import Emitter
from cacheroute.dispatcher.emitter.partitioner import partition_for
from cacheroute.dispatcher.reader import PlanHistory, read_plan_history
from cacheroute.dispatcher.routing import RouteKind, RoutingTable
from cacheroute.kafkaio import consumer_config, read_partition
from cacheroute.localkafka import resolve_distribution
from cacheroute.localkafka.cluster import LocalCluster
from cacheroute.localkafka.distribution import KafkaDistribution
from cacheroute.localkafka.settings import LocalBrokerSettings
from cacheroute.loopback import free_port, free_port_block, scrape_metrics
from cacheroute.schemas import KeyRate, codec_for
from cacheroute.settings import Settings
from cacheroute.topics import describe_topic_configs, make_admin
from tests.integration.test_planservice_kafka import write_config

REPO = Path(__file__).resolve().parents[2]
PREFIX = "leader."
APP_ID = "leader-streams"
WINDOW_MS = 2_000
NAMES = ["d0", "d1", "d2", "d3"]  # the planner's `destinations = 4`
KEYS = [f"tenant-{i % 5}/conv-{i}" for i in range(40)]
NOT_ON_THE_PLAN = (
    RouteKind.STALE,
    RouteKind.NO_PLAN,
    RouteKind.ALL_DOWN,
    RouteKind.PLAN_DOWN,
    RouteKind.BAD_KEY,
)


@dataclass
class Cluster:
    """The 3-node cluster `kafka start --brokers 3 --json` started, and how to reach it."""

    env: dict[str, str]
    """Environment of every `cacheroute` subprocess (bootstrap = all three nodes)."""
    settings: Settings
    started: dict[str, object]
    """What `kafka start --json` printed."""
    pids: dict[int, int]
    """node id -> pid, as printed."""
    local: LocalCluster
    """The same nodes, by their state folders (pid files): to kill, restart and stop them."""
    distribution: KafkaDistribution


def _cli(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cacheroute", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=timeout,
        check=False,
    )


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    distribution = resolve_distribution(
        LocalBrokerSettings.from_env()
    )  # the cached jars, fetched once
    port = free_port_block(6)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CACHEROUTE_")}
    env.update(
        CACHEROUTE_HOME=str(tmp_path / "home"),
        KAFKA_HOME=str(distribution.libs.parent),
        CACHEROUTE_KAFKA_HEAP="320m",
        CACHEROUTE_BOOTSTRAP=f"127.0.0.1:{port}",
        CACHEROUTE_TOPIC_PREFIX=PREFIX,
        # no compaction of `plans` during the test: every committed version stays readable
        CACHEROUTE_PLANS_SEGMENT_MS="3600000",
        COLUMNS="200",
    )
    local = LocalCluster(
        tmp_path / "home" / "brokers" / f"127.0.0.1-{port}-x3", port=port, brokers=3, heap="320m"
    )
    try:
        proc = _cli(env, "kafka", "start", "--brokers", "3", "--json", timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        started = json.loads(proc.stdout)
        nodes = started["nodes"]
        assert started["brokers"] == 3
        assert [n["node_id"] for n in nodes] == [1, 2, 3]
        assert [n["bootstrap"] for n in nodes] == [f"127.0.0.1:{port + 2 * i}" for i in range(3)]
        assert started["bootstrap"] == ",".join(n["bootstrap"] for n in nodes)
        assert started["pids"] == [n["pid"] for n in nodes]
        assert [n.pid() for n in local.nodes] == [n["pid"] for n in nodes]  # the JVMs run
        env["CACHEROUTE_BOOTSTRAP"] = str(started["bootstrap"])
        yield Cluster(
            env=env,
            settings=Settings.from_env(env),
            started=started,
            pids={int(n["node_id"]): int(n["pid"]) for n in nodes},
            local=local,
            distribution=distribution,
        )
    finally:
        local.stop(timeout=10)  # by the pid files of our nodes only (SIGKILL after 10 s)


# ------------------------------------------------------------------------------------- doctor


def _doctor(env: dict[str, str]) -> tuple[int, dict[str, dict[str, object]]]:
    """doctor's exit code and findings. A doctor killed by a signal is run once more, with a
    warning that carries its stderr: on CI it has died by SIGSEGV inside the Kafka client now and
    then (faulthandler prints where); that crash is an open bug, not what this test checks."""
    proc = _run_doctor(env)
    if proc.returncode < 0:
        warnings.warn(
            f"doctor died by signal {-proc.returncode}; ran it once more. stderr:\n{proc.stderr}",
            stacklevel=2,
        )
        proc = _run_doctor(env)
    assert proc.stdout.strip(), f"doctor printed no report (exit {proc.returncode}):\n{proc.stderr}"
    report = json.loads(proc.stdout)
    return proc.returncode, {f["check"]: f for f in report["findings"]}


def _run_doctor(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return _cli(env, "doctor", "--json", "--timeout", "15", timeout=120)  # faulthandler: on


# ---------------------------------------------------------------------------------- processes


@dataclass
class Service:
    """One `cacheroute` subprocess with its Prometheus endpoint and log."""

    name: str
    proc: subprocess.Popen[bytes]
    metrics_port: int
    log: Path

    def metric(self, name: str) -> float:
        return scrape_metrics(self.metrics_port, (name,)).get(name, 0.0)

    def tail(self, lines: int = 40) -> str:
        text = self.log.read_text(errors="replace").splitlines()[-lines:]
        return f"--- {self.name} (pid {self.proc.pid}) ---\n" + "\n".join(text)

    def assert_alive(self) -> None:
        assert self.proc.poll() is None, f"{self.name} exited:\n{self.tail()}"


@dataclass
class Services:
    items: list[Service] = field(default_factory=list)

    def spawn(self, env: dict[str, str], name: str, args: list[str], log_dir: Path) -> Service:
        port = free_port()
        log = log_dir / f"{name}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "cacheroute", *args, "--metrics-port", str(port)],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=REPO,
                start_new_session=True,
            )
        service = Service(name, proc, port, log)
        self.items.append(service)
        return service

    def stop(self) -> None:
        """SIGTERM each (by its pid), SIGKILL what does not exit."""
        for s in self.items:
            if s.proc.poll() is None:
                s.proc.send_signal(signal.SIGTERM)
        for s in self.items:
            try:
                s.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                s.proc.kill()
                s.proc.wait(timeout=10)

    def tails(self) -> str:
        return "\n".join(s.tail() for s in self.items)


# ---------------------------------------------------------------------------------- the rates


class RatesLog:
    """Every `KeyRate` the streams worker wrote, read from the start of `rates` as it grows."""

    def __init__(self, settings: Settings) -> None:
        self.consumer = Consumer(consumer_config(settings, group_id=f"leader-rates-{os.getpid()}"))
        topic = settings.topics["rates"]
        parts = self.consumer.list_topics(topic, timeout=30).topics[topic].partitions
        self.consumer.assign([TopicPartition(topic, p, 0) for p in parts])
        self.decode = codec_for(KeyRate).decode
        self.latest: dict[tuple[str, int], KeyRate] = {}
        self.written_ms: dict[tuple[str, int], int] = {}
        """(key, window start) -> when the worker first wrote it (the record's CreateTime)."""

    def read(self, seconds: float = 0.5) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            msg = self.consumer.poll(0.1)
            if msg is None:
                continue
            err = msg.error()
            if err is not None:
                assert err.code() == KafkaError._PARTITION_EOF, str(err)
                continue
            rate = self.decode(msg.value())
            where = (rate.key, rate.window_start_ms)
            self.latest[where] = rate  # a window written again carries the same values
            self.written_ms.setdefault(where, msg.timestamp()[1])

    @property
    def total(self) -> int:
        return sum(r.count for r in self.latest.values())

    def close(self) -> None:
        self.consumer.close()


# ----------------------------------------------------------------------------------- the gateway


@dataclass
class Gateway:
    """A gateway thread: route each request with the dispatcher, then report it with the emitter."""

    dispatcher: Dispatcher
    emitter: Emitter
    stop: threading.Event = field(default_factory=threading.Event)
    down: threading.Event = field(default_factory=threading.Event)
    """Set by the test while the victim node is dead."""
    routed: int = 0
    routed_down: int = 0
    versions_down: set[int] = field(default_factory=set)
    """Plan versions that routed requests while the node was down."""
    failures: list[str] = field(default_factory=list)
    thread: threading.Thread | None = None

    def start(self) -> None:
        self.thread = threading.Thread(target=self._run, name="leader-kill-gateway", daemon=True)
        self.thread.start()

    def join(self) -> None:
        self.stop.set()
        assert self.thread is not None
        self.thread.join(timeout=30)
        assert not self.thread.is_alive()

    def _run(self) -> None:
        rng = random.Random(1)
        while not self.stop.is_set():
            key = KEYS[min(int(rng.expovariate(0.15)), len(KEYS) - 1)]
            before = self.dispatcher.table
            try:
                dest = self.dispatcher.route(key)
            except Exception as exc:  # route() must never raise
                self.failures.append(f"route({key!r}) raised {exc!r}")
                continue
            after = self.dispatcher.table
            problem = _route_problem(key, dest, (before, after))
            if problem is not None and len(self.failures) < 20:
                self.failures.append(("[broker down] " if self.down.is_set() else "") + problem)
            self.routed += 1
            if self.down.is_set():
                self.routed_down += 1
                if after is not None:
                    self.versions_down.add(after.version)
            self.emitter.emit(key, prompt_tokens=200, prefix_tokens=150, destination=dest)
            time.sleep(0.004)


def _route_problem(
    key: str, dest: str, tables: tuple[RoutingTable | None, RoutingTable | None]
) -> str | None:
    """Why routing `key` to `dest` was wrong under both tables around the call (None: it was
    right under one: the swap to a newer version may have happened in between)."""
    if dest not in NAMES:
        return f"route({key!r}) returned {dest!r}, not a destination"
    versions = []
    for table in tables:
        if table is None or key not in table:
            return None  # no plan yet, or a cold key: any destination is right
        if dest in {NAMES[i] for i in table.targets(key)}:
            return None
        versions.append(table.version)
    return f"route({key!r}) -> {dest}, not one of its planned targets in v{versions}"


# -------------------------------------------------------------------------------------- helpers


def _wait(
    what: str, ready: Callable[[], object], timeout: float, services: Services, step: float = 0.2
) -> None:
    """Poll `ready()` until true; fail with the services' logs after `timeout` or if one died."""
    deadline = time.monotonic() + timeout
    while not ready():
        for s in services.items:
            s.assert_alive()
        assert time.monotonic() < deadline, f"{what} (after {timeout:.0f}s)\n{services.tails()}"
        time.sleep(step)


def _history(settings: Settings) -> PlanHistory:
    return read_plan_history(settings, timeout=30)


def _replicas(admin: AdminClient, topic: str) -> list[int]:
    meta = admin.list_topics(topic, timeout=30).topics[topic]
    assert meta.error is None, meta.error
    return sorted({len(p.replicas) for p in meta.partitions.values()})


def _led_by(admin: AdminClient, topic: str, node: int) -> list[int]:
    parts = admin.list_topics(topic, timeout=30).topics[topic].partitions
    return sorted(p for p, pm in parts.items() if pm.leader == node)


def _choose_victim(admin: AdminClient, settings: Settings) -> tuple[int, list[int]]:
    """The node leading `plans` and at least one `requests` partition (moved there by a
    preferred-leader election if needed), with those requests partitions."""
    requests = settings.topics["requests"]
    leader = admin.list_topics(timeout=30).topics[settings.topics["plans"]].partitions[0].leader
    led = _led_by(admin, requests, leader)
    if not led:
        parts = admin.list_topics(requests, timeout=30).topics[requests].partitions
        preferred = [
            TopicPartition(requests, p) for p, m in parts.items() if m.replicas[0] == leader
        ]
        assert preferred, f"node {leader} is the preferred leader of no {requests} partition"
        admin.elect_leaders(ElectionType.PREFERRED, preferred).result(timeout=30)
        deadline = time.monotonic() + 30
        while not (led := _led_by(admin, requests, leader)):
            assert time.monotonic() < deadline, "the preferred-leader election moved nothing"
            time.sleep(0.2)
    return leader, led


# ----------------------------------------------------------------------------------------- test


@pytest.mark.timeout(420)
def test_killing_the_leader_of_plans_and_requests_loses_nothing(
    cluster: Cluster, tmp_path: Path
) -> None:
    settings, env = cluster.settings, cluster.env
    assert settings.bootstrap.count(",") == 2
    assert settings.topic_prefix == PREFIX

    # the topics, laid out for 3 nodes by the CLI
    proc = _cli(env, "topics", "ensure", "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    ensured = {t["role"]: t for t in json.loads(proc.stdout)}
    assert set(ensured) == {"requests", "rates", "plans", "dead_letter"}
    admin = make_admin(settings)
    for role, t in ensured.items():
        assert t["topic"] == settings.topics[role]
        assert t["action"] == "created"
        assert t["config"]["min.insync.replicas"] == "2", t
        assert _replicas(admin, t["topic"]) == [3], t["topic"]
        for p in admin.list_topics(t["topic"], timeout=30).topics[t["topic"]].partitions.values():
            assert sorted(p.isrs) == [1, 2, 3]
    code, findings = _doctor(env)
    assert findings["replication"]["status"] == "ok", findings

    services = Services()
    rates = RatesLog(settings)
    config = write_config(tmp_path / "planner.toml")  # 2 s control interval, d0..d3
    # The gateway's staleness limit, in control intervals: a broker failover takes ~10-20 s (the
    # controller fences a silent node after broker.session.timeout.ms, 9 s), during which the
    # planner cannot commit. Deployed, the limit is 3 x 60 s; with the test's 2 s interval, 15
    # intervals keep the same order: a failover is well inside it.
    dispatcher = Dispatcher(
        NAMES, DispatcherConfig(staleness_intervals=15), rng=random.Random(0)
    ).follow(settings)
    emitter = Emitter(settings, "gw-leader")
    gateway = Gateway(dispatcher, emitter)
    victim_node = None
    try:
        worker = services.spawn(
            env,
            "streams",
            [
                *("streams", "run", "--app-id", APP_ID, "--window-ms", str(WINDOW_MS)),
                *("--grace-ms", "500", "--reorder-ms", "200", "--buckets", "8"),
                *("--flush-interval", "0.3", "--commit-interval", "1.0"),
            ],
            tmp_path,
        )
        planner = services.spawn(
            env, "planner", ["planner", "run", "--config", str(config)], tmp_path
        )
        planner_id = f"{socket.gethostname()}:{planner.proc.pid}"  # its default --planner-id
        gateway.start()

        # a plan built from the rates the worker computed from this gateway's events
        def our_plan() -> bool:
            live = _history(settings).live
            return live is not None and bool(set(KEYS) & set(live.plan.keys))

        _wait("no plan from the streamed rates", our_plan, 120, services, step=1.0)
        _wait("the gateway never applied a plan", lambda: dispatcher.version, 30, services)
        counts_at_first_plan = list(dispatcher.router.counts)

        # the streams changelog is replicated like the topics; so are the cluster's own topics
        changelog = f"{APP_ID}-rate-windows-changelog"
        assert _replicas(admin, changelog) == [3], changelog
        assert describe_topic_configs(admin, [changelog])[changelog]["min.insync.replicas"] == "2"
        for internal in ("__consumer_offsets", "__transaction_state"):
            assert _replicas(admin, internal) == [3], internal

        # ---- kill the node leading `plans` and a `requests` partition
        victim, requests_led = _choose_victim(admin, settings)
        # ... partitions the gateway writes events to
        assert {partition_for(k, settings.requests_partitions) for k in KEYS} & set(requests_led)
        victim_node = cluster.local.nodes[victim - 1]
        pid = cluster.pids[victim]
        assert victim_node.node_id == victim
        assert victim_node.pid() == pid
        v_kill = dispatcher.version or 0
        rates.read()
        kill_ms = int(time.time() * 1000)
        os.kill(pid, signal.SIGKILL)  # by pid: the JVM the CLI started, nothing else
        gateway.down.set()
        _wait("the node did not die", lambda: victim_node.pid() is None, 30, services, 0.1)

        # The controller fences the silent node (broker.session.timeout.ms) and moves its
        # leaderships to the survivors; until then no partition is under-replicated. (Nor is
        # doctor run before: while the cluster still lists the dead node as alive, doctor's
        # DescribeConfigs can be sent to it and time out, a doctor bug this test does not cover.)
        def fenced() -> bool:
            meta = admin.list_topics(timeout=30)
            plans = meta.topics[settings.topics["plans"]].partitions[0]
            return victim not in meta.brokers and plans.leader != victim

        _wait("the dead node kept its leaderships", fenced, 60, services, 0.5)

        # doctor names what is degraded: the killed broker's partitions
        deadline = time.monotonic() + 60
        while True:
            code, findings = _doctor(env)
            replication = findings["replication"]
            if replication["status"] == "fail":
                break
            assert time.monotonic() < deadline, findings
            time.sleep(1.0)
        assert code == 1
        message = str(replication["message"])
        assert "under-replicated partition(s)" in message
        assert f"broker {victim}" in message
        assert "writes go on" in message
        detail = replication["detail"]
        assert isinstance(detail, dict)
        under = str(detail["under_replicated"])
        assert f"{settings.topics['plans']}[0]" in under
        assert detail["offline"] == []
        assert detail["below_min_insync"] == []
        assert findings["topic:plans"]["status"] == "ok", findings["topic:plans"]  # no "drift"

        # while it is down: the worker streams windows that began after the kill, and the planner
        # folds them into a version that the gateway applies
        def rates_after_kill() -> bool:
            rates.read(0.3)
            return any(w >= kill_ms for _, w in rates.latest)

        _wait("no rates of a window after the kill", rates_after_kill, 60, services)

        def folded_after_kill() -> bool:
            live = _history(settings).live
            return live is not None and live.header.inputs_until_ms > kill_ms

        _wait("no plan version folded rates of the outage", folded_after_kill, 60, services, 1.0)
        v_down = _history(settings).applied[-1]
        _wait(
            f"the gateway never applied v{v_down}",
            lambda: (dispatcher.version or 0) >= v_down,
            30,
            services,
        )
        assert victim_node.pid() is None  # all of the above happened with the node down
        restart_ms = int(time.time() * 1000)
        gateway.down.clear()
        assert gateway.routed_down > 1000, gateway.routed_down
        assert max(gateway.versions_down) > v_kill  # it picked up a version of the outage

        # the node comes back and catches up; doctor is clean again
        victim_node.start(cluster.distribution, timeout=120)
        deadline = time.monotonic() + 90
        while True:
            code, findings = _doctor(env)
            if findings["replication"]["status"] == "ok":
                break
            assert time.monotonic() < deadline, findings["replication"]
            time.sleep(1.0)
        v_back = dispatcher.version or 0
        _wait(
            "no version after the node came back",
            lambda: (dispatcher.version or 0) > v_back,
            30,
            services,
        )

        # ---- every acknowledged event counted once: stop the requests, let the windows close
        # (the emitter's heartbeats move the worker's watermark on), then sum the counts
        gateway.join()
        assert emitter.flush(30)
        sent = emitter.stats().events_sent

        def all_counted() -> bool:
            rates.read(0.5)
            assert rates.total <= sent, f"{rates.total} counted, {sent} sent: counted twice"
            return rates.total == sent

        _wait(f"the rates never summed to the {sent} events sent", all_counted, 60, services)
        time.sleep(2.0)  # nothing more arrives: no window is counted a second time
        rates.read(1.0)
        assert rates.total == sent
        stats = emitter.stats()
        assert stats.accepted == stats.events_sent == sent
        assert (stats.events_failed, stats.dropped, stats.rejected) == (0, 0, 0), stats
        assert stats.events_sent > 2000, stats
        assert read_partition(settings, settings.topics["dead_letter"]) == []  # none late
        assert worker.metric("cacheroute_streams_events_late_total") == 0
        assert worker.metric("cacheroute_streams_events_dead_lettered_total") == 0

        # the same processes, never restarted, still running
        for s in services.items:
            s.assert_alive()
        assert planner.metric("cacheroute_planner_version") > v_down

        # no committed plan version lost: 1, 2, ..., n, all from the one planner process
        history = _history(settings)
        assert not history.rejected, history.rejected
        assert history.applied == tuple(range(1, len(history.applied) + 1)), history.applied
        assert {v.header.planner_id for v in history.versions.values()} == {planner_id}
        during = [
            v
            for v, live in history.versions.items()
            if kill_ms < live.header.created_ms < restart_ms
        ]
        assert during, "no version was published while the node was down"
        assert history.applied[-1] >= planner.metric("cacheroute_planner_version") > max(during)

        # the gateway routed every request on a plan, before, during and after the outage
        assert not gateway.failures, gateway.failures
        counts = list(dispatcher.router.counts)
        for kind in NOT_ON_THE_PLAN:
            assert counts[kind] == counts_at_first_plan[kind], (
                RouteKind.NAMES[kind],
                counts,
                counts_at_first_plan,
            )
        assert counts[RouteKind.PLAN] > counts_at_first_plan[RouteKind.PLAN]
    finally:
        if gateway.thread is not None and gateway.thread.is_alive():
            gateway.join()
        emitter.close(10)
        dispatcher.close()
        services.stop()
        rates.close()
