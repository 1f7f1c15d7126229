"""CacheRoute on a secured broker: SASL_SSL + SCRAM, ACLs, one least-privilege principal per role.

One secure broker per session, started the way an operator would (`cacheroute kafka start --secure
--json`, on free loopback ports, state in a temp dir) and stopped by its pid at the end. It never
touches the PLAINTEXT broker the other tests use. What is checked, on the real broker:
- the gateway principal may not write `plans` (authorization error, plain and transactional); the
  planner principal may, and the gateway reads what it wrote;
- a wrong password is one line naming the cause, quickly, for `topics list`, `doctor` and the
  services (`planner run`, `gateway`, `streams run`); doctor tells authentication and
  authorization problems apart from a missing broker or topic;
- the whole pipeline runs with each process holding only its own credentials (gateway emitter and
  dispatcher, streams worker, planner), and a dispatcher refused by an ACL keeps its last plan and
  says why;
- no generated password appears in any output or log of all this, the broker's own included.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import signal
import stat
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    ResourcePatternType,
    ResourceType,
)

from cacheroute.dispatcher.dispatcher import Dispatcher
from cacheroute.dispatcher.emitter.emitter import Emitter
from cacheroute.dispatcher.reader import read_plan_history
from cacheroute.errors import CacheRouteError
from cacheroute.kafkaio import producer_config
from cacheroute.kafkasecurity import ENV_VARS
from cacheroute.localkafka import LocalBroker, resolve_distribution
from cacheroute.localkafka.settings import LocalBrokerSettings
from cacheroute.loopback import free_port, free_port_block, scrape_metrics
from cacheroute.planservice.publisher import PlanPublisher
from cacheroute.settings import Settings
from cacheroute.topics import ensure_topics, make_admin
from tests.integration.planservice_support import make_plan, started_publisher

pytestmark = pytest.mark.kafka

REPO = Path(__file__).resolve().parents[2]
ROLES = ("gateway", "streams", "planner", "admin")


_CONNECTION_VARS = {*ENV_VARS.values(), "CACHEROUTE_KAFKA_CONFIG", "CACHEROUTE_BOOTSTRAP"}


def _clean_env() -> dict[str, str]:
    """This process's environment without any CacheRoute Kafka connection settings."""
    return {k: v for k, v in os.environ.items() if k not in _CONNECTION_VARS} | {"COLUMNS": "200"}


@dataclass
class SecureCluster:
    """The session's secure broker and what its roles need to reach it."""

    bootstrap: str
    home: Path
    prefix: str
    app_id: str
    credentials: dict[str, Path]
    start_output: str
    secrets: list[str]
    broker: LocalBroker

    def settings(self, role: str) -> Settings:
        """Settings of `role`: its credentials file (bootstrap included) and the test prefix."""
        return Settings.from_env(
            {}, kafka_config=self.credentials[role], topic_prefix=self.prefix, home=self.home
        )

    def env(self, role: str | None) -> dict[str, str]:
        """A child process environment that connects as `role` (None: no credentials)."""
        env = _clean_env() | {
            "CACHEROUTE_BOOTSTRAP": self.bootstrap,
            "CACHEROUTE_TOPIC_PREFIX": self.prefix,
            "CACHEROUTE_HOME": str(self.home),
        }
        if role is not None:
            env["CACHEROUTE_KAFKA_CONFIG"] = str(self.credentials[role])
        return env

    def cli(
        self, role: str | None, *args: str, kafka_config: Path | None = None, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        """Run `cacheroute ARGS` as `role` (or with an explicit --kafka-config file)."""
        flags = ["--kafka-config", str(kafka_config)] if kafka_config else []
        return subprocess.run(
            [sys.executable, "-m", "cacheroute", *flags, *args],
            capture_output=True,
            text=True,
            env=self.env(role),
            cwd=REPO,
            timeout=timeout,
            check=False,
        )

    def assert_no_secrets(self, *texts: str) -> None:
        for text in texts:
            for secret in self.secrets:
                assert secret not in text, "a password leaked into an output"


@pytest.fixture(scope="session")
def secure_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureCluster]:
    local = LocalBrokerSettings.from_env(_clean_env())
    dist = resolve_distribution(local)  # the jar cache (fetched once, as for the main broker)
    home = tmp_path_factory.mktemp("secure-home")
    if local.kafka_home is None:
        (home / "kafka").symlink_to(dist.libs.parent.parent, target_is_directory=True)
    port = free_port_block(2)
    bootstrap = f"127.0.0.1:{port}"
    prefix = f"sec-{uuid.uuid4().hex[:8]}."
    app_id = f"{prefix}streams"
    broker = LocalBroker(home / "brokers" / f"127.0.0.1-{port}", port=port)
    env = _clean_env() | {"CACHEROUTE_KAFKA_HEAP": "384m"}
    try:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "cacheroute",
                "--home",
                str(home),
                "--bootstrap",
                bootstrap,
                "--topic-prefix",
                prefix,
                "kafka",
                "start",
                "--secure",
                "--json",
                "--timeout",
                "150",
                "--streams-app-id",
                app_id,
            ],
            capture_output=True,
            text=True,
            env=env,
            cwd=REPO,
            timeout=240,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr[-3000:] + broker.tail(40)
        started = json.loads(proc.stdout)
        secrets = json.loads(broker.secure_files.secrets_file.read_text())
        cluster = SecureCluster(
            bootstrap=bootstrap,
            home=home,
            prefix=prefix,
            app_id=app_id,
            credentials={r: Path(p) for r, p in started["credentials"].items()},
            start_output=proc.stdout + proc.stderr,
            secrets=sorted(secrets.values()),
            broker=broker,
        )
        ensure_topics(cluster.settings("admin"))
        yield cluster
    finally:
        broker.stop(timeout=30)


