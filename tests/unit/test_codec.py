"""Codec: every schema round-trips (binary and JSON); malformed input is a SchemaError, never a crash."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
from fastavro.schema import to_parsing_canonical_form
from hypothesis import given, settings
from hypothesis import strategies as st

from cacheroute.schemas import (
    MARKER,
    KeyRate,
    PlanChunk,
    PlanHeader,
    PlanParams,
    RequestBatch,
    RequestEvent,
    SchemaError,
    codec_for,
    decode_any,
    load_schema,
)
from cacheroute.schemas.codec import SCHEMA_FILES
from tests.strategies import ALL_RECORDS

EVENT = RequestEvent(
    key="tenant-1/conv-9",
    event_time_ms=1_764_000_000_123,
    gateway_id="gw-a",
    prompt_tokens=2048,
    prefix_tokens=1024,
    prefix_block_hashes=[1, -2, 2**62],
    destination="d3",
    cached_tokens=512,
)


def _rabin_fingerprint(data: bytes) -> bytes:
    """CRC-64-AVRO exactly as the Avro specification's reference code computes it."""
    empty = 0xC15D213AA4D7A795
    table = []
    for i in range(256):
        fp = i
        for _ in range(8):
            fp = (fp >> 1) ^ (empty & -(fp & 1))
        table.append(fp)
    fp = empty
    for byte in data:
        fp = (fp >> 8) ^ table[(fp ^ byte) & 0xFF]
    return fp.to_bytes(8, "little")


@pytest.mark.parametrize("record_type", list(SCHEMA_FILES), ids=lambda t: t.__name__)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_every_schema_round_trips(record_type: type[Any], data: st.DataObject) -> None:
    record = data.draw(ALL_RECORDS[record_type])
    codec = codec_for(record_type)
    blob = codec.encode(record)
    assert blob.startswith(MARKER + codec.fingerprint)
    assert codec.decode(blob) == record
    assert decode_any(blob) == record
    assert codec.from_json(codec.to_json(record)) == record


def test_single_object_encoding_header_follows_the_avro_spec() -> None:
    codec = codec_for(RequestEvent)
    blob = codec.encode(EVENT)
    assert blob[:2] == b"\xc3\x01"
    pcf = to_parsing_canonical_form(load_schema("request_event.avsc")).encode()
    assert blob[2:10] == _rabin_fingerprint(pcf)


def test_fingerprints_differ_between_schemas() -> None:
    prints = {codec_for(t).fingerprint for t in SCHEMA_FILES}
    assert len(prints) == len(SCHEMA_FILES)


def test_timestamps_stay_integer_milliseconds() -> None:
    decoded = codec_for(RequestEvent).decode(codec_for(RequestEvent).encode(EVENT))
    assert decoded.event_time_ms == EVENT.event_time_ms
    assert isinstance(decoded.event_time_ms, int)


def test_nested_records_decode_to_dataclasses() -> None:
    header = PlanHeader(
        version=7,
        created_ms=1,
        params=PlanParams(q_cap=2.5, warm_slots=4),
        destinations=[],
        key_count=0,
        chunk_count=0,
        checksum="",
    )
    back = codec_for(PlanHeader).decode(codec_for(PlanHeader).encode(header))
    assert isinstance(back.params, PlanParams)
    chunk = PlanChunk(
        version=7, index=0, keys=["k", "j"], replicas=[2, 1], targets=[0, 2, 1], rates=[1.5, 0.5]
    )
    back_chunk = codec_for(PlanChunk).decode(codec_for(PlanChunk).encode(chunk))
    assert back_chunk == chunk


@pytest.mark.parametrize(
    ("blob", "reason"),
    [
        (b"", "truncated record"),
        (b"\xc3", "truncated record"),
        (b"\x00" * 16, "unknown format marker 0000"),
        (b"\xc3\x01" + b"\xff" * 8 + b"\x00", "unknown schema fingerprint"),
    ],
)
def test_garbage_is_a_schema_error(blob: bytes, reason: str) -> None:
    with pytest.raises(SchemaError, match=reason):
        codec_for(RequestEvent).decode(blob)
    with pytest.raises(SchemaError, match=reason):
        decode_any(blob)


def test_every_truncation_of_a_valid_record_is_a_schema_error() -> None:
    codec = codec_for(RequestEvent)
    blob = codec.encode(EVENT)
    for cut in range(len(blob)):
        with pytest.raises(SchemaError):
            codec.decode(blob[:cut])


def test_trailing_bytes_are_rejected() -> None:
    codec = codec_for(KeyRate)
    blob = codec.encode(KeyRate("k", 0, 1000, 3, 3.0))
    with pytest.raises(SchemaError, match="1 trailing bytes"):
        codec.decode(blob + b"\x00")


