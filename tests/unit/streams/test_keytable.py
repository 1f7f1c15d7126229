"""KeyTable: rows by key bytes, confirmed byte for byte, in order of first appearance."""

from __future__ import annotations

import zlib

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from cacheroute.streams.keytable import KeyTable, hash_keys


def hash_key(data: bytes) -> int:
    """FNV-1a 64 written out in Python: the independent reference for the compiled hash."""
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & ((1 << 64) - 1)
    return h


def _ranges(keys: list[bytes]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    buf = np.frombuffer(b"".join(keys), np.uint8)
    lengths = np.array([len(k) for k in keys], np.int64)
    hi = np.cumsum(lengths)
    return buf, hi - lengths, hi


def test_rows_follow_first_appearance_and_repeat_for_equal_keys() -> None:
    keys = [b"b", b"a", b"b", b"", b"abc", b"a"]
    buf, lo, hi = _ranges(keys)
    h = np.array([hash_key(k) for k in keys], np.uint64)
    table = KeyTable()
    rows = table.rows(buf, lo, hi, h, np.arange(len(keys)), insert=True)
    assert rows.tolist() == [0, 1, 0, 2, 3, 1]
    assert table.new_keys(0) == ["b", "a", "", "abc"]
    again = table.rows(buf, lo, hi, h, np.array([4, 0]), insert=False)
    assert again.tolist() == [3, 0]


def test_equal_hashes_of_different_keys_never_share_a_row() -> None:
    """Every key given the same hash (a chosen collision): rows still differ by bytes."""
    keys = [f"k{i}".encode() for i in range(3000)] * 2
    buf, lo, hi = _ranges(keys)
    h = np.full(len(keys), 12345, np.uint64)
    table = KeyTable()
    rows = table.rows(buf, lo, hi, h, np.arange(len(keys)), insert=True)
    assert rows.tolist() == list(range(3000)) * 2
    unknown = _ranges([b"k3000"])
    assert table.rows(
        *unknown, np.array([12345], np.uint64), np.array([0]), insert=False
    ).tolist() == [-1]


def test_growth_keeps_every_row() -> None:
    rng = np.random.default_rng(1)
    table = KeyTable()
    seen: dict[bytes, int] = {}
    for _ in range(20):
        keys = [f"tenant-{i}/c".encode() for i in rng.integers(0, 20_000, 2000)]
        buf, lo, hi = _ranges(keys)
        h = np.array([hash_key(k) for k in keys], np.uint64)
        rows = table.rows(buf, lo, hi, h, np.arange(len(keys)), insert=True)
        for k, r in zip(keys, rows.tolist(), strict=True):
            assert seen.setdefault(k, r) == r
    assert table.n == len(seen)
    assert sorted(seen.values()) == list(range(len(seen)))


def test_keys_added_by_text_hash_as_the_reader_does() -> None:
    table = KeyTable()
    table.add([b"x", "é".encode()])
    buf, lo, hi = _ranges([b"x", "é".encode()])
    h = np.array([hash_key(b"x"), hash_key("é".encode())], np.uint64)
    assert table.rows(buf, lo, hi, h, np.array([1, 0]), insert=False).tolist() == [1, 0]
    keys = [b"", b"a", b"tenant-1/conv", "é".encode()]
    assert hash_keys(keys).tolist() == [hash_key(k) for k in keys]
    assert hash_keys([b"a"]).tolist() == [0xAF63DC4C8601EC8C]  # FNV-1a 64 of "a", published


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.text(max_size=12), min_size=1, max_size=40, unique=True),
    st.integers(0, 39),
    st.integers(1, 64),
)
def test_new_keys_and_their_buckets_are_zlibs_crc32_of_each_key(
    texts: list[str], first: int, buckets: int
) -> None:
    """The compiled CRC-32 against zlib's, and the text of new rows, ASCII or not."""
    table = KeyTable()
    table.add([t.encode() for t in texts])
    first = min(first, len(texts))
    assert table.new_keys(first) == texts[first:]
    expected = [zlib.crc32(t.encode()) % buckets for t in texts[first:]]
    assert table.new_buckets(first, buckets).tolist() == expected


def test_a_known_crc32() -> None:
    """The check value of CRC-32 (IEEE 802.3): crc32(b"123456789") = 0xCBF43926."""
    table = KeyTable()
    table.add([b"123456789"])
    assert table.new_buckets(0, 1 << 40).tolist() == [0xCBF43926]
