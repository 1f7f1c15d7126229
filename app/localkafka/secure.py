"""The secure variant of the local broker: SASL_SSL with SCRAM, ACLs, and one principal per role.

`cacheroute kafka start --secure` runs the broker the way production should run: clients connect
over TLS (a CA and a broker certificate generated here with the JDK's `keytool`, so nothing but the
Java runtime the broker needs anyway is required) and authenticate with SCRAM-SHA-512; KRaft's
`StandardAuthorizer` denies whatever no ACL allows. The SCRAM users — admin (super user), gateway,
streams, planner, and `broker` for the broker's own connections — are written into the metadata
log when it is formatted (`kafka-storage format --add-scram`, the KRaft way to bootstrap them, with
salted passwords so no clear password reaches a command line). The controller listener stays on
loopback with SASL/PLAIN for the controller principal only.

Everything lives in the broker's state folder:
  secrets.json        generated passwords (0600); the folder is secure iff this file exists
  tls/ca.pem          the CA certificate clients trust (`ssl.ca.location`)
  tls/ca.p12          the CA's key (to sign more broker certificates later)
  tls/broker.p12      the broker's key and certificate chain
  credentials/<role>.properties   client properties per role (0600): usable with `--kafka-config`
                      and with Kafka's own tools (`--command-config`)
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import secrets
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from cacheroute.errors import CacheRouteError
from cacheroute.kafkaacls import ROLES
from cacheroute.kafkasecurity import KafkaSecurity, Secret

__all__ = [
    "CLIENT_MECHANISM",
    "SecureFiles",
    "ensure_secrets",
    "ensure_tls",
    "is_secure_dir",
    "role_security",
    "scram_arguments",
    "secure_server_properties",
    "write_credentials",
]

CLIENT_MECHANISM = "SCRAM-SHA-512"
SCRAM_ITERATIONS = 8192
BROKER_USER = "broker"
CONTROLLER_USER = "controller"
_SCRAM_HASHES = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}


@dataclass(frozen=True)
class SecureFiles:
    """Where the secure broker's secrets, certificates and client files live."""

    state_dir: Path

    @property
    def secrets_file(self) -> Path:
        """Generated passwords (JSON, 0600)."""
        return self.state_dir / "secrets.json"

    @property
    def tls_dir(self) -> Path:
        """Certificates and keystores."""
        return self.state_dir / "tls"

    @property
    def ca_pem(self) -> Path:
        """The CA certificate clients trust."""
        return self.tls_dir / "ca.pem"

    @property
    def ca_store(self) -> Path:
        """The CA's key and certificate (PKCS12)."""
        return self.tls_dir / "ca.p12"

    @property
    def broker_store(self) -> Path:
        """The broker's key and certificate chain (PKCS12)."""
        return self.tls_dir / "broker.p12"

    @property
    def credentials_dir(self) -> Path:
        """One client properties file per role."""
        return self.state_dir / "credentials"

    def credentials(self, role: str) -> Path:
        """The client properties file of `role`."""
        return self.credentials_dir / f"{role}.properties"


def is_secure_dir(state_dir: Path) -> bool:
    """Whether the broker state in `state_dir` was created by `start --secure`."""
    return SecureFiles(state_dir).secrets_file.exists()


