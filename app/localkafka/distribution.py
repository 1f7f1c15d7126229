"""Finding the Apache Kafka broker's jars and a Java runtime to run them.

Three sources, tried in this order:
1. `KAFKA_HOME` (or `CACHEROUTE_KAFKA_HOME`): an unpacked Apache Kafka release; its `libs/` is used
   as is and nothing is downloaded.
2. The cache, `<home>/kafka/<version>/libs`, filled by an earlier fetch.
3. A fetch into that cache, from
   - Maven Central (`org.apache.kafka:kafka_2.13:<version>` with its runtime dependencies plus a
     log4j2 SLF4J binding), resolved by Maven itself so that the user's `~/.m2/settings.xml` mirrors
     and proxies apply — this is what works on machines that reach only package registries; or
   - the Apache release tarball (`<mirror>/<version>/kafka_2.13-<version>.tgz`, checked against its
     published `.sha512`), for machines with an open internet but no Maven.
   `auto` picks Maven when `mvn` is on PATH, else the tarball.
A fetch writes into a temporary folder and renames it into place, so an interrupted fetch never
leaves a half-filled cache behind.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn

from cacheroute.errors import CacheRouteError
from cacheroute.localkafka.settings import LocalBrokerSettings

__all__ = [
    "KafkaDistribution",
    "extract_libs",
    "fetch_tarball",
    "fetch_with_maven",
    "find_java",
    "resolve_distribution",
]

_DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1"
_JAR_RE = re.compile(r"^kafka_2\.13-(?P<version>[0-9][^-]*(?:-[A-Za-z0-9]+)?)\.jar$")


@dataclass(frozen=True)
class KafkaDistribution:
    """A folder of jars that runs `kafka.Kafka`, and where it came from."""

    version: str
    libs: Path
    source: str  # "KAFKA_HOME", "cache", "maven" or "tarball"

    @property
    def classpath(self) -> str:
        """Java class path covering every jar of the folder."""
        return str(self.libs / "*")


def find_java(env: dict[str, str] | None = None) -> Path:
    """The `java` executable (JAVA_HOME first, then PATH); Kafka 4 needs Java 17 or newer."""
    env = dict(os.environ) if env is None else env
    candidates: list[str | None] = []
    if env.get("JAVA_HOME"):
        candidates.append(str(Path(env["JAVA_HOME"]) / "bin" / "java"))
    candidates.append(shutil.which("java", path=env.get("PATH")))
    for cand in candidates:
        if cand and Path(cand).exists():
            major = _java_major(Path(cand))
            if major is not None and major < 17:
                raise CacheRouteError(
                    f"{cand} is Java {major}; Kafka 4 needs Java 17 or newer. "
                    "Install one (e.g. `apt-get install openjdk-17-jre-headless`) or set JAVA_HOME."
                )
            return Path(cand)
    raise CacheRouteError(
        "no Java runtime found: install Java 17+ (e.g. `apt-get install openjdk-17-jre-headless`) "
        "or set JAVA_HOME"
    )


def _java_major(java: Path) -> int | None:
    try:
        out = subprocess.run(
            [str(java), "-version"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    if not match:
        return None
    major = int(match.group(1))
    return int(match.group(2) or 0) if major == 1 else major


def _version_of_libs(libs: Path) -> str | None:
    for jar in libs.glob("kafka_2.13-*.jar"):
        match = _JAR_RE.match(jar.name)
        if match:
            return match.group("version")
    return None


def resolve_distribution(
    settings: LocalBrokerSettings, *, console: Console | None = None
) -> KafkaDistribution:
    """Find or fetch the broker's jars as described in the module docstring."""
    console = console or Console(stderr=True)
    if settings.kafka_home is not None:
        libs = settings.kafka_home / "libs"
        version = _version_of_libs(libs) if libs.is_dir() else None
        if version is None:
            raise CacheRouteError(
                f"KAFKA_HOME={settings.kafka_home} has no libs/kafka_2.13-*.jar; point it at an "
                "unpacked Apache Kafka release, or unset it to download the jars"
            )
        return KafkaDistribution(version=version, libs=libs, source="KAFKA_HOME")

    target = settings.home / "kafka" / settings.kafka_version
    libs = target / "libs"
    if (target / ".complete").exists() and libs.is_dir():
        return KafkaDistribution(version=settings.kafka_version, libs=libs, source="cache")

    source = settings.kafka_source
    if source == "auto":
        source = "maven" if shutil.which("mvn") else "tarball"
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".fetch-", dir=target.parent) as tmp:
        staging = Path(tmp) / "libs"
        if source == "maven":
            fetch_with_maven(settings.kafka_version, staging, console=console)
        else:
            fetch_tarball(settings.kafka_version, settings.kafka_mirror, staging, console=console)
        if _version_of_libs(staging) != settings.kafka_version:
            raise CacheRouteError(
                f"fetched jars do not contain kafka_2.13-{settings.kafka_version}"
            )
        if target.exists():
            shutil.rmtree(target)
        target.mkdir(parents=True)
        staging.rename(libs)
        (target / ".complete").write_text(source + "\n")
    console.print(f"[green]Kafka {settings.kafka_version} jars ready[/] in {libs} (from {source})")
    return KafkaDistribution(version=settings.kafka_version, libs=libs, source=source)