# ----------------------------------------------------------------------------------- start
def test_secure_start_reports_role_credentials(secure_cluster: SecureCluster) -> None:
    started = json.loads(secure_cluster.start_output.splitlines()[0])
    assert started["bootstrap"] == secure_cluster.bootstrap
    assert started["security_protocol"] == "SASL_SSL"
    assert set(started["credentials"]) == set(ROLES)
    assert started["acls"] > 40
    assert Path(started["ca_file"]).read_text().startswith("-----BEGIN CERTIFICATE-----")
    for role, path in secure_cluster.credentials.items():
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert secure_cluster.settings(role).kafka_security.principal == f"User:{role}"
    secure_cluster.assert_no_secrets(secure_cluster.start_output)
    # idempotent: a second start finds it running, rewrites the files, re-applies the ACLs
    again = secure_cluster.cli(
        None,
        "--home",
        str(secure_cluster.home),
        "--bootstrap",
        secure_cluster.bootstrap,
        "kafka",
        "start",
        "--secure",
        "--json",
        "--streams-app-id",
        secure_cluster.app_id,
    )
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["already_running"] is True
    secure_cluster.assert_no_secrets(again.stdout, again.stderr)
    # and a PLAINTEXT start of the same folder is refused, not silently different
    plain = secure_cluster.cli(
        None, "--home", str(secure_cluster.home), "--bootstrap", secure_cluster.bootstrap,
        "kafka", "start",
    )  # fmt: skip
    assert plain.returncode == 1
    assert "was created with --secure" in plain.stderr


# ------------------------------------------------------------------------ authorization
def _produce_error(settings: Settings, topic: str) -> KafkaError | None:
    producer = Producer(producer_config(settings, **{"message.timeout.ms": 10_000}))
    errors: list[KafkaError | None] = []
    producer.produce(topic, b"x", key=b"probe", on_delivery=lambda err, _msg: errors.append(err))
    assert producer.flush(20) == 0
    return errors[0]


def test_gateway_may_not_write_plans_the_planner_may(secure_cluster: SecureCluster) -> None:
    gateway = secure_cluster.settings("gateway")
    planner = secure_cluster.settings("planner")
    plans = gateway.topics["plans"]
    err = _produce_error(gateway, plans)
    assert err is not None
    assert err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    # ... nor may it pose as the planner's transactional publisher
    impostor = PlanPublisher(gateway, transactional_id=f"{secure_cluster.prefix}cacheroute-planner")
    try:
        with pytest.raises(CacheRouteError, match="TRANSACTIONAL_ID_AUTHORIZATION_FAILED"):
            impostor.start(timeout=20)
    finally:
        # close() re-raises the producer's fatal error (PlanPublisher's behaviour, not ours)
        with contextlib.suppress(KafkaException):
            impostor.close()
    # its own topic it may write
    assert _produce_error(gateway, gateway.topics["requests"]) is None

    before = read_plan_history(secure_cluster.settings("admin")).live
    version = (before.version if before else 0) + 1
    plan = make_plan(60, version=version, created_ms=int(time.time() * 1000))
    with started_publisher(planner, f"{secure_cluster.prefix}cacheroute-planner") as publisher:
        publisher.publish(plan)
    live = read_plan_history(gateway).live  # the gateway reads what the planner wrote
    assert live is not None
    assert live.version == version
    assert live.plan.keys == plan.keys


