"""Hypothesis strategies for `RequestBatch` records (the Avro reader and writer tests share them)."""

from __future__ import annotations

from hypothesis import strategies as st

from cacheroute.schemas import RequestBatch

INTS = st.integers(-(2**31), 2**31 - 1)
LONGS = st.integers(-(2**63), 2**63 - 1)
ASCII = st.text(alphabet=st.characters(max_codepoint=127), max_size=12)


@st.composite
def batches(draw: st.DrawFn, text: st.SearchStrategy[str], *, hashes: bool = True) -> RequestBatch:
    """Up to 30 events of any values the schema allows; optional columns null or present."""
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
        prefix_block_hashes=optional(st.lists(LONGS, max_size=4)) if hashes else None,  # type: ignore[arg-type]
    )


def zigzag(v: int) -> bytes:
    """Avro's zig-zag varint of a 64-bit long, by hand (the tests' own encoder)."""
    v = ((v << 1) ^ (v >> 63)) & ((1 << 64) - 1)
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)
