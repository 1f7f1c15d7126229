"""Start, stop and inspect one local single-node Kafka broker process.

State lives in one folder per broker (`<home>/brokers/<host>-<port>/`): `server.properties`,
`log4j2.properties`, `data/` (the KRaft log, formatted once), `logs/server.log`, `logs/stdout.log`
and `broker.pid`. `stop` signals only the pid in that file, and only after checking that the pid
is a `kafka.Kafka` JVM running this folder's config — never another process that reused the pid.

A broker started with `secure=True` listens with SASL_SSL + SCRAM and ACLs instead of PLAINTEXT
(see `localkafka.secure`); the folder keeps that mode for its life (its users live in its metadata).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from ipaddress import ip_address
from pathlib import Path

from cacheroute.errors import CacheRouteError
from cacheroute.kafkasecurity import KafkaSecurity
from cacheroute.localkafka.config import render_log4j2, render_server_properties
from cacheroute.localkafka.distribution import KafkaDistribution, find_java
from cacheroute.localkafka.secure import (
    SecureFiles,
    ensure_secrets,
    ensure_tls,
    is_secure_dir,
    role_security,
    scram_arguments,
    secure_server_properties,
    write_credentials,
)

__all__ = ["BrokerStatus", "LocalBroker", "Quorum", "StartResult", "Voter", "broker_answers"]


@dataclass(frozen=True)
class Voter:
    """One KRaft controller of a multi-node local cluster."""

    node_id: int
    host: str
    port: int
    directory_id: str
    """The metadata log directory's id (`--initial-controllers` names it)."""


@dataclass(frozen=True)
class Quorum:
    """The controller quorum every node of a local cluster is formatted with and talks to."""

    cluster_id: str
    voters: tuple[Voter, ...]

    @property
    def bootstrap_servers(self) -> str:
        """`controller.quorum.bootstrap.servers`."""
        return ",".join(f"{v.host}:{v.port}" for v in self.voters)

    @property
    def initial_controllers(self) -> str:
        """`kafka-storage format --initial-controllers`: id@host:port:directory-id, ..."""
        return ",".join(f"{v.node_id}@{v.host}:{v.port}:{v.directory_id}" for v in self.voters)


@dataclass(frozen=True)
class StartResult:
    """What `start` did."""

    bootstrap: str
    pid: int
    already_running: bool
    seconds: float
    credentials: Mapping[str, Path] = field(default_factory=dict)
    """Secure broker: role -> client properties file (empty for a PLAINTEXT broker)."""
    ca_file: Path | None = None
    """Secure broker: the CA certificate clients must trust."""


@dataclass(frozen=True)
class BrokerStatus:
    """What `status` found."""

    bootstrap: str
    running: bool
    pid: int | None
    answering: bool
    state_dir: Path


def broker_answers(
    bootstrap: str, timeout: float = 3.0, *, security: KafkaSecurity | None = None
) -> bool:
    """True when a Kafka broker at `bootstrap` answers a metadata request within `timeout`
    (connecting with `security`, PLAINTEXT when None)."""
    host, _, port = bootstrap.split(",", maxsplit=1)[0].rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=min(timeout, 1.0)):
            pass
    except OSError:
        return False
    from confluent_kafka.admin import AdminClient  # noqa: PLC0415 - keep CLI start-up fast

    extra = security.client_config() if security is not None else {}
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0, **extra})
    try:
        meta = admin.list_topics(timeout=timeout)
    except Exception:  # KafkaException while the broker is still coming up
        return False
    return bool(meta.brokers)


