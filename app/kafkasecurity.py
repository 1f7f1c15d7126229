"""How every CacheRoute client connects to Kafka: security protocol, SASL and TLS, in one place.

One `KafkaSecurity` value (held by `Settings.kafka_security`) feeds every client: the confluent-kafka
producers, consumers and admin clients (all built by `cacheroute.kafkaio`), Faust's aiokafka clients
(`faust_credentials()`, used by streams/app.py) and the local broker tools. A deployment therefore
configures its connection once, and no client can silently fall back to PLAINTEXT.

Where the values come from, lowest to highest precedence:
1. defaults: PLAINTEXT, no SASL, no TLS (what the demo and the local broker use);
2. a file named by `--kafka-config FILE` or `CACHEROUTE_KAFKA_CONFIG`: either a Kafka client
   properties file — the format Kafka's own tools take (`security.protocol`, `sasl.mechanism`,
   `sasl.jaas.config`, `ssl.ca.location` or a PEM `ssl.truststore.location`, ...) — or, when its
   name ends in `.toml`, a TOML file with the keys of the variables below (lower case, without the
   `CACHEROUTE_KAFKA_` prefix; top level or under `[kafka]`). Relative paths in the file are
   relative to the file's folder;
3. `CACHEROUTE_KAFKA_*` variables, so a secret can be injected from the environment while the rest
   of the connection lives in a file.

Secrets (the SASL password and the TLS key password) are held as `Secret`: `repr`, `str` and
formatting print `********`, and only `Secret.reveal()` returns the value. Only the builders that
hand the config to a Kafka client (`client_config`, `ssl_context`, `faust_credentials`) and the
writer of 0600 client property files (`to_properties`) call it; error messages name keys and files,
never values.
"""

from __future__ import annotations

import dataclasses
import hmac
import logging
import os
import re
import ssl
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cacheroute.errors import ConfigError

__all__ = [
    "ENV_VARS",
    "MECHANISMS",
    "PROTOCOLS",
    "KafkaSecurity",
    "Secret",
    "load_connection_file",
    "parse_jaas_config",
    "parse_properties",
    "redact_config",
]

log = logging.getLogger(__name__)

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
DEFAULT_MECHANISM = "SCRAM-SHA-512"
REDACTED = "********"

ENV_VARS = {
    "security_protocol": "CACHEROUTE_KAFKA_SECURITY_PROTOCOL",
    "sasl_mechanism": "CACHEROUTE_KAFKA_SASL_MECHANISM",
    "username": "CACHEROUTE_KAFKA_USERNAME",
    "password": "CACHEROUTE_KAFKA_PASSWORD",
    "password_file": "CACHEROUTE_KAFKA_PASSWORD_FILE",
    "ssl_ca_file": "CACHEROUTE_KAFKA_SSL_CA_FILE",
    "ssl_cert_file": "CACHEROUTE_KAFKA_SSL_CERT_FILE",
    "ssl_key_file": "CACHEROUTE_KAFKA_SSL_KEY_FILE",
    "ssl_key_password": "CACHEROUTE_KAFKA_SSL_KEY_PASSWORD",
    "ssl_check_hostname": "CACHEROUTE_KAFKA_SSL_CHECK_HOSTNAME",
}
"""Field (TOML key) -> environment variable. `CACHEROUTE_KAFKA_CONFIG` names the file."""

_SECRET_PROPERTY_KEYS = ("sasl.password", "ssl.key.password", "sasl.jaas.config")


class Secret:
    """A string that does not show itself: repr/str/format print `********`; `reveal()` returns it.

    Why a class and not a plain str: a Settings object is printed in logs, tracebacks and test
    failures; wrapping the value makes leaking it an explicit `reveal()` call instead of an accident.
    """

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        """The secret itself: pass it to a Kafka client, never to a log or an error message."""
        return self._value

    def __repr__(self) -> str:
        return f"Secret({REDACTED!r})"

    def __str__(self) -> str:
        return REDACTED

    def __format__(self, spec: str) -> str:
        return REDACTED

    def __bool__(self) -> bool:
        return bool(self._value)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Secret):
            return NotImplemented
        return hmac.compare_digest(self._value.encode(), other._value.encode())

    def __hash__(self) -> int:
        return hash((Secret, self._value))