def test_record_of_another_type_is_named() -> None:
    blob = codec_for(KeyRate).encode(KeyRate("k", 0, 1000, 3, 3.0))
    with pytest.raises(
        SchemaError, match=r"is a cacheroute\.KeyRate, not a cacheroute\.RequestEvent"
    ):
        codec_for(RequestEvent).decode(blob)


def test_error_names_topic_partition_offset() -> None:
    with pytest.raises(SchemaError) as info:
        codec_for(RequestEvent).decode(b"garbage!!!!!", topic="requests", partition=3, offset=42)
    assert "requests[3]@42" in str(info.value)
    assert (info.value.topic, info.value.partition, info.value.offset) == ("requests", 3, 42)
    assert info.value.retriable is False


def test_invalid_utf8_in_body_is_a_schema_error() -> None:
    codec = codec_for(RequestEvent)
    body = b"\x04\xff\xfe"  # a 2-byte "string" that is not UTF-8
    with pytest.raises(SchemaError, match="malformed body"):
        codec.decode(MARKER + codec.fingerprint + body)


@settings(max_examples=300, deadline=None)
@given(tail=st.binary(max_size=64))
def test_random_bodies_never_crash(tail: bytes) -> None:
    for record_type in SCHEMA_FILES:
        codec = codec_for(record_type)
        with contextlib.suppress(SchemaError):
            codec.decode(codec.prefix + tail)


@settings(max_examples=300, deadline=None)
@given(blob=st.binary(max_size=64))
def test_random_bytes_never_crash(blob: bytes) -> None:
    with contextlib.suppress(SchemaError):
        decode_any(blob)


def test_values_that_do_not_fit_are_schema_errors() -> None:
    codec = codec_for(RequestEvent)
    too_big = RequestEvent(key="k", event_time_ms=1, gateway_id="g", prompt_tokens=2**40)
    with pytest.raises(SchemaError, match="does not fit"):
        codec.encode(too_big)
    wrong_type = RequestEvent(key=5, event_time_ms=1, gateway_id="g", prompt_tokens=1)  # type: ignore[arg-type]
    with pytest.raises(SchemaError):
        codec.encode(wrong_type)
    with pytest.raises(SchemaError):
        codec.encode(wrong_type, validate=False)


def test_non_finite_doubles_travel_in_binary() -> None:
    codec = codec_for(KeyRate)
    rate = KeyRate("k", 0, 1000, 1, float("inf"), interarrival_mean_ms=float("-inf"))
    assert codec.decode(codec.encode(rate)) == rate
    with pytest.raises(SchemaError):
        codec.from_json(codec.to_json(rate))


def test_json_form_fills_defaults_and_validates() -> None:
    codec = codec_for(RequestEvent)
    minimal = b'{"key":"k","event_time_ms":5,"gateway_id":"g","prompt_tokens":10}'
    assert codec.from_json(minimal) == RequestEvent("k", 5, "g", 10)
    with pytest.raises(SchemaError, match="invalid JSON"):
        codec.from_json(b"{not json")
    with pytest.raises(SchemaError, match="does not fit"):
        codec.from_json(b'{"key":"k","event_time_ms":"soon","gateway_id":"g","prompt_tokens":1}')
    with pytest.raises(SchemaError, match="must be an object"):
        codec.from_json(b"[1,2]")


def test_json_form_of_nested_plan_header_fills_nested_defaults() -> None:
    codec = codec_for(PlanHeader)
    text = (
        b'{"version":1,"created_ms":2,"params":{"q_cap":3.0,"warm_slots":4},'
        b'"destinations":[{"name":"d0"}],"key_count":0,"chunk_count":0,"checksum":"x"}'
    )
    header = codec.from_json(text)
    assert header.params.imbalance_tolerance == 1.05
    assert header.destinations[0].capacity == 1.0
    assert header.expected_load == []


def test_tombstone_value_is_a_schema_error() -> None:
    with pytest.raises(SchemaError, match="tombstone"):
        codec_for(PlanHeader).decode(None, topic="plans", partition=0, offset=9)
    with pytest.raises(SchemaError, match=r"plans\[0\]@9"):
        decode_any(None, topic="plans", partition=0, offset=9)


def test_batch_expands_to_events_with_missing_values() -> None:
    batch = RequestBatch(
        gateway_id="gw",
        seq=0,
        created_ms=10,
        keys=["a", "b"],
        event_time_ms=[5, 6],
        prompt_tokens=[100, 200],
        prefix_tokens=[50, -1],
        destinations=["d1", ""],
    )
    assert codec_for(RequestBatch).decode(codec_for(RequestBatch).encode(batch)) == batch
    assert batch.events() == [
        RequestEvent("a", 5, "gw", 100, prefix_tokens=50, destination="d1"),
        RequestEvent("b", 6, "gw", 200),
    ]
    assert len(batch) == 2