class LocalBroker:
    """One local broker: both KRaft controller and broker, bound to a loopback address."""

    def __init__(
        self,
        state_dir: Path,
        *,
        host: str = "127.0.0.1",
        port: int = 9092,
        controller_port: int | None = None,
        heap: str = "512m",
        secure: bool = False,
        node_id: int = 1,
        quorum: Quorum | None = None,
    ) -> None:
        if not ip_address(_resolve_host(host)).is_loopback:
            raise CacheRouteError(
                f"the local broker only listens on loopback addresses; {host} is not one "
                "(use 127.0.0.1, or point CACHEROUTE_BOOTSTRAP at your own Kafka cluster)"
            )
        self.state_dir = state_dir
        self.host = host
        self.port = port
        self.controller_port = controller_port or port + 1
        self.heap = heap
        self.secure = secure
        """Asked for SASL_SSL + ACLs; a folder created secure stays secure (`is_secure`)."""
        self.node_id = node_id
        self.quorum = quorum
        """None: a single node (`--standalone`); else this node is one voter of `quorum`."""

    @property
    def bootstrap(self) -> str:
        """Address clients connect to."""
        return f"{self.host}:{self.port}"

    @property
    def pid_file(self) -> Path:
        """Pid of the running JVM; absent when stopped."""
        return self.state_dir / "broker.pid"

    @property
    def log_file(self) -> Path:
        """The broker's own log (log4j2)."""
        return self.state_dir / "logs" / "server.log"

    @property
    def stdout_file(self) -> Path:
        """JVM stdout/stderr: start-up failures before logging is up land here."""
        return self.state_dir / "logs" / "stdout.log"

    @property
    def is_secure(self) -> bool:
        """Whether this broker's folder holds a secure (SASL_SSL + ACLs) broker."""
        return is_secure_dir(self.state_dir)

    @property
    def secure_files(self) -> SecureFiles:
        """Secrets, certificates and per-role client files of the secure broker."""
        return SecureFiles(self.state_dir)

    def client_security(self, role: str = "admin") -> KafkaSecurity | None:
        """How `role` connects to this broker: None for a PLAINTEXT broker."""
        if not self.is_secure:
            return None
        return role_security(self.secure_files, role, ensure_secrets(self.secure_files))

    @property
    def _props(self) -> Path:
        return self.state_dir / "server.properties"

    @property
    def _data(self) -> Path:
        return self.state_dir / "data"

    # ----------------------------------------------------------------------------------- status
    def pid(self) -> int | None:
        """Pid of our broker if it is alive and really ours, else None (stale pid files removed)."""
        try:
            pid = int(self.pid_file.read_text().strip())
        except (OSError, ValueError):
            return None
        if _is_our_kafka(pid, self._props):
            return pid
        with contextlib.suppress(OSError):
            self.pid_file.unlink()
        return None

    def status(self, security: KafkaSecurity | None = None) -> BrokerStatus:
        """Whether our process runs and whether a broker answers at the address (asked with
        `security`, else as this folder's admin when it is a secure broker, else PLAINTEXT)."""
        pid = self.pid()
        return BrokerStatus(
            bootstrap=self.bootstrap,
            running=pid is not None,
            pid=pid,
            answering=broker_answers(
                self.bootstrap, timeout=2.0, security=security or self.client_security()
            ),
            state_dir=self.state_dir,
        )

    # ------------------------------------------------------------------------------------ start
    def start(
        self, distribution: KafkaDistribution, *, timeout: float = 90.0, wait: bool = True
    ) -> StartResult:
        """Start the broker unless ours already runs; return once it answers metadata requests
        (`wait=False`: right after launching it — a cluster node cannot answer before a majority
        of its quorum runs, so `LocalCluster` launches all, then waits, `wait_ready`)."""
        began = time.monotonic()
        self._check_mode()
        pid = self.pid()
        if pid is not None:
            if wait:
                self._wait_ready(pid, began + timeout)
            return self._result(pid, True, began)
        for p in (self.port, self.controller_port):
            if _port_taken(self.host, p):
                raise CacheRouteError(
                    f"{self.host}:{p} is already in use by another process, not a broker started "
                    f"from {self.state_dir}. Stop it, or pick another address, e.g. "
                    "CACHEROUTE_BOOTSTRAP=127.0.0.1:19092"
                )
        java = find_java()
        (self.state_dir / "logs").mkdir(parents=True, exist_ok=True)
        overrides: dict[str, str] = {}
        scram: list[str] = []
        if self.secure:
            files = self.secure_files
            secret_map = ensure_secrets(files)
            ensure_tls(files, java, secret_map, (self.host,))
            overrides = secure_server_properties(
                files,
                secret_map,
                host=self.host,
                port=self.port,
                controller_port=self.controller_port,
            )
            scram = scram_arguments(secret_map)
        if self.quorum is not None:
            overrides = {**self._cluster_properties(self.quorum), **overrides}
        text = render_server_properties(
            host=self.host,
            port=self.port,
            controller_port=self.controller_port,
            data_dir=self._data.resolve(),
            node_id=self.node_id,
            overrides=overrides,
        )
        # 0600 before writing: a secure broker's config holds its passwords
        fd = os.open(self._props, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        log4j = self.state_dir / "log4j2.properties"
        log4j.write_text(render_log4j2(self.log_file.resolve()))
        jvm_log = f"-Dlog4j2.configurationFile={log4j.resolve()}"
        if not (self._data / "meta.properties").exists():
            self._format(java, distribution, jvm_log, scram)
        argv = [
            str(java),
            f"-Xmx{self.heap}",
            f"-Xms{self.heap}",
            "-XX:+UseG1GC",
            "-Djava.awt.headless=true",
            jvm_log,
            "-cp",
            distribution.classpath,
            "kafka.Kafka",
            str(self._props.resolve()),
        ]
        with self.stdout_file.open("ab") as out:
            # posix_spawn with setsid: the JVM outlives this CLI process in its own session, and no
            # Popen object is left behind to warn about a child that is still running.
            pid = os.posix_spawn(
                argv[0],
                argv,
                dict(os.environ),
                file_actions=[
                    (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                    (os.POSIX_SPAWN_DUP2, out.fileno(), 1),
                    (os.POSIX_SPAWN_DUP2, out.fileno(), 2),
                ],
                setsid=True,
            )
        self.pid_file.write_text(f"{pid}\n")
        if wait:
            self._wait_ready(pid, began + timeout)
        return self._result(pid, False, began)

    def wait_ready(self, timeout: float = 90.0) -> None:
        """Block until the running broker answers (after `start(wait=False)`)."""
        pid = self.pid()
        if pid is None:
            raise CacheRouteError(
                f"the broker of {self.state_dir} is not running. Last log lines:\n{self.tail(20)}"
            )
        self._wait_ready(pid, time.monotonic() + timeout)

    def _cluster_properties(self, quorum: Quorum) -> dict[str, str]:
        """A node of an N-node cluster: the shared quorum, internal topics replicated like ours."""
        n = len(quorum.voters)
        rf, isr = str(min(3, n)), str(2 if n >= 3 else 1)
        return {
            "controller.quorum.bootstrap.servers": quorum.bootstrap_servers,
            "default.replication.factor": rf,
            "offsets.topic.replication.factor": rf,
            "transaction.state.log.replication.factor": rf,
            "transaction.state.log.min.isr": isr,
            "share.coordinator.state.topic.replication.factor": rf,
            "share.coordinator.state.topic.min.isr": isr,
            # a killed node's partitions move to the survivors fast (tests, local failover drills)
            "replica.lag.time.max.ms": "10000",
        }

    def _check_mode(self) -> None:
        """A folder keeps the mode it was formatted with: its SCRAM users and ACLs live in its
        metadata log, so switching would leave a broker nobody (or everybody) can use."""
        formatted = (self._data / "meta.properties").exists()
        if self.is_secure and not self.secure:
            raise CacheRouteError(
                f"the broker in {self.state_dir} was created with --secure; start it with "
                "`cacheroute kafka start --secure`, or use another address (--bootstrap) for a "
                "PLAINTEXT broker"
            )
        if self.secure and formatted and not self.is_secure:
            raise CacheRouteError(
                f"the broker in {self.state_dir} was created without --secure (PLAINTEXT). Use "
                "another address for the secure one (e.g. --bootstrap 127.0.0.1:19092), or stop "
                f"it and delete {self.state_dir} (its topics are lost)"
            )

    def _result(self, pid: int, already_running: bool, began: float) -> StartResult:
        if not self.is_secure:
            return StartResult(self.bootstrap, pid, already_running, time.monotonic() - began)
        files = self.secure_files
        credentials = write_credentials(files, self.bootstrap, ensure_secrets(files))
        return StartResult(
            self.bootstrap,
            pid,
            already_running,
            time.monotonic() - began,
            credentials=credentials,
            ca_file=files.ca_pem.resolve(),
        )

    def _format(
        self, java: Path, distribution: KafkaDistribution, jvm_log: str, scram: list[str]
    ) -> None:
        if self.quorum is None:
            cluster_id, quorum_args = kraft_uuid(), ["--standalone"]
        else:
            cluster_id = self.quorum.cluster_id
            quorum_args = ["--initial-controllers", self.quorum.initial_controllers]
        proc = subprocess.run(
            [
                str(java),
                jvm_log,
                "-cp",
                distribution.classpath,
                "kafka.tools.StorageTool",
                "format",
                "-t",
                cluster_id,
                "-c",
                str(self._props.resolve()),
                *quorum_args,
                *scram,
            ],
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
        )
        if proc.returncode != 0:
            tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-10:])
            raise CacheRouteError(f"formatting the KRaft log dir {self._data} failed:\n{tail}")

    def _wait_ready(self, pid: int, deadline: float) -> None:
        while time.monotonic() < deadline:
            if not _alive(pid):
                self.pid_file.unlink(missing_ok=True)
                raise CacheRouteError(
                    f"the broker exited during start-up. Last lines of {self.stdout_file} and "
                    f"{self.log_file}:\n{self.tail(20)}"
                )
            if broker_answers(self.bootstrap, timeout=2.0, security=self.client_security()):
                return
            time.sleep(0.25)
        raise CacheRouteError(
            f"the broker (pid {pid}) did not answer at {self.bootstrap} in time; it is left "
            f"running — see `cacheroute kafka logs` ({self.log_file})",
            retriable=True,
        )

    # ------------------------------------------------------------------------------------- stop
    def stop(self, *, timeout: float = 60.0) -> int | None:
        """Stop our broker (SIGTERM, then SIGKILL after `timeout`); return its pid, or None."""
        pid = self.pid()
        if pid is None:
            return None
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
            while _alive(pid):
                time.sleep(0.1)
        self.pid_file.unlink(missing_ok=True)
        return pid

    # ------------------------------------------------------------------------------------- logs
    def tail(self, lines: int = 50) -> str:
        """The last `lines` lines of the JVM output and the broker log."""
        parts = []
        for path in (self.stdout_file, self.log_file):
            if path.exists():
                text = path.read_text(errors="replace").splitlines()[-lines:]
                if text:
                    parts.append(f"==> {path} <==\n" + "\n".join(text))
        return "\n".join(parts) or "(no log output yet)"


