"""faust-streaming (aiokafka) works against our Kafka 4.x broker: group join, fetch, table changelog.

This is the compatibility check the streams layer depends on; if it fails after a Kafka upgrade,
pin CACHEROUTE_KAFKA_VERSION to the newest 3.9.x (still KRaft) and say why in the README.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import NewTopic

from cacheroute.kafkaio import producer_config, read_partition
from cacheroute.settings import Settings
from cacheroute.topics import make_admin

pytestmark = pytest.mark.kafka

APP = Path(__file__).with_name("faust_smoke_app.py")


def _create(settings: Settings, *names: str) -> None:
    admin = make_admin(settings.bootstrap)
    futures = admin.create_topics([NewTopic(n, 1, replication_factor=-1) for n in names])
    for fut in futures.values():
        fut.result(timeout=30)


def test_faust_agent_with_table_runs_on_our_broker(settings: Settings, tmp_path: Path) -> None:
    src, out = settings.topic_prefix + "faust-in", settings.topic_prefix + "faust-out"
    _create(settings, src, out)
    producer = Producer(producer_config(settings))
    words = ["a", "b", "a", "c", "a", "b"]
    for w in words:
        producer.produce(src, value=w.encode())
    assert producer.flush(30) == 0

    app_id = settings.topic_prefix.rstrip(".") + "-faust"
    proc = subprocess.run(
        [sys.executable, str(APP), settings.bootstrap, app_id, src, out, str(len(words))],
        cwd=tmp_path,  # faust writes its data dir into the working directory
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (result,) = read_partition(settings, out)
    assert result.value == b"a=3,b=2,c=1"
    changelog = read_partition(settings, f"{app_id}-counts-changelog")
    assert len(changelog) == len(words)  # one changelog write per table update
    make_admin(settings.bootstrap).delete_topics(
        [f"{app_id}-counts-changelog", f"{app_id}-__assignor-__leader"], operation_timeout=30
    )