def _write_private(path: Path, text: str) -> None:
    """Write a file only its owner can read (it holds passwords)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.chmod(path, 0o600)


def ensure_secrets(files: SecureFiles) -> dict[str, Secret]:
    """The passwords of this broker: generated once, then read back (they are in its metadata)."""
    names = [*ROLES, BROKER_USER, CONTROLLER_USER, "keystore", "ca"]
    if files.secrets_file.exists():
        try:
            raw = json.loads(files.secrets_file.read_text())
        except (OSError, ValueError) as exc:
            raise CacheRouteError(
                f"{files.secrets_file} is unreadable ({exc.__class__.__name__}); the secure "
                f"broker in {files.state_dir} cannot be restarted. Stop it and delete that folder "
                "to start over (its topics are lost)"
            ) from None
        missing = [n for n in names if not isinstance(raw.get(n), str)]
        if missing:
            raise CacheRouteError(
                f"{files.secrets_file} lacks {', '.join(missing)}; delete {files.state_dir} to "
                "start the secure broker over"
            )
        return {n: Secret(raw[n]) for n in names}
    values = {n: secrets.token_urlsafe(24) for n in names}
    _write_private(files.secrets_file, json.dumps(values, indent=2) + "\n")
    return {n: Secret(v) for n, v in values.items()}


def scram_arguments(secret_map: dict[str, Secret], *, salt: bytes | None = None) -> list[str]:
    """`--add-scram` arguments of `kafka-storage format` for every SCRAM user, both mechanisms.

    The salted password is computed here (SCRAM's Hi(): PBKDF2-HMAC with the mechanism's hash), so
    the clear password never appears on the formatter's command line.
    """
    args: list[str] = []
    for user in (*ROLES, BROKER_USER):
        password = secret_map[user].reveal().encode()
        for mechanism, digest in _SCRAM_HASHES.items():
            s = salt if salt is not None else secrets.token_bytes(16)
            salted = hashlib.pbkdf2_hmac(digest, password, s, SCRAM_ITERATIONS)
            args += [
                "--add-scram",
                f"{mechanism}=[name={user},iterations={SCRAM_ITERATIONS},"
                f'salt="{base64.b64encode(s).decode()}",'
                f'saltedpassword="{base64.b64encode(salted).decode()}"]',
            ]
    return args


def _keytool(java: Path) -> Path:
    sibling = java.parent / "keytool"
    if sibling.exists():
        return sibling
    found = shutil.which("keytool")
    if found is None:
        raise CacheRouteError(
            "`keytool` (part of the Java runtime) is not found next to "
            f"{java} nor on PATH; the secure broker needs it to make its TLS certificates"
        )
    return Path(found)


def ensure_tls(
    files: SecureFiles, java: Path, secret_map: dict[str, Secret], hosts: tuple[str, ...]
) -> None:
    """Create the CA and the broker certificate (for `hosts`, plus 127.0.0.1 and localhost) once.

    keytool reads the store passwords from the environment (`-storepass:env`), never argv.
    """
    if files.broker_store.exists() and files.ca_pem.exists():
        return
    tool = _keytool(java)
    work = files.tls_dir
    if work.exists():
        shutil.rmtree(work)  # a half-made set from an interrupted start: make all of it again
    work.mkdir(parents=True)
    os.chmod(work, 0o700)
    env = {
        **os.environ,
        "CR_CA_PASS": secret_map["ca"].reveal(),
        "CR_KS_PASS": secret_map["keystore"].reveal(),
    }
    names = {"127.0.0.1", "localhost", *hosts}
    san = ",".join(
        f"IP:{h}" if h.replace(".", "").isdigit() or ":" in h else f"DNS:{h}" for h in sorted(names)
    )
    fast = ["-J-XX:TieredStopAtLevel=1", "-J-XX:+UseSerialGC"]  # ~2x faster JVM start-up
    ca = ["-keystore", str(files.ca_store), "-storetype", "PKCS12", "-storepass:env", "CR_CA_PASS"]
    ks = [
        "-keystore",
        str(files.broker_store),
        "-storetype",
        "PKCS12",
        "-storepass:env",
        "CR_KS_PASS",
    ]
    ec = ["-keyalg", "EC", "-groupname", "secp256r1", "-validity", "3650"]
    csr, crt, chain = work / "broker.csr", work / "broker.crt", work / "chain.pem"
    steps = [
        [
            "-genkeypair",
            "-alias",
            "ca",
            *ec,
            "-dname",
            "CN=cacheroute-local-ca",
            "-ext",
            "bc:c",
            *ca,
        ],
        ["-exportcert", "-rfc", "-alias", "ca", "-file", str(files.ca_pem), *ca],
        ["-genkeypair", "-alias", "broker", *ec, "-dname", "CN=localhost", *ks],
        ["-certreq", "-alias", "broker", "-file", str(csr), *ks],
        [
            "-gencert",
            "-alias",
            "ca",
            "-rfc",
            "-validity",
            "3650",
            "-infile",
            str(csr),
            "-outfile",
            str(crt),
            "-ext",
            f"SAN={san}",
            "-ext",
            "EKU=serverAuth,clientAuth",
            *ca,
        ],
        None,  # chain file
        ["-importcert", "-alias", "broker", "-noprompt", "-file", str(chain), *ks],
    ]
    for step in steps:
        if step is None:
            chain.write_text(crt.read_text() + files.ca_pem.read_text())
            continue
        proc = subprocess.run(
            [str(tool), *fast, *step],
            capture_output=True,
            text=True,
            env=env,
            check=False,
            timeout=120,
        )
        if proc.returncode != 0:
            tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-5:])
            with contextlib.suppress(OSError):
                shutil.rmtree(work)
            raise CacheRouteError(
                f"keytool {step[0]} failed making the broker's TLS files:\n{tail}"
            )
    for leftover in (csr, crt, chain):
        leftover.unlink(missing_ok=True)


def _jaas(module: str, user: str, password: Secret, *extra: str) -> str:
    opts = " ".join((f'username="{user}"', f'password="{password.reveal()}"', *extra))
    return f"org.apache.kafka.common.security.{module} required {opts};"


def secure_server_properties(
    files: SecureFiles, secret_map: dict[str, Secret], *, host: str, port: int, controller_port: int
) -> dict[str, str]:
    """The server.properties lines that make the broker SASL_SSL + SCRAM with ACLs.

    They hold passwords (JAAS, keystore): the caller writes the file with mode 0600.
    """
    controller_pw = secret_map[CONTROLLER_USER]
    broker_pw = secret_map[BROKER_USER]
    scram = _jaas("scram.ScramLoginModule", BROKER_USER, broker_pw)
    keystore_pw = secret_map["keystore"].reveal()
    return {
        "listeners": f"SASL_SSL://{host}:{port},CONTROLLER://{host}:{controller_port}",
        "advertised.listeners": f"SASL_SSL://{host}:{port}",
        "inter.broker.listener.name": "SASL_SSL",
        "listener.security.protocol.map": "CONTROLLER:SASL_PLAINTEXT,SASL_SSL:SASL_SSL",
        "sasl.enabled.mechanisms": "SCRAM-SHA-512,SCRAM-SHA-256",
        "sasl.mechanism.inter.broker.protocol": CLIENT_MECHANISM,
        "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config": scram,
        "listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config": scram,
        "sasl.mechanism.controller.protocol": "PLAIN",
        "listener.name.controller.sasl.enabled.mechanisms": "PLAIN",
        "listener.name.controller.plain.sasl.jaas.config": _jaas(
            "plain.PlainLoginModule",
            CONTROLLER_USER,
            controller_pw,
            f'user_{CONTROLLER_USER}="{controller_pw.reveal()}"',
        ),
        "ssl.keystore.type": "PKCS12",
        "ssl.keystore.location": str(files.broker_store.resolve()),
        "ssl.keystore.password": keystore_pw,
        "ssl.key.password": keystore_pw,
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(files.ca_pem.resolve()),
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "super.users": f"User:admin;User:{BROKER_USER};User:{CONTROLLER_USER}",
        "allow.everyone.if.no.acl.found": "false",
    }


def role_security(files: SecureFiles, role: str, secret_map: dict[str, Secret]) -> KafkaSecurity:
    """How `role` connects to the secure broker: SASL_SSL, SCRAM-SHA-512, trusting its CA."""
    return KafkaSecurity(
        protocol="SASL_SSL",
        mechanism=CLIENT_MECHANISM,
        username=role,
        password=secret_map[role],
        ssl_ca_file=files.ca_pem.resolve(),
        source=str(files.credentials(role)),
    )


def write_credentials(
    files: SecureFiles, bootstrap: str, secret_map: dict[str, Secret]
) -> dict[str, Path]:
    """Write one client properties file per role (0600); return role -> path."""
    out: dict[str, Path] = {}
    for role in ROLES:
        path = files.credentials(role)
        text = role_security(files, role, secret_map).to_properties(bootstrap)
        header = (
            f"# CacheRoute role `{role}` on the local secure broker (written by `cacheroute kafka "
            "start --secure`).\n# Use: cacheroute --kafka-config THIS_FILE ... or Kafka tools' "
            "--command-config. Keep it private.\n"
        )
        _write_private(path, header + text)
        out[role] = path.resolve()
    os.chmod(files.credentials_dir, 0o700)
    return out
