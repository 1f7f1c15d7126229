"""The hand-written `RequestBatch` writer writes fastavro's bytes, or declines (None)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from cacheroute.schemas import RequestBatch, codec_for
from cacheroute.schemas.batch_write import encode_request_batch

CODEC = codec_for(RequestBatch)
INTS = st.integers(-(2**31), 2**31 - 1)
LONGS = st.integers(-(2**63), 2**63 - 1)
ASCII = st.text(alphabet=st.characters(max_codepoint=127), max_size=12)


@st.composite
def batches(draw: st.DrawFn, text: st.SearchStrategy[str], hashes: bool) -> RequestBatch:
    n = draw(st.integers(0, 30))

    def column(values: st.SearchStrategy[object]) -> list[object]:
        return draw(st.lists(values, min_size=n, max_size=n))

    def optional(values: st.SearchStrategy[object]) -> list[object] | None:
        return None if draw(st.booleans()) else column(values)

    return RequestBatch(
        gateway_id=draw(text),
        seq=draw(LONGS),
        created_ms=draw(LONGS),
        keys=column(text),  # type: ignore[arg-type]
        event_time_ms=column(LONGS),  # type: ignore[arg-type]
        prompt_tokens=column(INTS),  # type: ignore[arg-type]
        prefix_tokens=optional(INTS),  # type: ignore[arg-type]
        cached_tokens=optional(INTS),  # type: ignore[arg-type]
        destinations=optional(text),  # type: ignore[arg-type]
        prefix_block_hashes=optional(st.lists(LONGS, max_size=3)) if hashes else None,  # type: ignore[arg-type]
    )


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
