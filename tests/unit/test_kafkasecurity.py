"""Kafka connection security: env, TOML and Kafka properties files, client configs, redaction."""

from __future__ import annotations

import logging
import ssl
from pathlib import Path

import pytest

from cacheroute.errors import ConfigError
from cacheroute.kafkaio import (
    ClientConfig,
    admin_config,
    consumer_config,
    explain_kafka_error,
    producer_config,
)
from cacheroute.kafkasecurity import (
    KafkaSecurity,
    Secret,
    load_connection_file,
    parse_jaas_config,
    parse_properties,
)
from cacheroute.settings import Settings

PASSWORD = "s3cr3t-Pa55w0rd"  # noqa: S105 - a test value, grepped for in every output below
KEY_PASSWORD = "k3y-Pa55"  # noqa: S105


def _ca(tmp_path: Path) -> Path:
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n")
    return ca


# ------------------------------------------------------------------------------- secrets
def test_secret_never_shows_itself() -> None:
    s = Secret(PASSWORD)
    assert s.reveal() == PASSWORD
    for text in (repr(s), str(s), f"{s}", f"{s!r}", "%s" % s, format(s, ">30")):  # noqa: UP031
        assert PASSWORD not in text
        assert "********" in text
    assert s == Secret(PASSWORD)
    assert s != Secret("other")
    assert hash(s) == hash(Secret(PASSWORD))
    assert not Secret("")


def test_settings_and_security_reprs_and_errors_hide_passwords(tmp_path: Path) -> None:
    env = {
        "CACHEROUTE_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
        "CACHEROUTE_KAFKA_USERNAME": "planner",
        "CACHEROUTE_KAFKA_PASSWORD": PASSWORD,
        "CACHEROUTE_KAFKA_SSL_CA_FILE": str(_ca(tmp_path)),
        "CACHEROUTE_KAFKA_SSL_KEY_PASSWORD": KEY_PASSWORD,
    }
    settings = Settings.from_env(env)
    texts = [
        repr(settings),
        str(settings),
        repr(settings.kafka_security),
        str(settings.kafka_security.describe()),
        repr(producer_config(settings)),
        str(consumer_config(settings)),
        repr(admin_config(settings)),
    ]
    for text in texts:
        assert PASSWORD not in text
        assert KEY_PASSWORD not in text
    # ... while the clients get the real values
    config = producer_config(settings)
    assert isinstance(config, ClientConfig)
    assert config["sasl.password"] == PASSWORD
    assert config["ssl.key.password"] == KEY_PASSWORD
    assert config["bootstrap.servers"] == "127.0.0.1:9092"
    assert config["enable.idempotence"] is True
    # a missing CA file is an error that names the variable, not the password
    bad = {**env, "CACHEROUTE_KAFKA_SSL_CA_FILE": str(tmp_path / "nope.pem")}
    with pytest.raises(ConfigError, match="CACHEROUTE_KAFKA_SSL_CA_FILE") as info:
        Settings.from_env(bad)
    assert PASSWORD not in str(info.value)


def test_plaintext_default_adds_nothing_to_client_configs() -> None:
    settings = Settings.from_env({})
    assert settings.kafka_security == KafkaSecurity()
    assert settings.kafka_security.client_config() == {}
    assert settings.kafka_security.faust_credentials() is None
    assert settings.kafka_security.ssl_context() is None
    assert "security.protocol" not in producer_config(settings)
    assert consumer_config(settings, "g")["group.id"] == "g"


# ------------------------------------------------------------------------- environment
def test_environment_sasl_plaintext_scram() -> None:
    env = {
        "CACHEROUTE_KAFKA_SECURITY_PROTOCOL": "sasl_plaintext",
        "CACHEROUTE_KAFKA_SASL_MECHANISM": "scram-sha-256",
        "CACHEROUTE_KAFKA_USERNAME": "gateway",
        "CACHEROUTE_KAFKA_PASSWORD": PASSWORD,
    }
    sec = Settings.from_env(env).kafka_security
    assert sec.client_config() == {
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "SCRAM-SHA-256",
        "sasl.username": "gateway",
        "sasl.password": PASSWORD,
    }
    assert sec.principal == "User:gateway"
    assert sec.source == "CACHEROUTE_KAFKA_* environment"