# ------------------------------------------------------------------- one-line CLI errors
def test_wrong_password_is_one_line_naming_the_cause(
    secure_cluster: SecureCluster, tmp_path: Path
) -> None:
    good = secure_cluster.credentials["gateway"].read_text()
    wrong = "not-the-password-4711"
    bad = tmp_path / "bad.properties"
    bad.write_text(
        "\n".join(
            line.split(' password="')[0] + f' password="{wrong}";'
            if line.startswith("sasl.jaas.config=")
            else line
            for line in good.splitlines()
        )
        + "\n"
    )
    began = time.monotonic()
    listed = secure_cluster.cli(None, "topics", "list", kafka_config=bad)
    took = time.monotonic() - began
    assert listed.returncode == 1
    assert listed.stdout == ""
    lines = listed.stderr.strip().splitlines()
    assert len(lines) == 1, listed.stderr
    assert lines[0].startswith(
        f"error: Kafka authentication failed as User:gateway (SCRAM-SHA-512) at "
        f"{secure_cluster.bootstrap}: SASL authentication error: Authentication failed during "
        "authentication due to invalid credentials with SASL mechanism SCRAM-SHA-512. Check the "
        "username and password"
    )
    assert str(bad) in lines[0]  # where the settings came from
    assert took < 12, f"a refused login took {took:.1f}s: it must not look like a hang"

    # a service refuses to start, at once, instead of retrying a login that cannot succeed
    began = time.monotonic()
    planner = secure_cluster.cli(
        None,
        "planner",
        "run",
        "--destinations",
        "4",
        "--q-cap",
        "6",
        "--warm-slots",
        "40",
        kafka_config=bad,
    )
    assert planner.returncode == 1
    assert time.monotonic() - began < 20
    assert (
        planner.stderr.strip()
        .splitlines()[-1]
        .startswith("error: Kafka authentication failed as User:gateway (SCRAM-SHA-512)")
    )

    # ... and so do the gateway (whose plan follower would otherwise blame a missing broker
    # after ~10 s) and the streams worker: one line, nothing else, before any port is opened
    refused_starts = {
        "gateway": ["gateway", "--backend", "d0=http://127.0.0.1:9", "--port", str(free_port())],
        "streams run": ["streams", "run", "--app-id", f"{secure_cluster.prefix}refused"],
    }
    services: list[subprocess.CompletedProcess[str]] = []
    for name, argv in refused_starts.items():
        began = time.monotonic()
        service = secure_cluster.cli(None, *argv, kafka_config=bad)
        took = time.monotonic() - began
        services.append(service)
        assert service.returncode == 1, (name, service.stderr)
        assert service.stdout == "", name
        assert service.stderr.count("\n") == 1, (name, service.stderr)  # one line, no traceback
        assert service.stderr.startswith(
            f"error: Kafka authentication failed as User:gateway (SCRAM-SHA-512) at "
            f"{secure_cluster.bootstrap}: SASL authentication error: Authentication failed "
            "during authentication due to invalid credentials with SASL mechanism "
            "SCRAM-SHA-512. Check the username and password"
        ), (name, service.stderr)
        assert str(bad) in service.stderr, name
        assert took < 15, f"{name}: a refused login took {took:.1f}s"

    doctor = secure_cluster.cli(None, "doctor", "--json", kafka_config=bad)
    assert doctor.returncode == 1, doctor.stderr
    report = json.loads(doctor.stdout)
    assert report["broker_reachable"] is True
    assert [f["check"] for f in report["findings"]] == ["kafka-authentication"]
    assert "Traceback" not in doctor.stderr + listed.stderr
    outputs = [listed.stdout, listed.stderr, doctor.stdout, doctor.stderr, planner.stderr]
    outputs += [svc.stdout + svc.stderr for svc in services]
    for text in outputs:
        assert wrong not in text
    secure_cluster.assert_no_secrets(*outputs)


