"""Configuration files of the local broker, rendered as text (pure functions, easy to test)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

__all__ = ["render_log4j2", "render_server_properties"]


def render_server_properties(
    *,
    host: str,
    port: int,
    controller_port: int,
    data_dir: Path,
    node_id: int = 1,
    overrides: Mapping[str, str] | None = None,
) -> str:
    """server.properties for one process that is both KRaft controller and broker.

    Every internal topic runs at replication factor 1 (there is one broker). The group rebalance
    delay is 0 so consumer groups join at once in tests, and the log cleaner wakes every second so
    compaction of the plans topic is observable within seconds. Topics are never auto-created: a
    mistyped topic name fails loudly instead of silently creating a one-partition topic.

    `overrides` replace or add lines: the secure broker's listeners, SASL, TLS and authorizer
    (`localkafka.secure.secure_server_properties`).
    """
    lines = {
        "process.roles": "broker,controller",
        "node.id": str(node_id),
        "controller.quorum.bootstrap.servers": f"{host}:{controller_port}",
        "listeners": f"PLAINTEXT://{host}:{port},CONTROLLER://{host}:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://{host}:{port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        "log.dirs": str(data_dir),
        "num.partitions": "1",
        "auto.create.topics.enable": "false",
        "offsets.topic.replication.factor": "1",
        "offsets.topic.num.partitions": "10",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "transaction.state.log.num.partitions": "4",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        "group.initial.rebalance.delay.ms": "0",
        "log.cleaner.backoff.ms": "1000",
        "log.retention.check.interval.ms": "30000",
    }
    lines.update(overrides or {})
    body = "\n".join(f"{k}={v}" for k, v in lines.items())
    return (
        f"# Written by `cacheroute kafka start`; edits are overwritten at the next start.\n{body}\n"
    )


def render_log4j2(log_file: Path) -> str:
    """log4j2 properties: INFO to a rolling file (3 x 20 MB), noisy request loggers at WARN."""
    pattern = "[%d] %p %m (%c)%n"
    return "\n".join(
        [
            "status = warn",
            "name = cacheroute-broker",
            "appender.file.type = RollingFile",
            "appender.file.name = FILE",
            f"appender.file.fileName = {log_file}",
            f"appender.file.filePattern = {log_file}.%i",
            "appender.file.layout.type = PatternLayout",
            f"appender.file.layout.pattern = {pattern}",
            "appender.file.policies.type = Policies",
            "appender.file.policies.size.type = SizeBasedTriggeringPolicy",
            "appender.file.policies.size.size = 20MB",
            "appender.file.strategy.type = DefaultRolloverStrategy",
            "appender.file.strategy.max = 3",
            "rootLogger.level = INFO",
            "rootLogger.appenderRef.file.ref = FILE",
            "logger.request.name = kafka.request.logger",
            "logger.request.level = WARN",
            "logger.state.name = state.change.logger",
            "logger.state.level = WARN",
            "logger.network.name = kafka.network.RequestChannel$",
            "logger.network.level = WARN",
            "",
        ]
    )
