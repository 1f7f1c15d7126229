"""KeyTable: rows by key bytes, confirmed byte for byte, in order of first appearance."""

from __future__ import annotations

import numpy as np

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