def test_cli_and_doctor_name_authorization_problems(secure_cluster: SecureCluster) -> None:
    denied = secure_cluster.cli("gateway", "topics", "ensure")
    assert denied.returncode == 1
    line = denied.stderr.strip()
    assert "\n" not in line
    assert line.startswith(
        f"error: Kafka refused creating {secure_cluster.prefix}rates as User:gateway "
        f"(SCRAM-SHA-512) at {secure_cluster.bootstrap}: "
    )
    listed = secure_cluster.cli("gateway", "topics", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    seen = {t["topic"] for t in json.loads(listed.stdout)}
    assert seen == {f"{secure_cluster.prefix}requests", f"{secure_cluster.prefix}plans"}

    as_gateway = secure_cluster.cli("gateway", "doctor", "--json", "--timeout", "5")
    assert as_gateway.returncode == 1, as_gateway.stderr
    findings = {f["check"]: f for f in json.loads(as_gateway.stdout)["findings"]}
    assert findings["kafka-authorization"]["status"] == "fail"
    assert findings["kafka-authorization"]["detail"]["principal"] == "User:gateway"
    assert findings["topic:rates"]["message"].startswith(
        f"not authorized to describe topic {secure_cluster.prefix}rates as User:gateway"
    )
    assert findings["topic:plans"]["status"] == "warn"  # visible, configs not readable

    as_admin = secure_cluster.cli("admin", "doctor", "--json", "--timeout", "5")
    report = json.loads(as_admin.stdout)
    checks = {f["check"]: f for f in report["findings"]}
    assert not [c for c in checks if c.startswith("kafka-")], report
    assert checks["topic:rates"]["status"] == "ok"
    assert checks["broker"]["detail"]["security"] == {
        "protocol": "SASL_SSL",
        "source": str(secure_cluster.credentials["admin"]),
        "sasl_mechanism": "SCRAM-SHA-512",
        "username": "admin",
        "password": "********",
        "ssl_ca_file": str(secure_cluster.broker.secure_files.ca_pem.resolve()),
        "ssl_cert_file": None,
        "ssl_check_hostname": True,
    }
    acls = secure_cluster.cli("admin", "topics", "ensure", "--print-acls", "--json")
    assert acls.returncode == 0, acls.stderr
    assert (
        f"--allow-principal User:planner --operation Write --operation Describe "
        f"--transactional-id {secure_cluster.prefix}cacheroute-planner"
    ) in acls.stderr
    secure_cluster.assert_no_secrets(
        denied.stderr,
        listed.stdout,
        as_gateway.stdout,
        as_gateway.stderr,
        as_admin.stdout,
        as_admin.stderr,
        acls.stdout,
        acls.stderr,
    )


# ------------------------------------------------------------------------------- pipeline
def _spawn(
    cluster: SecureCluster, role: str, argv: Sequence[str], log: Path
) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "cacheroute", *argv],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=cluster.env(role),
            cwd=REPO,
            start_new_session=True,
        )


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


_AclArgs = tuple[ResourceType, str, ResourcePatternType, str, str, AclOperation, AclPermissionType]


def _plans_read_acl(cluster: SecureCluster) -> _AclArgs:
    """The gateway's READ on plans, as AclBinding / AclBindingFilter arguments."""
    return (
        ResourceType.TOPIC,
        f"{cluster.prefix}plans",
        ResourcePatternType.LITERAL,
        "User:gateway",
        "*",
        AclOperation.READ,
        AclPermissionType.ALLOW,
    )


