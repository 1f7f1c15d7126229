"""Local broker: rendered configs, jar discovery and the tarball path (with a local file:// mirror)."""

from __future__ import annotations

import hashlib
import io
import tarfile
from pathlib import Path

import pytest

from cacheroute.errors import CacheRouteError
from cacheroute.localkafka import LocalBroker, resolve_distribution
from cacheroute.localkafka.broker import kraft_uuid
from cacheroute.localkafka.config import render_log4j2, render_server_properties
from cacheroute.localkafka.distribution import extract_libs, fetch_tarball
from cacheroute.localkafka.settings import LocalBrokerSettings


def _props(text: str) -> dict[str, str]:
    return dict(
        line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#")
    )


def test_server_properties_listen_on_loopback_only(tmp_path: Path) -> None:
    props = _props(
        render_server_properties(
            host="127.0.0.1", port=19092, controller_port=19093, data_dir=tmp_path
        )
    )
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:19092,CONTROLLER://127.0.0.1:19093"
    assert props["advertised.listeners"] == "PLAINTEXT://127.0.0.1:19092"
    assert props["process.roles"] == "broker,controller"
    assert props["controller.quorum.bootstrap.servers"] == "127.0.0.1:19093"
    assert props["group.initial.rebalance.delay.ms"] == "0"
    assert props["log.dirs"] == str(tmp_path)
    for key in (
        "offsets.topic.replication.factor",
        "transaction.state.log.replication.factor",
        "transaction.state.log.min.isr",
        "share.coordinator.state.topic.replication.factor",
    ):
        assert props[key] == "1"


def test_log4j_config_writes_to_the_given_file(tmp_path: Path) -> None:
    text = render_log4j2(tmp_path / "server.log")
    assert f"appender.file.fileName = {tmp_path / 'server.log'}" in text
    assert "rootLogger.level = INFO" in text


def test_local_broker_refuses_non_loopback_addresses(tmp_path: Path) -> None:
    with pytest.raises(CacheRouteError, match="only listens on loopback"):
        LocalBroker(tmp_path, host="8.8.8.8", port=9092)


def _fake_release(tmp_path: Path, version: str) -> Path:
    """A tarball shaped like an Apache Kafka release, holding tiny stand-in jars."""
    tgz = tmp_path / version / f"kafka_2.13-{version}.tgz"
    tgz.parent.mkdir(parents=True)
    with tarfile.open(tgz, "w:gz") as tar:
        for name, data in {
            f"kafka_2.13-{version}/libs/kafka_2.13-{version}.jar": b"jar-bytes",
            f"kafka_2.13-{version}/libs/kafka-clients-{version}.jar": b"clients",
            f"kafka_2.13-{version}/bin/kafka-server-start.sh": b"#!/bin/sh",
            f"kafka_2.13-{version}/LICENSE": b"Apache-2.0",
        }.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    digest = hashlib.sha512(tgz.read_bytes()).hexdigest().upper()
    spaced = " ".join(digest[i : i + 4] for i in range(0, len(digest), 4))
    (tgz.parent / (tgz.name + ".sha512")).write_text(f"{tgz.name}: {spaced}\n")
    return tgz


def test_extract_libs_takes_only_jars(tmp_path: Path) -> None:
    tgz = _fake_release(tmp_path, "9.9.9")
    extract_libs(tgz, tmp_path / "libs")
    assert sorted(p.name for p in (tmp_path / "libs").iterdir()) == [
        "kafka-clients-9.9.9.jar",
        "kafka_2.13-9.9.9.jar",
    ]


def test_tarball_source_downloads_verifies_and_caches(tmp_path: Path) -> None:
    mirror = tmp_path / "mirror"
    _fake_release(mirror, "9.9.9")
    settings = LocalBrokerSettings.from_env(
        {},
        home=tmp_path / "home",
        kafka_version="9.9.9",
        kafka_source="tarball",
        kafka_mirror=mirror.as_uri(),
    )
    dist = resolve_distribution(settings)
    assert dist.source == "tarball"
    assert (dist.libs / "kafka_2.13-9.9.9.jar").read_bytes() == b"jar-bytes"
    again = resolve_distribution(settings)
    assert again.source == "cache"
    assert again.libs == dist.libs


def test_tarball_with_wrong_checksum_is_refused(tmp_path: Path) -> None:
    tgz = _fake_release(tmp_path / "mirror", "9.9.9")
    (tgz.parent / (tgz.name + ".sha512")).write_text(f"{tgz.name}: 00 11\n")
    with pytest.raises(CacheRouteError, match="SHA-512"):
        fetch_tarball("9.9.9", (tmp_path / "mirror").as_uri(), tmp_path / "libs")


def test_unreachable_mirror_says_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(CacheRouteError, match="KAFKA_HOME") as info:
        fetch_tarball("9.9.9", (tmp_path / "nowhere").as_uri(), tmp_path / "libs")
    assert info.value.retriable


def test_kafka_home_is_used_as_is(tmp_path: Path) -> None:
    (tmp_path / "libs").mkdir()
    (tmp_path / "libs" / "kafka_2.13-4.0.0.jar").write_bytes(b"")
    dist = resolve_distribution(LocalBrokerSettings.from_env({"KAFKA_HOME": str(tmp_path)}))
    assert (dist.version, dist.source, dist.libs) == ("4.0.0", "KAFKA_HOME", tmp_path / "libs")
    with pytest.raises(CacheRouteError, match=r"no libs/kafka_2\.13"):
        resolve_distribution(LocalBrokerSettings.from_env({"KAFKA_HOME": str(tmp_path / "empty")}))


def test_kraft_cluster_ids_never_look_like_an_option() -> None:
    ids = [kraft_uuid() for _ in range(3000)]  # about 47 would start with "-" unguarded
    assert not [i for i in ids if i.startswith("-")]
    assert all(len(i) == 22 for i in ids)
    assert len(set(ids)) == len(ids)