def _resolve_host(host: str) -> str:
    try:
        return socket.gethostbyname(host)
    except OSError:
        return host


def kraft_uuid() -> str:
    """A random KRaft cluster id: 16 random bytes, URL-safe base64 without padding (22 chars).

    Never one that starts with "-" (1 in 64 would): `kafka-storage format -t -xyz...` reads it as
    an option and fails with "expected one argument" (Kafka's own Uuid.randomUuid skips them too).
    """
    import base64  # noqa: PLC0415 - only needed once per data dir

    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode("ascii").rstrip("=")
        if not text.startswith("-"):
            return text


def _port_taken(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def _alive(pid: int) -> bool:
    """True while `pid` runs; reaps it if it is our exited child (so it does not linger as zombie)."""
    with contextlib.suppress(ChildProcessError):
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[0] != "Z"


def _is_our_kafka(pid: int, props: Path) -> bool:
    if not _alive(pid):
        return False
    args = _cmdline(pid)
    return "kafka.Kafka" in args and str(props.resolve()) in args


def _cmdline(pid: int) -> list[str]:
    """Arguments of a process: /proc on Linux, `ps` elsewhere (macOS)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
        return [a.decode(errors="replace") for a in raw.split(b"\0") if a]
    except OSError:
        pass
    try:
        out = subprocess.run(
            ["ps", "-o", "command=", "-p", str(pid)],
            capture_output=True,
            text=True,
            check=False,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    return out.stdout.split()
