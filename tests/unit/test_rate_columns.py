"""The hand-written `KeyRate` encoder writes exactly what fastavro writes, for the schema it assumes."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from cacheroute.schemas import KeyRate, codec_for, load_schema
from cacheroute.schemas.rate_columns import KEY_RATE_FIELDS, encode_key_rates, from_records

LONGS = st.one_of(st.integers(-(2**63), 2**63 - 1), st.integers(-300, 300))
DOUBLES = st.floats(allow_nan=False)


def test_the_schema_is_the_one_the_encoder_writes() -> None:
    fields = load_schema("key_rate.avsc")["fields"]
    assert [
        (f["name"], tuple(f["type"]) if isinstance(f["type"], list) else f["type"]) for f in fields
    ] == list(KEY_RATE_FIELDS)


@settings(max_examples=200, deadline=None)
@given(
    st.integers(-(2**62), 2**62),
    st.integers(-(2**62), 2**62),
    st.lists(
        st.tuples(
            st.text(min_size=0, max_size=300),
            LONGS,
            DOUBLES,
            st.none() | DOUBLES,
            st.none() | DOUBLES,
            LONGS,
            LONGS,
            LONGS,
        ),
        min_size=1,
        max_size=40,
    ),
)
def test_bytes_equal_fastavro(start: int, end: int, rows: list[tuple]) -> None:  # type: ignore[type-arg]
    records = [
        KeyRate(key, start, end, count, rate, mean, cv, prompt, prefix, cached)
        for key, count, rate, mean, cv, prompt, prefix, cached in rows
    ]
    keys, values = encode_key_rates(from_records(records))
    encode = codec_for(KeyRate).encode
    assert keys == [r.key.encode() for r in records]
    assert values == [encode(r) for r in records]
    decode = codec_for(KeyRate).decode
    assert [decode(v) for v in values] == records


def test_a_hand_derived_record() -> None:
    """count 1 is zig-zag 2, -1 is 1, 64 is 0x80 0x01; a null union branch is 0x00."""
    record = KeyRate("é", 64, -1, 1, 0.5, None, 2.0, 0, 0, 0)
    _, (value,) = encode_key_rates(from_records([record]))
    body = value[len(codec_for(KeyRate).prefix) :]
    assert body == (
        b"\x04\xc3\xa9"  # string of 2 bytes
        + b"\x80\x01"  # 64
        + b"\x01"  # -1
        + b"\x02"  # 1
        + b"\x00\x00\x00\x00\x00\x00\xe0\x3f"  # 0.5
        + b"\x00"  # null
        + b"\x02"
        + b"\x00\x00\x00\x00\x00\x00\x00\x40"  # branch 1, 2.0
        + b"\x00\x00\x00"
    )