def _secret(value: str | Secret | None) -> Secret | None:
    if value is None or isinstance(value, Secret):
        return value
    return Secret(value)


@dataclass(frozen=True)
class KafkaSecurity:
    """The security part of a Kafka connection (the address is `Settings.bootstrap`)."""

    protocol: str = "PLAINTEXT"
    """PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL (env CACHEROUTE_KAFKA_SECURITY_PROTOCOL)."""
    mechanism: str | None = None
    """SASL mechanism: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 (the default when SASL is on)."""
    username: str | None = None
    password: Secret | None = None
    ssl_ca_file: Path | None = None
    """PEM file of the CA(s) that signed the brokers' certificates (None: the system's CAs)."""
    ssl_cert_file: Path | None = None
    """PEM client certificate (chain), for brokers that require TLS client authentication."""
    ssl_key_file: Path | None = None
    ssl_key_password: Secret | None = None
    ssl_check_hostname: bool = True
    """Check that the broker's certificate names the host we connect to. Turn off only for test
    clusters whose certificates do not carry their addresses."""
    source: str = field(default="defaults", compare=False)
    """Where the values came from (a file, the environment): error messages point there."""

    # ------------------------------------------------------------------------------ queries
    @property
    def uses_sasl(self) -> bool:
        """Whether the protocol authenticates with SASL."""
        return self.protocol.startswith("SASL_")

    @property
    def uses_tls(self) -> bool:
        """Whether the protocol encrypts with TLS."""
        return self.protocol in ("SSL", "SASL_SSL")

    @property
    def effective_mechanism(self) -> str | None:
        """The SASL mechanism in use (None without SASL)."""
        if not self.uses_sasl:
            return None
        return self.mechanism or DEFAULT_MECHANISM

    @property
    def principal(self) -> str | None:
        """The Kafka principal this connection authenticates as (`User:<name>`), when known."""
        if self.uses_sasl and self.username:
            return f"User:{self.username}"
        return None

    def validate(self) -> None:
        """Reject combinations that cannot work, naming the variable or file to fix."""
        where = f" (from {self.source})" if self.source != "defaults" else ""
        if self.protocol not in PROTOCOLS:
            raise ConfigError(
                f"{ENV_VARS['security_protocol']}={self.protocol!r}{where} is not one of "
                f"{', '.join(PROTOCOLS)}"
            )
        if self.mechanism is not None and self.mechanism not in MECHANISMS:
            raise ConfigError(
                f"SASL mechanism {self.mechanism!r}{where} is not supported; use one of "
                f"{', '.join(MECHANISMS)} ({ENV_VARS['sasl_mechanism']})"
            )
        if self.uses_sasl and (not self.username or not self.password):
            raise ConfigError(
                f"security protocol {self.protocol}{where} needs a username and a password: set "
                f"{ENV_VARS['username']} and {ENV_VARS['password']} (or "
                f"{ENV_VARS['password_file']}), or sasl.jaas.config in the --kafka-config file"
            )
        if self.uses_tls:
            files = {
                "ssl_ca_file": self.ssl_ca_file,
                "ssl_cert_file": self.ssl_cert_file,
                "ssl_key_file": self.ssl_key_file,
            }
            for name, path in files.items():
                if path is not None and not path.is_file():
                    raise ConfigError(f"{ENV_VARS[name]}: {path}{where} is not a readable file")
            if (self.ssl_cert_file is None) != (self.ssl_key_file is None):
                raise ConfigError(
                    f"TLS client authentication needs both {ENV_VARS['ssl_cert_file']} and "
                    f"{ENV_VARS['ssl_key_file']}{where}"
                )

    # ----------------------------------------------------------------------------- clients
    def client_config(self) -> dict[str, Any]:
        """The librdkafka (confluent-kafka) properties of this connection; {} for PLAINTEXT.

        The result holds secrets: hand it to a client, never to a log.
        """
        if self.protocol == "PLAINTEXT":
            return {}
        config: dict[str, Any] = {"security.protocol": self.protocol}
        if self.uses_sasl:
            config["sasl.mechanism"] = self.effective_mechanism
            config["sasl.username"] = self.username or ""
            config["sasl.password"] = self.password.reveal() if self.password else ""
        if self.uses_tls:
            if self.ssl_ca_file is not None:
                config["ssl.ca.location"] = str(self.ssl_ca_file)
            if self.ssl_cert_file is not None:
                config["ssl.certificate.location"] = str(self.ssl_cert_file)
            if self.ssl_key_file is not None:
                config["ssl.key.location"] = str(self.ssl_key_file)
            if self.ssl_key_password is not None:
                config["ssl.key.password"] = self.ssl_key_password.reveal()
            config["ssl.endpoint.identification.algorithm"] = (
                "https" if self.ssl_check_hostname else "none"
            )
        return config

    def ssl_context(self) -> ssl.SSLContext | None:
        """A client TLS context for Python clients (aiokafka under Faust); None without TLS."""
        if not self.uses_tls:
            return None
        try:
            ctx = ssl.create_default_context(
                ssl.Purpose.SERVER_AUTH,
                cafile=str(self.ssl_ca_file) if self.ssl_ca_file else None,
            )
            ctx.check_hostname = self.ssl_check_hostname
            if self.ssl_cert_file is not None:
                ctx.load_cert_chain(
                    str(self.ssl_cert_file),
                    str(self.ssl_key_file) if self.ssl_key_file else None,
                    password=self.ssl_key_password.reveal() if self.ssl_key_password else None,
                )
        except (OSError, ssl.SSLError) as exc:
            # The message of SSLError names the OpenSSL reason, never the key password.
            raise ConfigError(
                f"cannot load the TLS files of the Kafka connection (CA {self.ssl_ca_file}, "
                f"certificate {self.ssl_cert_file}, key {self.ssl_key_file}): "
                f"{type(exc).__name__}: {exc}"
            ) from None
        return ctx

    def faust_credentials(self) -> Any:
        """`broker_credentials` for `faust.App`: None, `SSLCredentials` or `SASLCredentials`."""
        if self.protocol == "PLAINTEXT":
            return None
        import faust  # noqa: PLC0415 - faust is heavy; only the streams worker needs it

        ctx = self.ssl_context()
        if not self.uses_sasl:
            return faust.SSLCredentials(ctx)
        return faust.SASLCredentials(
            username=self.username,
            password=self.password.reveal() if self.password else None,
            ssl_context=ctx,
            mechanism=self.effective_mechanism,
        )

    # ------------------------------------------------------------------------------ output
    def describe(self) -> dict[str, Any]:
        """A JSON-safe summary for status output and doctor: which secrets are set, not what."""
        out: dict[str, Any] = {"protocol": self.protocol, "source": self.source}
        if self.uses_sasl:
            out["sasl_mechanism"] = self.effective_mechanism
            out["username"] = self.username
            out["password"] = REDACTED if self.password else None
        if self.uses_tls:
            out["ssl_ca_file"] = str(self.ssl_ca_file) if self.ssl_ca_file else None
            out["ssl_cert_file"] = str(self.ssl_cert_file) if self.ssl_cert_file else None
            out["ssl_check_hostname"] = self.ssl_check_hostname
        return out

    def to_properties(self, bootstrap: str) -> str:
        """A Kafka client properties file for this connection, readable by CacheRoute
        (`--kafka-config`) and by Kafka's own tools (`--command-config`, `--producer.config`).

        It holds the password: write it with mode 0600.
        """
        lines = [f"bootstrap.servers={bootstrap}", f"security.protocol={self.protocol}"]
        if self.uses_sasl:
            mechanism = self.effective_mechanism or DEFAULT_MECHANISM
            module = (
                "org.apache.kafka.common.security.plain.PlainLoginModule"
                if mechanism == "PLAIN"
                else "org.apache.kafka.common.security.scram.ScramLoginModule"
            )
            password = self.password.reveal() if self.password else ""
            jaas = (
                f'{module} required username="{_jaas_escape(self.username or "")}" '
                f'password="{_jaas_escape(password)}";'
            )
            lines += [f"sasl.mechanism={mechanism}", f"sasl.jaas.config={_prop_escape(jaas)}"]
        if self.uses_tls:
            if self.ssl_ca_file is not None:
                lines += ["ssl.truststore.type=PEM", f"ssl.truststore.location={self.ssl_ca_file}"]
            if self.ssl_cert_file is not None:
                lines += [
                    f"ssl.certificate.location={self.ssl_cert_file}",
                    f"ssl.key.location={self.ssl_key_file}",
                ]
            if self.ssl_key_password is not None:
                lines.append(f"ssl.key.password={_prop_escape(self.ssl_key_password.reveal())}")
            lines.append(
                "ssl.endpoint.identification.algorithm="
                + ("https" if self.ssl_check_hostname else "")
            )
        return "\n".join(lines) + "\n"

    # ----------------------------------------------------------------------------- loading
    @classmethod
    def load(
        cls, env: Mapping[str, str] | None = None, config_file: Path | None = None
    ) -> tuple[KafkaSecurity, str | None]:
        """Defaults < `config_file` < `CACHEROUTE_KAFKA_*`; returns (security, the file's
        bootstrap.servers or None)."""
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        sources: list[str] = []
        bootstrap: str | None = None
        if config_file is not None:
            from_file, bootstrap = load_connection_file(config_file)
            values.update(from_file)
            sources.append(str(config_file))
        from_env = _values_from_env(env)
        if from_env:
            values.update(from_env)
            sources.append("CACHEROUTE_KAFKA_* environment")
        return cls.from_values(values, source=" + ".join(sources) or "defaults"), bootstrap

    @classmethod
    def from_values(cls, values: Mapping[str, Any], *, source: str = "defaults") -> KafkaSecurity:
        """Build from field-named values (TOML keys), validating them."""
        known = set(ENV_VARS) - {"password_file"}
        unknown = set(values) - known
        if unknown:
            raise ConfigError(
                f"unknown Kafka connection settings in {source}: {', '.join(sorted(unknown))} "
                f"(known: {', '.join(sorted(known))})"
            )
        protocol = str(values.get("security_protocol") or "PLAINTEXT").upper()
        mechanism = values.get("sasl_mechanism")
        security = cls(
            protocol=protocol,
            mechanism=str(mechanism).upper() if mechanism else None,
            username=values.get("username") or None,
            password=_secret(values.get("password") or None),
            ssl_ca_file=_path(values.get("ssl_ca_file")),
            ssl_cert_file=_path(values.get("ssl_cert_file")),
            ssl_key_file=_path(values.get("ssl_key_file")),
            ssl_key_password=_secret(values.get("ssl_key_password") or None),
            ssl_check_hostname=_bool(values.get("ssl_check_hostname", True), source),
            source=source,
        )
        security.validate()
        return security

    def with_changes(self, **changes: Any) -> KafkaSecurity:
        """A validated copy with some fields replaced (str passwords are wrapped as Secret)."""
        for name in ("password", "ssl_key_password"):
            if name in changes:
                changes[name] = _secret(changes[name])
        security = dataclasses.replace(self, **changes)
        security.validate()
        return security


