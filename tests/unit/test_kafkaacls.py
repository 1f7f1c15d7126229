"""Least-privilege ACLs per role, their kafka-acls rendering, and the secure broker's files."""

from __future__ import annotations

import base64
import hashlib
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner

from cacheroute.cli.main import cli
from cacheroute.errors import CacheRouteError
from cacheroute.kafkaacls import AclRule, deployment_acls, kafka_acls_commands
from cacheroute.localkafka import LocalBroker
from cacheroute.localkafka.config import render_server_properties
from cacheroute.localkafka.secure import (
    SecureFiles,
    ensure_secrets,
    scram_arguments,
    secure_server_properties,
    write_credentials,
)
from cacheroute.settings import Settings


def _by_role(rules: list[AclRule]) -> dict[str, set[tuple[str, str, str, str]]]:
    out: dict[str, set[tuple[str, str, str, str]]] = {}
    for r in rules:
        out.setdefault(r.role, set()).add((r.resource, r.name, r.pattern, r.operation))
    return out


def test_each_role_gets_exactly_its_operations() -> None:
    rules = deployment_acls(Settings(topic_prefix="p."), streams_app_id="p.streams")
    by = _by_role(rules)
    assert by["gateway"] == {
        ("topic", "p.requests", "literal", "WRITE"),
        ("topic", "p.requests", "literal", "DESCRIBE"),
        ("topic", "p.plans", "literal", "READ"),
        ("topic", "p.plans", "literal", "DESCRIBE"),
        ("group", "cacheroute-plan-reader", "literal", "READ"),
    }
    assert by["streams"] == {
        ("topic", "p.requests", "literal", "READ"),
        ("topic", "p.requests", "literal", "DESCRIBE"),
        ("topic", "p.rates", "literal", "WRITE"),
        ("topic", "p.rates", "literal", "DESCRIBE"),
        ("topic", "p.dead-letter", "literal", "WRITE"),
        ("topic", "p.dead-letter", "literal", "DESCRIBE"),
        *(
            ("topic", "p.streams-", "prefixed", op)
            for op in ("CREATE", "READ", "WRITE", "DESCRIBE", "DESCRIBE_CONFIGS")
        ),
        ("group", "p.streams", "literal", "READ"),
    }
    assert by["planner"] == {
        ("topic", "p.rates", "literal", "READ"),
        ("topic", "p.rates", "literal", "DESCRIBE"),
        ("topic", "p.plans", "literal", "READ"),
        ("topic", "p.plans", "literal", "WRITE"),
        ("topic", "p.plans", "literal", "DESCRIBE"),
        ("topic", "p.dead-letter", "literal", "WRITE"),
        ("topic", "p.dead-letter", "literal", "DESCRIBE"),
        ("group", "p.cacheroute-planner", "literal", "READ"),
        ("group", "cacheroute-planner-rates", "literal", "READ"),
        ("group", "cacheroute-plan-reader", "literal", "READ"),
        ("transactional-id", "p.cacheroute-planner", "literal", "WRITE"),
        ("transactional-id", "p.cacheroute-planner", "literal", "DESCRIBE"),
    }
    # nobody but the planner writes plans, nobody but the gateway writes requests
    writers = {(r.name, r.role) for r in rules if r.operation == "WRITE" and r.resource == "topic"}
    assert {role for name, role in writers if name == "p.plans"} == {"planner"}
    assert {role for name, role in writers if name == "p.requests"} == {"gateway"}
    # the admin manages topics but never writes data
    assert not any(r.role == "admin" and r.operation == "WRITE" for r in rules)


def test_kafka_acls_commands_are_grouped_and_quoted() -> None:
    rules = deployment_acls(Settings(), principals={"gateway": "User:gw eu"})
    lines = kafka_acls_commands(rules, bootstrap="k1:9093", command_config="/etc/admin.props")
    assert lines[0] == (
        "kafka-acls.sh --bootstrap-server k1:9093 --command-config /etc/admin.props --add "
        "--allow-principal 'User:gw eu' --operation Write --operation Describe --topic requests"
    )
    assert (
        "kafka-acls.sh --bootstrap-server k1:9093 --command-config /etc/admin.props --add "
        "--allow-principal User:streams --operation Create --operation Read --operation Write "
        "--operation Describe --operation DescribeConfigs --topic cacheroute-streams- "
        "--resource-pattern-type prefixed"
    ) in lines
    assert (
        "kafka-acls.sh --bootstrap-server k1:9093 --command-config /etc/admin.props --add "
        "--allow-principal User:planner --operation Write --operation Describe "
        "--transactional-id cacheroute-planner"
    ) in lines
    assert len(lines) == len({(r.principal, r.resource, r.name, r.pattern) for r in rules})