def _run_maven(args: list[str], workdir: Path, what: str) -> None:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise CacheRouteError(
            "Maven (`mvn`) is not on PATH: install it (`apt-get install maven`), set KAFKA_HOME to an "
            "unpacked Kafka release, or use CACHEROUTE_KAFKA_SOURCE=tarball"
        )
    proc = subprocess.run(
        [mvn, "-B", "-q", *args], cwd=workdir, capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        raise CacheRouteError(f"Maven failed to {what} (exit {proc.returncode}):\n{tail}")


def fetch_with_maven(version: str, dest: Path, *, console: Console | None = None) -> None:
    """Resolve kafka_2.13:<version> + runtime deps + the log4j2 SLF4J binding into `dest`."""
    console = console or Console(stderr=True)
    dest.mkdir(parents=True, exist_ok=True)
    pom = f"""<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>cacheroute.local</groupId><artifactId>kafka-broker-jars</artifactId><version>1</version>
  <dependencies>
    <dependency>
      <groupId>org.apache.kafka</groupId><artifactId>kafka_2.13</artifactId>
      <version>{version}</version>
    </dependency>
  </dependencies>
</project>
"""
    work = dest.parent
    (work / "pom.xml").write_text(pom)
    with console.status(f"Fetching Apache Kafka {version} jars from Maven Central ..."):
        _run_maven(
            [
                f"{_DEPENDENCY_PLUGIN}:copy-dependencies",
                "-DincludeScope=runtime",
                f"-DoutputDirectory={dest}",
            ],
            work,
            f"resolve org.apache.kafka:kafka_2.13:{version}",
        )
        # Kafka ships log4j2 but leaves the SLF4J binding to the distribution; pick the one that
        # matches the SLF4J API generation it resolved, at the log4j version it resolved.
        log4j = _jar_version(dest, "log4j-core")
        slf4j = _jar_version(dest, "slf4j-api")
        if log4j and slf4j:
            binding = "log4j-slf4j2-impl" if slf4j.startswith("2.") else "log4j-slf4j-impl"
            _run_maven(
                [
                    f"{_DEPENDENCY_PLUGIN}:copy",
                    f"-Dartifact=org.apache.logging.log4j:{binding}:{log4j}",
                    f"-DoutputDirectory={dest}",
                ],
                work,
                f"resolve the log4j SLF4J binding {binding}:{log4j}",
            )


def _jar_version(libs: Path, artifact: str) -> str | None:
    pattern = re.compile(rf"^{re.escape(artifact)}-(\d[^-]*)\.jar$")
    for jar in libs.glob(f"{artifact}-*.jar"):
        match = pattern.match(jar.name)
        if match:
            return match.group(1)
    return None


def fetch_tarball(version: str, mirror: str, dest: Path, *, console: Console | None = None) -> None:
    """Download the release tarball, verify its SHA-512, and unpack its `libs/` into `dest`."""
    console = console or Console(stderr=True)
    name = f"kafka_2.13-{version}.tgz"
    url = f"{mirror.rstrip('/')}/{version}/{name}"
    work = dest.parent
    tgz = work / name
    try:
        with urllib.request.urlopen(url, timeout=60) as resp:  # noqa: S310 - http(s)/file mirror by design
            total = int(resp.headers.get("Content-Length") or 0) or None
            with (
                Progress(
                    "[progress.description]{task.description}",
                    BarColumn(),
                    DownloadColumn(),
                    TransferSpeedColumn(),
                    console=console,
                    transient=True,
                ) as progress,
                tgz.open("wb") as out,
            ):
                task = progress.add_task(f"Downloading {name}", total=total)
                while chunk := resp.read(1 << 20):
                    out.write(chunk)
                    progress.advance(task, len(chunk))
        with urllib.request.urlopen(url + ".sha512", timeout=60) as resp:  # noqa: S310
            published = resp.read().decode("ascii", "replace")
    except OSError as exc:
        raise CacheRouteError(
            f"could not download {url}: {exc}. Without internet access use Maven "
            "(CACHEROUTE_KAFKA_SOURCE=maven) or set KAFKA_HOME to an unpacked release",
            retriable=True,
        ) from exc
    digest = hashlib.sha512(tgz.read_bytes()).hexdigest()
    # Apache's .sha512 files come as `name: AB12 CD34 ...` (gpg --print-md) or `ab12... name`.
    published_hex = re.sub(r"[^0-9a-f]", "", published.split(":", 1)[-1].lower())
    if digest not in published_hex:
        raise CacheRouteError(f"SHA-512 of {name} does not match {url}.sha512; not using it")
    extract_libs(tgz, dest)


def extract_libs(tgz: Path, dest: Path) -> None:
    """Copy the `*/libs/*.jar` members of a Kafka release tarball into `dest` (nothing else)."""
    dest.mkdir(parents=True, exist_ok=True)
    found = 0
    with tarfile.open(tgz, "r:gz") as tar:
        for member in tar.getmembers():
            parts = Path(member.name).parts
            if (
                len(parts) == 3
                and parts[1] == "libs"
                and member.isfile()
                and parts[2].endswith(".jar")
            ):
                src = tar.extractfile(member)
                if src is None:
                    continue
                with src, (dest / parts[2]).open("wb") as out:
                    shutil.copyfileobj(src, out)
                found += 1
    if found == 0:
        raise CacheRouteError(f"{tgz.name} has no libs/*.jar: not an Apache Kafka release tarball")
