"""`cacheroute kafka start|stop|status|logs`: the local single-node Apache Kafka broker."""

from __future__ import annotations

import sys
import time

import click
import orjson
from rich.console import Console

from cacheroute.cli.options import json_option
from cacheroute.errors import CacheRouteError
from cacheroute.kafkaacls import apply_acls, deployment_acls
from cacheroute.localkafka import LocalBroker, resolve_distribution
from cacheroute.localkafka.cluster import LocalCluster
from cacheroute.localkafka.settings import LocalBrokerSettings
from cacheroute.settings import Settings

__all__ = ["broker_for", "cluster_for", "kafka", "local_for"]


def local_for(settings: Settings, **overrides: str | None) -> LocalBrokerSettings:
    """The local broker's own settings (environment, then flags), state under `settings.home`."""
    return LocalBrokerSettings.from_env(home=settings.home, **overrides)


def broker_for(settings: Settings, *, secure: bool = False) -> LocalBroker:
    """The local broker that serves `settings.bootstrap`, with its state under `settings.home`."""
    host, port = settings.host_port
    return LocalBroker(
        settings.home / "brokers" / f"{host}-{port}",
        host=host,
        port=port,
        heap=local_for(settings).kafka_heap,
        secure=secure,
    )


def cluster_for(settings: Settings, brokers: int) -> LocalCluster:
    """The local `brokers`-node cluster whose first node serves `settings.bootstrap`."""
    host, port = settings.host_port
    return LocalCluster(
        settings.home / "brokers" / f"{host}-{port}-x{brokers}",
        host=host,
        port=port,
        brokers=brokers,
        heap=local_for(settings).kafka_heap,
    )


def _clusters(settings: Settings) -> list[LocalCluster]:
    """The local clusters ever started at this address (their folders exist)."""
    host, port = settings.host_port
    out = []
    for folder in sorted((settings.home / "brokers").glob(f"{host}-{port}-x*")):
        size = folder.name.rpartition("-x")[2]
        if size.isdigit() and (folder / "cluster.json").exists():
            out.append(cluster_for(settings, int(size)))
    return out


@click.group()
def kafka() -> None:
    """Run a real local Apache Kafka broker (KRaft, 127.0.0.1 only): one node, or a cluster with
    --brokers N; PLAINTEXT, or SASL_SSL with ACLs and per-role credentials with --secure.

    The jars come from KAFKA_HOME when set, else from the cache, else from Maven Central (or the
    Apache release tarball with CACHEROUTE_KAFKA_SOURCE=tarball). Data and logs live under
    CACHEROUTE_HOME/brokers/<host>-<port>/.
    """