# ------------------------------------------------------------------------------- helpers
def _path(value: Any) -> Path | None:
    if value is None or value == "":
        return None
    return Path(str(value)).expanduser()


def _bool(value: Any, source: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on", "https"):
        return True
    if text in ("0", "false", "no", "off", "none", ""):
        return False
    raise ConfigError(
        f"{ENV_VARS['ssl_check_hostname']}={value!r} (from {source}) is not true or false"
    )


def _jaas_escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


def _prop_escape(value: str) -> str:
    """Escape a value for a Java properties file (what `parse_properties` and Java undo)."""
    out = value.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")
    return "\\" + out if out[:1] in (" ", "\t") else out


def _values_from_env(env: Mapping[str, str]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for name, var in ENV_VARS.items():
        raw = env.get(var)
        if raw is None or raw == "":
            continue
        if name == "password_file":
            try:
                values["password"] = Path(raw).expanduser().read_text().strip()
            except OSError as exc:
                raise ConfigError(f"{var}: cannot read {raw} ({exc.strerror})") from None
        else:
            values[name] = raw
    return values


def load_connection_file(path: Path) -> tuple[dict[str, Any], str | None]:
    """Field-named values and the bootstrap address (or None) of a TOML or properties file."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"--kafka-config {path}: cannot read it ({exc.strerror})") from None
    base = path.parent
    if path.suffix.lower() == ".toml":
        try:
            doc = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"--kafka-config {path} is not valid TOML: {exc}") from None
        table = doc.get("kafka", doc)
        if not isinstance(table, dict):
            raise ConfigError(f"--kafka-config {path}: [kafka] must be a table")
        values = {k: v for k, v in table.items() if k != "bootstrap"}
        bootstrap = table.get("bootstrap")
        if "password_file" in values:
            pw_path = _relative(base, str(values.pop("password_file")))
            try:
                values["password"] = pw_path.read_text().strip()
            except OSError as exc:
                raise ConfigError(f"{path}: password_file {pw_path}: {exc.strerror}") from None
    else:
        values, bootstrap = _values_from_properties(parse_properties(text), path)
    for key in ("ssl_ca_file", "ssl_cert_file", "ssl_key_file"):
        if values.get(key):
            values[key] = str(_relative(base, str(values[key])))
    return values, (str(bootstrap) if bootstrap else None)


def _relative(base: Path, value: str) -> Path:
    p = Path(value).expanduser()
    return p if p.is_absolute() else base / p


def parse_properties(text: str) -> dict[str, str]:
    """Parse a Java `.properties` file: `key=value`, `key: value` or `key value`, `#`/`!`
    comments, backslash line continuations and escapes (`\\t`, `\\uXXXX`, `\\=` ...)."""
    out: dict[str, str] = {}
    logical: list[str] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.lstrip()
        if not pending and (not line or line[0] in "#!"):
            continue
        # an odd number of trailing backslashes continues the line
        trailing = len(line) - len(line.rstrip("\\"))
        if trailing % 2 == 1:
            pending += line[:-1]
            continue
        logical.append(pending + line)
        pending = ""
    if pending:
        logical.append(pending)
    for line in logical:
        key, value = _split_property(line)
        out[_unescape(key)] = _unescape(value)
    return out


def _split_property(line: str) -> tuple[str, str]:
    i = 0
    while i < len(line):
        c = line[i]
        if c == "\\":
            i += 2
            continue
        if c in "=: \t\f":
            break
        i += 1
    rest = line[i:].lstrip(" \t\f")
    if rest[:1] in ("=", ":"):
        rest = rest[1:].lstrip(" \t\f")
    return line[:i], rest


_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}


def _unescape(text: str) -> str:
    if "\\" not in text:
        return text
    out: list[str] = []
    i = 0
    while i < len(text):
        c = text[i]
        if c != "\\" or i + 1 >= len(text):
            out.append(c)
            i += 1
            continue
        nxt = text[i + 1]
        if nxt == "u" and re.fullmatch(r"[0-9a-fA-F]{4}", text[i + 2 : i + 6]):
            out.append(chr(int(text[i + 2 : i + 6], 16)))
            i += 6
            continue
        out.append(_ESCAPES.get(nxt, nxt))
        i += 2
    return "".join(out)


_JAAS_RE = re.compile(r"^\s*(?P<module>[\w.$]+)\s+(?P<flag>\w+)\s*(?P<options>.*?)\s*;?\s*$", re.S)
_JAAS_OPTION_RE = re.compile(r'([\w.-]+)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^\s;"]+))')


def parse_jaas_config(text: str) -> tuple[str, dict[str, str]]:
    """(login module class, options) of a one-entry `sasl.jaas.config` value.

    Raises ConfigError without echoing the value (it holds the password).
    """
    match = _JAAS_RE.match(text)
    if not match:
        raise ConfigError(
            'sasl.jaas.config is not `<LoginModule> required username="..." password="...";`'
        )
    options = {
        m.group(1): re.sub(r"\\(.)", r"\1", m.group(2)) if m.group(2) is not None else m.group(3)
        for m in _JAAS_OPTION_RE.finditer(match.group("options"))
    }
    return match.group("module"), options


class _Properties:
    """Properties being mapped: remembers which keys were used, to log the rest."""

    def __init__(self, props: Mapping[str, str], path: Path) -> None:
        self.props = props
        self.path = path
        self.used: set[str] = set()

    def take(self, *keys: str) -> str | None:
        for key in keys:
            if key in self.props:
                self.used.add(key)
                return self.props[key].strip()
        return None


def _values_from_properties(
    props: Mapping[str, str], path: Path
) -> tuple[dict[str, Any], str | None]:
    """Map Kafka (Java client) and librdkafka property names to our fields."""
    p = _Properties(props, path)
    bootstrap = p.take("bootstrap.servers", "metadata.broker.list")
    values: dict[str, Any] = {}
    if (protocol := p.take("security.protocol")) is not None:
        values["security_protocol"] = protocol
    values.update(_sasl_from_properties(p))
    values.update(_tls_from_properties(p))
    ignored = sorted(set(props) - p.used)
    if ignored:
        log.debug("%s: ignoring properties CacheRoute does not use: %s", path, ", ".join(ignored))
    return values, bootstrap


def _sasl_from_properties(p: _Properties) -> dict[str, Any]:
    values: dict[str, Any] = {}
    if (mechanism := p.take("sasl.mechanism", "sasl.mechanisms")) is not None:
        values["sasl_mechanism"] = mechanism
    if (username := p.take("sasl.username")) is not None:
        values["username"] = username
    if (password := p.take("sasl.password")) is not None:
        values["password"] = password
    jaas = p.take("sasl.jaas.config")
    if jaas is None:
        return values
    module, options = parse_jaas_config(jaas)
    if module.endswith("PlainLoginModule"):
        values.setdefault("sasl_mechanism", "PLAIN")
    elif not module.endswith("ScramLoginModule"):
        raise ConfigError(
            f"{p.path}: sasl.jaas.config uses {module}; CacheRoute supports PlainLoginModule "
            "and ScramLoginModule (SASL PLAIN and SCRAM)"
        )
    if "username" not in options or "password" not in options:
        raise ConfigError(f'{p.path}: sasl.jaas.config needs username="..." and password="..."')
    values["username"] = options["username"]
    values["password"] = options["password"]
    return values


def _tls_from_properties(p: _Properties) -> dict[str, Any]:
    values: dict[str, Any] = {}
    ca = p.take("ssl.ca.location")
    truststore = p.take("ssl.truststore.location")
    truststore_type = (p.take("ssl.truststore.type") or "JKS").upper()
    p.take("ssl.truststore.password")  # not needed for PEM; accepted so Java files load as is
    if ca is None and truststore is not None:
        if truststore_type != "PEM":
            raise ConfigError(
                f"{p.path}: ssl.truststore.location is a {truststore_type} store; CacheRoute's "
                "clients read PEM. Export the CA once with `keytool -exportcert -rfc -keystore "
                f"{truststore} -alias <ca alias> -file ca.pem` and set ssl.truststore.type=PEM "
                "with ssl.truststore.location=ca.pem (or ssl.ca.location=ca.pem)"
            )
        ca = truststore
    if ca is not None:
        values["ssl_ca_file"] = ca

    cert = p.take("ssl.certificate.location")
    key = p.take("ssl.key.location")
    keystore = p.take("ssl.keystore.location")
    keystore_type = (p.take("ssl.keystore.type") or "JKS").upper()
    p.take("ssl.keystore.password")
    if keystore is not None and cert is None:
        if keystore_type != "PEM":
            raise ConfigError(
                f"{p.path}: ssl.keystore.location is a {keystore_type} store; CacheRoute's "
                "clients read PEM. Convert it once (`openssl pkcs12 -in keystore.p12 -out "
                "client.pem`) and set ssl.keystore.type=PEM, or use ssl.certificate.location + "
                "ssl.key.location"
            )
        cert = key = keystore  # a PEM keystore holds the key and the certificate chain
    if cert is not None:
        values["ssl_cert_file"] = cert
    if key is not None:
        values["ssl_key_file"] = key
    if (key_password := p.take("ssl.key.password")) is not None:
        values["ssl_key_password"] = key_password
    if (algorithm := p.take("ssl.endpoint.identification.algorithm")) is not None:
        values["ssl_check_hostname"] = algorithm.lower() == "https"
    return values


def redact_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of a client config safe to print: secret values replaced by `********`."""
    return {
        k: (REDACTED if k in _SECRET_PROPERTY_KEYS or isinstance(v, Secret) else v)
        for k, v in config.items()
    }
