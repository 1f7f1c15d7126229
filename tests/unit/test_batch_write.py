"""The hand-written `RequestBatch` writer writes fastavro's bytes, or declines (None)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from cacheroute.schemas import RequestBatch, codec_for
from cacheroute.schemas.batch_write import encode_request_batch

from .batch_strategies import ASCII, batches

CODEC = codec_for(RequestBatch)


@settings(max_examples=300, deadline=None)
@given(batches(ASCII, hashes=False))
def test_ascii_batches_are_written_as_fastavro_writes_them(batch: RequestBatch) -> None:
    assert encode_request_batch(batch) == CODEC.encode(batch)


@settings(max_examples=200, deadline=None)
@given(batches(st.text(max_size=5), hashes=True))
def test_other_batches_are_written_the_same_or_declined(batch: RequestBatch) -> None:
    written = encode_request_batch(batch)
    if written is not None:
        assert written == CODEC.encode(batch)
        assert batch.prefix_block_hashes is None
    else:
        text = [batch.gateway_id, *batch.keys, *(batch.destinations or [])]
        assert batch.prefix_block_hashes is not None or any(not t.isascii() for t in text)


def test_a_heartbeat_and_a_hand_derived_batch() -> None:
    beat = RequestBatch("g", 0, 5, [], [], [])
    assert encode_request_batch(beat) == CODEC.prefix + b"\x02g" + b"\x00" + b"\x0a" + b"\x00" * 7
    one = RequestBatch("g", 1, 2, ["k"], [3], [-1], None, [64])
    assert encode_request_batch(one) == CODEC.prefix + (
        b"\x02g\x02\x04"  # gateway "g", seq 1, created 2
        + b"\x02\x02k\x00"  # keys: a block of 1, "k", end
        + b"\x02\x06\x00"  # times: [3]
        + b"\x02\x01\x00"  # prompts: [-1]
        + b"\x00"  # prefix: null
        + b"\x02\x02\x80\x01\x00"  # cached: branch 1, [64]
        + b"\x00\x00"  # destinations, hashes: null
    )