@pytest.mark.timeout(240)
def test_pipeline_runs_with_one_principal_per_process(
    secure_cluster: SecureCluster, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    gateway = secure_cluster.settings("gateway")
    admin = secure_cluster.settings("admin")
    before = read_plan_history(admin).live
    start_version = before.version if before else 0
    config = tmp_path / "planner.toml"
    config.write_text(
        "destinations = 4\nq_cap = 6.0\nwarm_slots = 40\ninterval_s = 2.0\nsettle_s = 0.5\n"
        "max_wait_s = 5.0\nrates_lookback_s = 600.0\n"
    )
    metrics = free_port()
    worker = _spawn(
        secure_cluster,
        "streams",
        [
            "streams",
            "run",
            "--app-id",
            secure_cluster.app_id,
            "--window-ms",
            "2000",
            "--grace-ms",
            "500",
            "--reorder-ms",
            "200",
            "--flush-interval",
            "0.3",
            "--metrics-port",
            str(metrics),
        ],
        tmp_path / "streams.log",
    )
    planner = _spawn(
        secure_cluster,
        "planner",
        ["planner", "run", "--config", str(config), "--planner-id", "secure-A"],
        tmp_path / "planner.log",
    )
    stop = threading.Event()
    names = ["d0", "d1", "d2", "d3"]
    keys = [f"tenant-{i % 5}/conv-{i}" for i in range(40)]
    dispatcher = Dispatcher(names, rng=random.Random(0)).follow(gateway)

    def emit() -> None:
        with Emitter(gateway, gateway_id="gw-secure") as emitter:
            rng = random.Random(1)
            while not stop.is_set():
                key = keys[min(int(rng.expovariate(0.15)), len(keys) - 1)]
                emitter.emit(key, prompt_tokens=200, prefix_tokens=150, destination="d0")
                time.sleep(0.002)

    emitter = threading.Thread(target=emit, daemon=True)
    emitter.start()
    logs = ""
    try:
        # a plan built from the rates the streams worker computed from this gateway's events
        deadline = time.monotonic() + 150
        ours: int | None = None
        while ours is None:
            for proc, name in ((worker, "streams"), (planner, "planner")):
                assert proc.poll() is None, (tmp_path / f"{name}.log").read_text()[-4000:]
            assert time.monotonic() < deadline, (
                "no plan from the streamed rates:\n"
                + (tmp_path / "streams.log").read_text()[-3000:]
                + (tmp_path / "planner.log").read_text()[-3000:]
            )
            time.sleep(1.0)
            live = read_plan_history(gateway, keep=lambda _v: False).live
            if (
                live is not None
                and live.version > start_version
                and set(keys) & set(live.plan.keys)
            ):
                ours = live.version
        streamed = scrape_metrics(metrics, ("cacheroute_streams_rates_emitted_total",))
        assert streamed.get("cacheroute_streams_rates_emitted_total", 0) > 0
        while (dispatcher.version or 0) < ours:
            assert time.monotonic() < deadline, "the gateway's dispatcher never applied it"
            time.sleep(0.1)
        applied = dispatcher.version
        assert applied is not None
        for key in keys:
            with dispatcher.request(key) as dest:
                assert dest in names

        # The gateway loses READ on plans: it keeps its last plan and says why.
        acl_admin = make_admin(admin)
        flt = AclBindingFilter(*_plans_read_acl(secure_cluster))
        for fut in acl_admin.delete_acls([flt]).values():
            assert fut.result(timeout=30)
        deadline = time.monotonic() + 60
        while "Kafka refused reading" not in caplog.text:
            assert time.monotonic() < deadline, "the follower never reported the refusal"
            time.sleep(0.2)
        assert dispatcher.version is not None
        assert dispatcher.version >= applied  # never dropped
        for key in keys:
            assert dispatcher.route(key) in names
        refusal = next(r for r in caplog.records if "Kafka refused reading" in r.getMessage())
        assert refusal.levelno == logging.WARNING
        assert "lacks READ on the topic" in refusal.getMessage()
        assert "Routing stays on plan v" in refusal.getMessage()
    finally:
        stop.set()
        emitter.join(timeout=20)
        dispatcher.close()
        restore = AclBinding(*_plans_read_acl(secure_cluster))
        acl_admin = make_admin(admin)  # held: a collected client cancels its futures
        for fut in acl_admin.create_acls([restore]).values():
            fut.result(timeout=30)
        _stop(planner)
        _stop(worker)
        logs = (tmp_path / "streams.log").read_text() + (tmp_path / "planner.log").read_text()
    assert "AUTHORIZATION_FAILED" not in logs, logs[-4000:]  # each had exactly what it needs
    broker_logs = _broker_logs(secure_cluster.broker)
    assert secure_cluster.broker.log_file.name in broker_logs  # server.log (and rotated parts)
    assert secure_cluster.broker.stdout_file.name in broker_logs  # the JVM's stdout/stderr
    # the broker logs its SCRAM users and their ACLs by name (the passwords: never, checked next)
    server_log = broker_logs[secure_cluster.broker.log_file.name]
    assert "UserScramCredentialRecord creating new entry for planner" in server_log
    assert "principal=User:planner" in server_log
    secure_cluster.assert_no_secrets(logs, caplog.text, *broker_logs.values())


def _broker_logs(broker: LocalBroker) -> dict[str, str]:
    """File name -> text of every log the broker wrote: server.log and its rotated parts, and
    the JVM's stdout/stderr (where anything printed before logging is up lands)."""
    folder = broker.log_file.parent
    return {
        path.name: path.read_text(errors="replace")
        for path in sorted(folder.iterdir())
        if path.is_file()
    }