@kafka.command()
@click.option(
    "--timeout", default=120.0, show_default=True, help="Seconds to wait until it answers."
)
@click.option(
    "--source",
    type=click.Choice(["auto", "maven", "tarball"]),
    help="Where to fetch the jars when they are not cached [env CACHEROUTE_KAFKA_SOURCE].",
)
@click.option("--kafka-version", help="Apache Kafka version [env CACHEROUTE_KAFKA_VERSION].")
@click.option(
    "--secure",
    is_flag=True,
    help="SASL_SSL (SCRAM-SHA-512, a generated CA) with ACLs and one principal per role "
    "(admin, gateway, streams, planner); their client properties files go under the broker's "
    "state folder. A folder keeps the mode it was created with.",
)
@click.option(
    "--streams-app-id",
    default="cacheroute-streams",
    show_default=True,
    help="With --secure: the streams agent's --app-id, whose group and topics the ACLs allow.",
)
@click.option(
    "--planner-group",
    default="cacheroute-planner",
    show_default=True,
    help="With --secure: the planner's group (and transactional id base) the ACLs allow.",
)
@click.option(
    "--brokers",
    type=click.IntRange(min=1, max=9),
    default=1,
    show_default=True,
    help="Nodes: N > 1 starts an N-node KRaft cluster (each controller and broker) on ports "
    "PORT, PORT+2, ...; `topics ensure` then replicates 3x with min.insync.replicas=2.",
)
@json_option("Print the result as JSON.")
@click.pass_obj
def start(
    settings: Settings,
    timeout: float,
    source: str | None,
    kafka_version: str | None,
    secure: bool,
    streams_app_id: str,
    planner_group: str,
    brokers: int,
    as_json: bool,
) -> None:
    """Start the broker (idempotent) and wait until it answers a metadata request.

    With --secure it also creates the ACLs of the four roles for the current topic names
    (--topic-prefix applies) and prints where each role's credentials are.
    """
    local = local_for(settings, kafka_source=source, kafka_version=kafka_version)
    console = Console(stderr=True)
    dist = resolve_distribution(local, console=console)
    if brokers > 1:
        if secure:
            raise CacheRouteError(
                "--secure runs a single broker for now; start the cluster without --secure, or "
                "the secure broker with --brokers 1"
            )
        cluster = cluster_for(settings, brokers)
        with console.status(f"Starting a {brokers}-node Kafka {dist.version} cluster ..."):
            started = cluster.start(dist, timeout=max(timeout, 180.0))
        if as_json:
            click.echo(
                orjson.dumps(
                    {
                        "bootstrap": started.bootstrap,
                        "pids": list(started.pids),
                        "brokers": brokers,
                        "nodes": [
                            {"node_id": n.node_id, "bootstrap": n.bootstrap, "pid": pid}
                            for n, pid in zip(cluster.nodes, started.pids, strict=True)
                        ],
                        "already_running": started.already_running,
                        "version": dist.version,
                        "seconds": round(started.seconds, 2),
                    }
                )
            )
            return
        click.echo(
            f"Kafka {dist.version} cluster of {brokers} is running (pids "
            f"{', '.join(map(str, started.pids))}, ready in {started.seconds:.1f}s)"
        )
        click.echo(f"bootstrap: {started.bootstrap}")
        return
    broker = broker_for(settings, secure=secure)
    mode = " (SASL_SSL, ACLs)" if secure else ""
    with console.status(f"Starting Kafka {dist.version}{mode} at {broker.bootstrap} ..."):
        result = broker.start(dist, timeout=timeout)
    acls = 0
    admin_security = broker.client_security("admin")
    if admin_security is not None:
        admin_settings = settings.with_overrides(
            bootstrap=result.bootstrap, kafka_security=admin_security
        )
        rules = deployment_acls(
            settings, streams_app_id=streams_app_id, planner_group=planner_group
        )
        acls = apply_acls(admin_settings, rules)
    if as_json:
        out: dict[str, object] = {
            "bootstrap": result.bootstrap,
            "pid": result.pid,
            "already_running": result.already_running,
            "version": dist.version,
            "seconds": round(result.seconds, 2),
        }
        if result.credentials:
            out["security_protocol"] = "SASL_SSL"
            out["credentials"] = {role: str(path) for role, path in result.credentials.items()}
            out["ca_file"] = str(result.ca_file)
            out["acls"] = acls
        click.echo(orjson.dumps(out))
        return
    verb = "was already running" if result.already_running else "is running"
    click.echo(
        f"Kafka {dist.version}{mode} {verb} at {result.bootstrap} (pid {result.pid}, "
        f"ready in {result.seconds:.1f}s)"
    )
    click.echo(f"bootstrap: {result.bootstrap}")
    if result.credentials:
        click.echo(f"CA certificate: {result.ca_file}")
        click.echo(
            f"ACLs: {acls} allowed operations for the roles (topics: {settings.topic_prefix!r} prefix)"
        )
        for role, path in result.credentials.items():
            click.echo(f"  {role:<8} --kafka-config {path}")