def test_password_file_and_default_mechanism(tmp_path: Path) -> None:
    pw = tmp_path / "pw"
    pw.write_text(PASSWORD + "\n")
    env = {
        "CACHEROUTE_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
        "CACHEROUTE_KAFKA_USERNAME": "streams",
        "CACHEROUTE_KAFKA_PASSWORD_FILE": str(pw),
    }
    sec = Settings.from_env(env).kafka_security
    assert sec.password == Secret(PASSWORD)
    assert sec.effective_mechanism == "SCRAM-SHA-512"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"CACHEROUTE_KAFKA_SECURITY_PROTOCOL": "TLS"}, "is not one of PLAINTEXT, SSL"),
        (
            {"CACHEROUTE_KAFKA_SECURITY_PROTOCOL": "SASL_SSL", "CACHEROUTE_KAFKA_USERNAME": "u"},
            "needs a username and a password",
        ),
        (
            {
                "CACHEROUTE_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
                "CACHEROUTE_KAFKA_SASL_MECHANISM": "GSSAPI",
                "CACHEROUTE_KAFKA_USERNAME": "u",
                "CACHEROUTE_KAFKA_PASSWORD": PASSWORD,
            },
            "GSSAPI",
        ),
        (
            {"CACHEROUTE_KAFKA_SECURITY_PROTOCOL": "SSL", "CACHEROUTE_KAFKA_SSL_CERT_FILE": "/"},
            "CACHEROUTE_KAFKA_SSL_CERT_FILE",
        ),
        ({"CACHEROUTE_KAFKA_SSL_CHECK_HOSTNAME": "maybe"}, "is not true or false"),
    ],
)
def test_bad_security_values_name_the_variable(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        Settings.from_env(env)
    assert PASSWORD not in str(info.value)


# ---------------------------------------------------------------------------- properties
JAVA_PROPERTIES = r"""
# A file as Kafka's own tools take it (kafka-console-producer --producer.config)
bootstrap.servers = broker-1.example:9093,broker-2.example:9093
security.protocol=SASL_SSL
sasl.mechanism: SCRAM-SHA-512
sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required \
    username="planner" \
    password="s3cr3t-Pa55w0rd";
ssl.truststore.type=PEM
ssl.truststore.location=certs/ca.pem
ssl.endpoint.identification.algorithm=
client.id=ignored-by-cacheroute
"""


def test_kafka_properties_file_with_jaas_and_pem_truststore(tmp_path: Path) -> None:
    (tmp_path / "certs").mkdir()
    _ca(tmp_path / "certs")
    path = tmp_path / "planner.properties"
    path.write_text(JAVA_PROPERTIES)
    settings = Settings.from_env({}, kafka_config=path)
    sec = settings.kafka_security
    assert settings.bootstrap == "broker-1.example:9093,broker-2.example:9093"  # from the file
    assert (sec.protocol, sec.effective_mechanism, sec.username) == (
        "SASL_SSL",
        "SCRAM-SHA-512",
        "planner",
    )
    assert sec.password == Secret(PASSWORD)
    assert sec.ssl_ca_file == tmp_path / "certs" / "ca.pem"  # relative to the file
    assert sec.ssl_check_hostname is False
    assert sec.client_config()["ssl.endpoint.identification.algorithm"] == "none"
    assert sec.source == str(path)
    # the environment beats the file, value by value; an explicit --bootstrap beats both
    env = {"CACHEROUTE_KAFKA_PASSWORD": "from-env", "CACHEROUTE_BOOTSTRAP": "10.0.0.1:9093"}
    mixed = Settings.from_env(env, kafka_config=path)
    assert mixed.kafka_security.password == Secret("from-env")
    assert mixed.kafka_security.username == "planner"
    assert mixed.bootstrap == "10.0.0.1:9093"
    assert Settings.from_env({}, kafka_config=path, bootstrap="h:1").bootstrap == "h:1"


def test_librdkafka_style_properties_and_plain_module(tmp_path: Path) -> None:
    path = tmp_path / "client.properties"
    path.write_text(
        "security.protocol=SASL_PLAINTEXT\n"
        "sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required "
        'username="alice" password="with \\\\"quote\\\\" and ;";\n'  # Java escaping
    )
    sec = Settings.from_env({}, kafka_config=path).kafka_security
    assert sec.effective_mechanism == "PLAIN"  # inferred from the login module
    assert sec.password == Secret('with "quote" and ;')
    librdkafka = tmp_path / "rd.properties"
    librdkafka.write_text(
        "security.protocol=SASL_SSL\nsasl.mechanisms=SCRAM-SHA-256\nsasl.username=bob\n"
        f"sasl.password={PASSWORD}\nssl.ca.location={_ca(tmp_path)}\n"
    )
    sec = Settings.from_env({}, kafka_config=librdkafka).kafka_security
    assert (sec.effective_mechanism, sec.username) == ("SCRAM-SHA-256", "bob")
    assert sec.ssl_check_hostname is True


def test_jks_truststore_is_refused_with_the_conversion_command(tmp_path: Path) -> None:
    path = tmp_path / "java.properties"
    path.write_text(
        "security.protocol=SSL\nssl.truststore.location=/etc/kafka/truststore.jks\n"
        f"ssl.truststore.password={PASSWORD}\n"
    )
    with pytest.raises(ConfigError, match="keytool -exportcert -rfc") as info:
        Settings.from_env({}, kafka_config=path)
    assert PASSWORD not in str(info.value)


def test_unparsable_jaas_does_not_echo_it() -> None:
    with pytest.raises(ConfigError) as info:
        parse_jaas_config(f"password={PASSWORD}")
    assert PASSWORD not in str(info.value)
    module, options = parse_jaas_config(
        'org.apache.kafka.common.security.scram.ScramLoginModule required username="u" '
        "password=plain;"
    )
    assert module.endswith("ScramLoginModule")
    assert options == {"username": "u", "password": "plain"}


def test_java_properties_syntax() -> None:
    text = "a=1\n  b : 2\nc 3\n! comment\n# comment\nd=x\\\n   y\ne=\\u0041\\=\\:\nf\n"
    assert parse_properties(text) == {
        "a": "1",
        "b": "2",
        "c": "3",
        "d": "xy",
        "e": "A=:",
        "f": "",
    }


def test_toml_file_under_kafka_table(tmp_path: Path) -> None:
    _ca(tmp_path)
    (tmp_path / "pw.txt").write_text(PASSWORD)
    path = tmp_path / "conn.toml"
    path.write_text(
        "[kafka]\n"
        'bootstrap = "k1:9093"\n'
        'security_protocol = "SASL_SSL"\n'
        'sasl_mechanism = "SCRAM-SHA-512"\n'
        'username = "streams"\n'
        'password_file = "pw.txt"\n'
        'ssl_ca_file = "ca.pem"\n'
        "ssl_check_hostname = true\n"
    )
    values, bootstrap = load_connection_file(path)
    assert values["username"] == "streams"
    assert bootstrap == "k1:9093"
    settings = Settings.from_env({}, kafka_config=path)
    assert settings.bootstrap == "k1:9093"
    assert settings.kafka_security.password == Secret(PASSWORD)
    assert settings.kafka_security.ssl_ca_file == tmp_path / "ca.pem"
    bad = tmp_path / "bad.toml"
    bad.write_text('security_protocol = "SASL_SSL"\nuser = "x"\n')
    with pytest.raises(ConfigError, match=r"unknown Kafka connection settings.*user"):
        Settings.from_env({}, kafka_config=bad)


def test_written_properties_read_back_identically(tmp_path: Path) -> None:
    sec = KafkaSecurity(
        protocol="SASL_SSL",
        mechanism="SCRAM-SHA-512",
        username="gateway",
        password=Secret('p"w\\d'),
        ssl_ca_file=_ca(tmp_path),
    )
    path = tmp_path / "gateway.properties"
    path.write_text(sec.to_properties("127.0.0.1:19092"))
    settings = Settings.from_env({}, kafka_config=path)
    assert settings.bootstrap == "127.0.0.1:19092"
    assert settings.kafka_security == sec


def test_with_overrides_loads_the_file_without_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CACHEROUTE_KAFKA_USERNAME", "from-env")
    path = tmp_path / "c.properties"
    path.write_text(
        f"security.protocol=SASL_PLAINTEXT\nsasl.username=fromfile\nsasl.password={PASSWORD}\n"
    )
    settings = Settings().with_overrides(kafka_config=path)
    assert settings.kafka_security.username == "fromfile"


# --------------------------------------------------------------------------------- TLS
def test_ssl_context_and_faust_credentials(tmp_path: Path) -> None:
    import faust  # noqa: PLC0415

    sec = KafkaSecurity(protocol="SSL", ssl_check_hostname=False)
    ctx = sec.ssl_context()
    assert isinstance(ctx, ssl.SSLContext)
    assert ctx.check_hostname is False
    assert isinstance(sec.faust_credentials(), faust.SSLCredentials)
    sasl = KafkaSecurity(
        protocol="SASL_SSL", mechanism="SCRAM-SHA-256", username="streams", password=Secret("x")
    )
    creds = sasl.faust_credentials()
    assert isinstance(creds, faust.SASLCredentials)
    assert creds.mechanism.value == "SCRAM-SHA-256"
    assert creds.protocol.value == "SASL_SSL"
    assert "x" not in repr(creds).replace("SASLCredentials", "")
    broken = KafkaSecurity(protocol="SSL", ssl_ca_file=_ca(tmp_path))
    with pytest.raises(ConfigError, match="cannot load the TLS files"):
        broken.ssl_context()


# ------------------------------------------------------------------------ error messages
def test_explain_kafka_error_names_the_cause_without_secrets() -> None:
    from confluent_kafka import KafkaError, KafkaException  # noqa: PLC0415

    from cacheroute.kafkaio import ErrorWatch  # noqa: PLC0415

    settings = Settings(
        bootstrap="127.0.0.1:19093",
        kafka_security=KafkaSecurity(
            protocol="SASL_SSL", username="gateway", password=Secret(PASSWORD), source="gw.props"
        ),
    )
    watch = ErrorWatch()
    watch(KafkaError(KafkaError._ALL_BROKERS_DOWN, "1/1 brokers are down"))
    watch(
        KafkaError(
            KafkaError._AUTHENTICATION,
            "sasl_ssl://127.0.0.1:19093/bootstrap: SASL authentication error: Authentication "
            "failed during authentication due to invalid credentials with SASL mechanism "
            "SCRAM-SHA-512 (after 312ms in state AUTH_REQ)",
        )
    )
    watch(KafkaError(KafkaError._ALL_BROKERS_DOWN, "1/1 brokers are down"))  # does not win
    exc = KafkaException(KafkaError(KafkaError._TRANSPORT, "Failed to get metadata"))
    kind, line = explain_kafka_error(settings, exc, watch)
    assert kind == "authentication"
    assert line.startswith(
        "Kafka authentication failed as User:gateway (SCRAM-SHA-512) at 127.0.0.1:19093: SASL "
        "authentication error: Authentication failed during authentication due to invalid "
        "credentials with SASL mechanism SCRAM-SHA-512. Check the username and password"
    )
    assert "gw.props" in line
    assert PASSWORD not in line
    assert "\n" not in line
    denied = KafkaException(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED, "denied."))
    kind, line = explain_kafka_error(settings, denied, doing="producing to plans")
    assert kind == "authorization"
    assert line.startswith("Kafka refused producing to plans as User:gateway (SCRAM-SHA-512)")
    down = KafkaException(KafkaError(KafkaError._TRANSPORT, "Failed to get metadata"))
    kind, line = explain_kafka_error(Settings(), down, ErrorWatch())
    assert kind == "unreachable"
    assert "CACHEROUTE_KAFKA_SECURITY_PROTOCOL" in line  # PLAINTEXT: hint at TLS/SASL


def test_properties_file_unknown_keys_are_only_debug_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "p.properties"
    path.write_text(f"client.id=x\nsasl.password={PASSWORD}\n")
    with caplog.at_level(logging.DEBUG, logger="cacheroute.kafkasecurity"):
        load_connection_file(path)
    assert "client.id" in caplog.text
    assert PASSWORD not in caplog.text
