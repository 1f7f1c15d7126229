"""Every schema through a real topic, and a garbage record that names where it sits."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import Producer
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from cacheroute.kafkaio import produce_sync, producer_config, read_partition
from cacheroute.schemas import SchemaError, codec_for, decode_any
from cacheroute.schemas.codec import SCHEMA_FILES
from cacheroute.settings import Settings
from cacheroute.topics import ensure_topics
from tests.strategies import ALL_RECORDS

pytestmark = pytest.mark.kafka


def test_every_schema_through_a_topic(settings: Settings) -> None:
    ensure_topics(settings)
    topic = settings.topics["dead_letter"]  # one partition: read back in produce order
    producer = Producer(producer_config(settings))
    sent: list[Any] = []

    @hsettings(
        max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
    )
    @given(data=st.data())
    def draw(data: st.DataObject) -> None:
        for record_type in SCHEMA_FILES:
            sent.append(data.draw(ALL_RECORDS[record_type]))

    draw()
    for record in sent:
        producer.produce(topic, codec_for(type(record)).encode(record))
    assert producer.flush(30) == 0
    received = read_partition(settings, topic)
    decoded = [
        decode_any(r.value or b"", topic=r.topic, partition=r.partition, offset=r.offset)
        for r in received
    ]
    assert decoded == sent
    assert {type(r) for r in decoded} == set(SCHEMA_FILES)


def test_garbage_on_a_topic_is_a_located_schema_error(settings: Settings) -> None:
    ensure_topics(settings)
    topic = settings.topics["plans"]
    producer = Producer(producer_config(settings))
    where = produce_sync(producer, topic, b"\x00not avro at all", key=b"header")
    (record,) = read_partition(settings, topic, start=where.offset)
    with pytest.raises(SchemaError) as info:
        decode_any(record.value or b"", topic=record.topic, partition=0, offset=record.offset)
    assert f"{topic}[0]@{where.offset}" in str(info.value)