@kafka.command()
@click.option("--timeout", default=60.0, show_default=True, help="Seconds before SIGKILL.")
@click.pass_obj
def stop(settings: Settings, timeout: float) -> None:
    """Stop the broker (or cluster) this tool started (pid files); never other processes."""
    for cluster in _clusters(settings):
        pids = cluster.stop(timeout=timeout)
        if pids:
            click.echo(
                f"Stopped the {cluster.size}-node cluster at {cluster.bootstrap} (pids "
                f"{', '.join(map(str, pids))}); data kept in {cluster.state_dir}."
            )
    broker = broker_for(settings)
    pid = broker.stop(timeout=timeout)
    if pid is None:
        click.echo(f"No broker started by cacheroute runs at {broker.bootstrap}; nothing to stop.")
    else:
        click.echo(
            f"Stopped the broker at {broker.bootstrap} (pid {pid}); data kept in "
            f"{broker.state_dir}."
        )


@kafka.command()
@json_option("Print the status as JSON.")
@click.pass_obj
def status(settings: Settings, as_json: bool) -> None:
    """Say whether the broker runs and answers; exit 0 when it answers, 3 when it does not."""
    broker = broker_for(settings)
    configured = settings.kafka_security
    st = broker.status(configured if configured.protocol != "PLAINTEXT" else None)
    nodes = [n for c in _clusters(settings) if any(x.pid() for x in c.nodes) for n in c.status()]
    if nodes:
        if as_json:
            click.echo(
                orjson.dumps(
                    {
                        "bootstrap": ",".join(n.bootstrap for n in nodes),
                        "nodes": [
                            {
                                "bootstrap": n.bootstrap,
                                "running": n.running,
                                "pid": n.pid,
                                "answering": n.answering,
                            }
                            for n in nodes
                        ],
                    }
                )
            )
        else:
            for n in nodes:
                state = f"pid {n.pid}" if n.running else "NOT running"
                health = "answering" if n.answering else "not answering"
                click.echo(f"node {n.bootstrap}: {state}, {health}")
            click.echo(f"bootstrap: {','.join(n.bootstrap for n in nodes)}")
        sys.exit(0 if any(n.answering for n in nodes) else 3)
    if as_json:
        click.echo(
            orjson.dumps(
                {
                    "bootstrap": st.bootstrap,
                    "running": st.running,
                    "pid": st.pid,
                    "answering": st.answering,
                    "state_dir": str(st.state_dir),
                    "secure": broker.is_secure,
                }
            )
        )
    elif st.running:
        health = "answering" if st.answering else "NOT answering yet (see `cacheroute kafka logs`)"
        click.echo(f"running (pid {st.pid}), {health}")
        click.echo(f"bootstrap: {st.bootstrap}")
    elif st.answering:
        click.echo("a broker not started by cacheroute answers at this address")
        click.echo(f"bootstrap: {st.bootstrap}")
    else:
        click.echo("not running; start it with `cacheroute kafka start`")
        click.echo(f"bootstrap: {st.bootstrap}")
    sys.exit(0 if st.answering else 3)


@kafka.command()
@click.option("-n", "--lines", default=50, show_default=True, help="Lines to show.")
@click.option("-f", "--follow", is_flag=True, help="Keep printing new lines (Ctrl-C to stop).")
@click.pass_obj
def logs(settings: Settings, lines: int, follow: bool) -> None:
    """Show the broker's log (and its JVM output, where start-up failures land)."""
    broker = broker_for(settings)
    if not broker.log_file.exists() and not broker.stdout_file.exists():
        raise CacheRouteError(f"no broker logs under {broker.state_dir}: it was never started")
    click.echo(broker.tail(lines))
    if not follow:
        return
    path = broker.log_file
    with path.open("r", errors="replace") as fh:
        fh.seek(0, 2)
        while True:
            line = fh.readline()
            if line:
                click.echo(line, nl=False)
            else:
                time.sleep(0.3)
