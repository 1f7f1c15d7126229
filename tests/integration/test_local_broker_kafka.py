"""The project's own broker manager on a second, private broker: start, idempotence, restart, stop.

This starts its own broker (free loopback ports, state in a temp dir) so that stopping it cannot
disturb the broker the other tests use. It needs the jars and Java that `cacheroute kafka start`
needs; under CI they are there because .ci/run started the main broker the same way.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer

from cacheroute.errors import CacheRouteError
from cacheroute.kafkaio import produce_sync, producer_config, read_partition
from cacheroute.localkafka import LocalBroker, resolve_distribution
from cacheroute.localkafka.broker import broker_answers
from cacheroute.localkafka.settings import LocalBrokerSettings
from cacheroute.loopback import free_port_block
from cacheroute.settings import Settings
from cacheroute.topics import ensure_topics

pytestmark = pytest.mark.kafka


@pytest.fixture
def private_broker(tmp_path: Path, kafka_settings: Settings) -> Iterator[LocalBroker]:
    port = free_port_block(2)
    broker = LocalBroker(tmp_path / "broker", host="127.0.0.1", port=port, heap="384m")
    yield broker
    broker.stop(timeout=30)


def test_start_idempotent_restart_keeps_data_stop(
    private_broker: LocalBroker, kafka_settings: Settings
) -> None:
    dist = resolve_distribution(LocalBrokerSettings.from_env())
    first = private_broker.start(dist, timeout=120)
    assert not first.already_running
    assert broker_answers(private_broker.bootstrap)
    again = private_broker.start(dist, timeout=30)
    assert again.already_running
    assert again.pid == first.pid
    status = private_broker.status()
    assert (status.running, status.answering, status.pid) == (True, True, first.pid)

    settings = kafka_settings.with_overrides(bootstrap=private_broker.bootstrap)
    ensure_topics(settings)
    producer = Producer(producer_config(settings))
    sent = produce_sync(producer, settings.topics["plans"], b"survives", key=b"header")
    producer.flush(10)
    del producer

    assert private_broker.stop(timeout=60) == first.pid
    assert private_broker.pid() is None
    assert not private_broker.pid_file.exists()
    assert not broker_answers(private_broker.bootstrap, timeout=1.0)
    assert private_broker.stop() is None  # nothing of ours runs: a no-op

    second = private_broker.start(dist, timeout=120)
    assert second.pid != first.pid
    records = read_partition(settings, settings.topics["plans"])
    assert [(r.offset, r.key, r.value) for r in records] == [(sent.offset, b"header", b"survives")]


def test_stale_pid_file_is_never_signalled(tmp_path: Path) -> None:
    broker = LocalBroker(tmp_path, port=free_port_block(2))
    tmp_path.mkdir(exist_ok=True)
    broker.pid_file.write_text(f"{os.getpid()}\n")  # our own pid: alive, but not a Kafka broker
    assert broker.pid() is None
    assert broker.stop() is None
    assert not broker.pid_file.exists()


def test_port_taken_by_a_stranger_is_a_clear_error(
    tmp_path: Path, kafka_settings: Settings
) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = int(squatter.getsockname()[1])
        broker = LocalBroker(tmp_path, port=port)
        with pytest.raises(CacheRouteError, match="already in use by another process"):
            broker.start(resolve_distribution(LocalBrokerSettings.from_env()))
