"""The hand-written `RequestBatch` reader agrees with fastavro, or declines (None) - never differs."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from cacheroute.schemas import RequestBatch, SchemaError, codec_for, load_schema
from cacheroute.schemas.batch_scan import BATCH_FIELDS, ScannedBatch, scan_request_batch

from .batch_strategies import ASCII, batches, zigzag

CODEC = codec_for(RequestBatch)


def _type_name(t: object) -> str:
    if isinstance(t, list):
        return "|".join(_type_name(x) for x in t)
    if isinstance(t, dict):
        return f"array<{_type_name(t['items'])}>"
    return str(t)


def test_the_schema_is_the_one_the_reader_reads() -> None:
    fields = load_schema("request_batch.avsc")["fields"]
    assert [(f["name"], _type_name(f["type"])) for f in fields] == list(BATCH_FIELDS)


def _same(scanned: ScannedBatch | None, batch: RequestBatch) -> None:
    assert scanned is not None
    s = scanned
    assert (s.gateway_id, s.seq, s.created_ms) == (batch.gateway_id, batch.seq, batch.created_ms)
    assert [s.key(i) for i in range(len(s))] == batch.keys
    assert s.event_time_ms.tolist() == batch.event_time_ms
    assert s.prompt_tokens.tolist() == batch.prompt_tokens
    pairs = ((s.prefix_tokens, batch.prefix_tokens), (s.cached_tokens, batch.cached_tokens))
    for mine, theirs in pairs:
        assert (None if mine is None else mine.tolist()) == theirs
    assert s.column_lengths[:3] == tuple(
        len(c) for c in (batch.keys, batch.event_time_ms, batch.prompt_tokens)
    )
    others = (
        batch.prefix_tokens,
        batch.cached_tokens,
        batch.destinations,
        batch.prefix_block_hashes,
    )
    for got, col in zip(s.column_lengths[3:], others, strict=True):
        assert got == (-1 if col is None else len(col))


@settings(max_examples=300, deadline=None)
@given(batches(ASCII))
def test_ascii_batches_read_as_fastavro_reads_them(batch: RequestBatch) -> None:
    _same(scan_request_batch(CODEC.encode(batch)), batch)


@settings(max_examples=200, deadline=None)
@given(batches(st.text(max_size=6)))
def test_any_text_reads_the_same_or_is_declined(batch: RequestBatch) -> None:
    scanned = scan_request_batch(CODEC.encode(batch))
    if scanned is not None:
        _same(scanned, batch)
    else:  # declined only for non-ASCII text
        text = [batch.gateway_id, *batch.keys, *(batch.destinations or [])]
        assert any(not t.isascii() for t in text)


def test_columns_of_unequal_length_are_reported_or_declined() -> None:
    """Shorter than the keys: read, lengths reported (the state then declines it); longer than
    the keys: declined here. Either way the decoded path names the problem."""
    short = RequestBatch("gw", 0, 5, ["a", "b"], [1], [1, 2], [3, 4])
    scanned = scan_request_batch(CODEC.encode(short))
    assert scanned is not None
    assert scanned.column_lengths[:4] == (2, 1, 2, 2)
    long = RequestBatch("gw", 0, 5, ["a", "b"], [1, 2], [1, 2], [3, 4, 5])
    assert scan_request_batch(CODEC.encode(long)) is None


@settings(max_examples=500, deadline=None)
@given(batches(st.text(alphabet="ab/-", max_size=5)), st.randoms(use_true_random=False))
def test_damaged_bytes_are_declined_or_read_as_fastavro_reads_them(
    batch: RequestBatch, rnd: random.Random
) -> None:
    data = bytearray(CODEC.encode(batch))
    body = len(CODEC.prefix)
    how = rnd.randrange(3)
    if how == 0 and len(data) > body:
        del data[rnd.randrange(body, len(data)) :]  # truncated
    elif how == 1 and len(data) > body:
        for _ in range(rnd.randint(1, 4)):
            data[rnd.randrange(body, len(data))] = rnd.randrange(256)  # flipped bytes
    else:
        data += bytes(rnd.randrange(256) for _ in range(rnd.randint(1, 3)))  # trailing bytes
    try:
        decoded = CODEC.decode(bytes(data))
    except SchemaError:
        decoded = None
    scanned = scan_request_batch(bytes(data))
    if scanned is None:
        return
    assert decoded is not None, "read a record fastavro rejects"
    _same(scanned, decoded)


def test_other_records_are_declined() -> None:
    assert scan_request_batch(b"") is None
    assert scan_request_batch(b"\xc3\x01" + b"\x00" * 20) is None  # another fingerprint


def test_hostile_lengths_and_counts_are_declined_without_reading_out_of_bounds() -> None:
    """Lengths whose sum with the position overflows 64 bits, and counts past the buffer."""
    head = CODEC.prefix + zigzag(1) + b"g" + zigzag(0) + zigzag(1)
    for huge in (2**62, 2**63 - 1, 2**63 - 3):
        assert scan_request_batch(CODEC.prefix + zigzag(huge) + b"xx") is None  # gateway id
        assert scan_request_batch(head + zigzag(huge) + b"\x02k") is None  # keys count
        assert scan_request_batch(head + zigzag(1) + zigzag(huge) + b"k") is None  # key length
        # block count -huge (negative: followed by a byte size)
        assert scan_request_batch(head + zigzag(-huge) + zigzag(4) + b"\x02k") is None
    assert scan_request_batch(head + zigzag(-(2**63)) + b"\x00") is None