def test_topics_acls_cli_prints_commands_and_rejects_bad_principals() -> None:
    result = CliRunner().invoke(cli, ["--topic-prefix", "x.", "topics", "acls"])
    assert result.exit_code == 0, result.output
    assert "--allow-principal User:gateway --operation Write --operation Describe --topic " in (
        result.output
    )
    assert "x.requests" in result.output
    bad = CliRunner().invoke(cli, ["topics", "acls", "--principal", "root=User:x"])
    assert bad.exit_code == 2
    assert "ROLE=PRINCIPAL" in bad.output


# ------------------------------------------------------------------ secure broker files
def test_secrets_are_generated_once_private_and_reused(tmp_path: Path) -> None:
    files = SecureFiles(tmp_path)
    first = ensure_secrets(files)
    assert stat.S_IMODE(files.secrets_file.stat().st_mode) == 0o600
    assert ensure_secrets(files) == first
    assert set(first) == {
        "admin",
        "gateway",
        "streams",
        "planner",
        "broker",
        "controller",
        "keystore",
        "ca",
    }
    assert len({s.reveal() for s in first.values()}) == len(first)
    files.secrets_file.write_text("{")
    with pytest.raises(CacheRouteError, match="unreadable"):
        ensure_secrets(files)


def test_scram_arguments_carry_salted_passwords_only(tmp_path: Path) -> None:
    secrets = ensure_secrets(SecureFiles(tmp_path))
    args = scram_arguments(secrets, salt=b"0123456789abcdef")
    assert args.count("--add-scram") == 10  # 5 users x 2 mechanisms
    for s in secrets.values():
        assert all(s.reveal() not in a for a in args)
    salted = hashlib.pbkdf2_hmac(
        "sha512", secrets["gateway"].reveal().encode(), b"0123456789abcdef", 8192
    )
    assert (
        "SCRAM-SHA-512=[name=gateway,iterations=8192,"
        f'salt="{base64.b64encode(b"0123456789abcdef").decode()}",'
        f'saltedpassword="{base64.b64encode(salted).decode()}"]'
    ) in args


def test_secure_server_properties(tmp_path: Path) -> None:
    files = SecureFiles(tmp_path)
    secrets = ensure_secrets(files)
    overrides = secure_server_properties(
        files, secrets, host="127.0.0.1", port=19092, controller_port=19093
    )
    text = render_server_properties(
        host="127.0.0.1",
        port=19092,
        controller_port=19093,
        data_dir=tmp_path / "data",
        overrides=overrides,
    )
    props = dict(
        line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#")
    )
    assert props["listeners"] == "SASL_SSL://127.0.0.1:19092,CONTROLLER://127.0.0.1:19093"
    assert props["advertised.listeners"] == "SASL_SSL://127.0.0.1:19092"
    assert props["listener.security.protocol.map"] == "CONTROLLER:SASL_PLAINTEXT,SASL_SSL:SASL_SSL"
    assert props["authorizer.class.name"].endswith("StandardAuthorizer")
    assert props["allow.everyone.if.no.acl.found"] == "false"
    assert props["super.users"] == "User:admin;User:broker;User:controller"
    assert props["ssl.truststore.location"] == str(files.ca_pem.resolve())
    assert props["auto.create.topics.enable"] == "false"  # the base config stays


def test_credentials_files_are_private_and_load_as_kafka_config(tmp_path: Path) -> None:
    files = SecureFiles(tmp_path)
    secrets = ensure_secrets(files)
    files.tls_dir.mkdir()
    files.ca_pem.write_text("-----BEGIN CERTIFICATE-----\n")
    paths = write_credentials(files, "127.0.0.1:19092", secrets)
    assert set(paths) == {"gateway", "streams", "planner", "admin"}
    for role, path in paths.items():
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        settings = Settings.from_env({}, kafka_config=path)
        assert settings.bootstrap == "127.0.0.1:19092"
        assert settings.kafka_security.principal == f"User:{role}"
        assert settings.kafka_security.password == secrets[role]
        assert settings.kafka_security.protocol == "SASL_SSL"


def test_a_folder_keeps_its_mode(tmp_path: Path) -> None:
    plain = LocalBroker(tmp_path / "a", port=19092, secure=True)
    (plain.state_dir / "data").mkdir(parents=True)
    (plain.state_dir / "data" / "meta.properties").write_text("x")
    with pytest.raises(CacheRouteError, match="created without --secure"):
        plain._check_mode()
    secure = LocalBroker(tmp_path / "b", port=19092)
    ensure_secrets(secure.secure_files)
    assert secure.is_secure
    with pytest.raises(CacheRouteError, match="start it with `cacheroute kafka start --secure`"):
        secure._check_mode()
