"""The compiled keys reader (`string_column`) gives what fastavro gives, or the same failure.

Reference: fastavro's schemaless reader of `array<string>` (an independent decoder). Inputs are
written by fastavro, plus hand-built bytes for what its writer never emits (several blocks,
multi-byte lengths chosen on purpose, a negative block count, over-wide varints, truncation).
"""

from __future__ import annotations

import io

import fastavro
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cacheroute.schemas import codec
from cacheroute.schemas.string_column import HAS_NUL, NOT_FAST, OK, join_strings, split_joined

from .batch_strategies import zigzag

SCHEMA = fastavro.parse_schema({"type": "array", "items": "string"})


def _avro(keys: list[str]) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, SCHEMA, keys)
    return out.getvalue()


def _fastavro(data: bytes) -> list[str] | None:
    try:
        keys = fastavro.schemaless_reader(io.BytesIO(data), SCHEMA)
    except Exception:
        return None
    assert isinstance(keys, list)
    return keys


def _read(data: bytes) -> tuple[list[str], int] | None:
    """What `decode_plan_chunk_columns` takes from the keys column (None: it declines)."""
    try:
        return codec._string_array(data, 0)
    except (codec._NotFastError, IndexError, UnicodeDecodeError, ValueError):
        return None


def _by_key(data: bytes) -> tuple[list[str], int] | None:
    try:
        return codec._string_array_by_key(data, 0)
    except (codec._NotFastError, IndexError, UnicodeDecodeError, ValueError):
        return None


KEYS = st.lists(st.text(max_size=90), max_size=60)  # up to ~360 UTF-8 bytes: 2-byte lengths


@settings(max_examples=300, deadline=None)
@given(KEYS)
def test_any_keys_read_back_as_fastavro_reads_them(keys: list[str]) -> None:
    data = _avro(keys)
    assert _fastavro(data) == keys
    assert _read(data) == (keys, len(data))


@settings(max_examples=300, deadline=None)
@given(KEYS, st.data())
def test_damaged_columns_are_read_as_fastavro_reads_them_or_declined(
    keys: list[str], data: st.DataObject
) -> None:
    raw = bytearray(_avro(keys))
    cut = data.draw(st.integers(0, len(raw)))
    if data.draw(st.booleans()) and raw:
        raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    damaged = bytes(raw[:cut] if data.draw(st.booleans()) else raw)
    mine = _read(damaged)
    assert mine == _by_key(damaged)  # the loop it replaces: the same keys or the same refusal
    if mine is not None:  # accepted: what fastavro reads from the same bytes
        assert _fastavro(damaged[: mine[1]]) == mine[0]


def test_several_blocks_and_wide_lengths() -> None:
    long_key = "k" * 200  # a two-byte length
    data = zigzag(2) + zigzag(1) + b"a" + zigzag(200) + long_key.encode()
    data += zigzag(1) + zigzag(3) + "é/x".encode()[:3]  # a second block; "é/" is 3 bytes
    data += zigzag(0)
    assert _read(data) == (["a", long_key, "é/"], len(data))
    assert _fastavro(data) == ["a", long_key, "é/"]


def test_empty_keys_and_an_empty_column() -> None:
    assert _read(_avro([])) == ([], 1)
    assert _read(_avro(["", "", "x", ""])) == (["", "", "x", ""], len(_avro(["", "", "x", ""])))


def test_a_key_with_a_nul_byte_is_read_key_by_key() -> None:
    keys = ["a\x00b", "c", "\x00"]
    data = _avro(keys)
    joined = np.empty(len(data), np.uint8)
    status, items, _, end = join_strings(np.frombuffer(data, np.uint8), 0, joined)
    assert (status, items, end) == (HAS_NUL, 3, len(data))
    assert _read(data) == (keys, len(data))  # the per-key loop: not split at the NULs


def test_what_the_compiled_pass_declines() -> None:
    buf = np.empty(64, np.uint8)

    def status(data: bytes) -> int:
        return int(join_strings(np.frombuffer(data, np.uint8), 0, buf)[0])

    assert status(_avro(["ab"])) == OK
    assert status(zigzag(-1) + zigzag(3) + zigzag(1) + b"a" + zigzag(0)) == NOT_FAST  # sized block
    assert status(zigzag(1) + zigzag(-2) + zigzag(0)) == NOT_FAST  # negative length
    assert status(zigzag(1) + zigzag(5) + b"ab") == NOT_FAST  # truncated key
    assert status(zigzag(2) + zigzag(1) + b"a") == NOT_FAST  # truncated column
    assert status(b"\xff" * 9 + b"\x02") == NOT_FAST  # 10th byte above the 64th bit
    assert status(b"\x80" * 10) == NOT_FAST  # no end of the varint in 10 bytes
    assert _read(zigzag(1) + zigzag(2) + b"\xc3(" + zigzag(0)) is None  # invalid UTF-8
    assert _fastavro(zigzag(1) + zigzag(2) + b"\xc3(" + zigzag(0)) is None


def test_split_joined_of_nothing_is_no_keys() -> None:
    assert split_joined(np.empty(0, np.uint8), 0, 0) == []
    assert split_joined(np.frombuffer(b"", np.uint8), 1, 0) == [""]


def test_without_numba_the_keys_are_read_key_by_key(monkeypatch: pytest.MonkeyPatch) -> None:
    keys = ["tenant/a", "b", "é"]
    data = _avro(keys)
    monkeypatch.setattr(codec, "compiled_strings", lambda: None)
    assert _read(data) == (keys, len(data))
    codec.warm_up_plan_decoding()  # a no-op without numba
