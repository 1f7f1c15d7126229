"""Key bytes -> row of a window, probed by a compiled loop: the agent's per-event key lookup.

Why not the window's dict: a batch's keys would each have to become a `str` (hashing it, then a
dict probe that compares text): about 0.2 us an event with fresh strings, the largest cost left
once the rest was vectorised. Here the reader's hash of each key's bytes (batch_scan.py) probes
an open-addressing table in numpy, and a hit is confirmed byte for byte against the key's bytes
kept in an arena, so equal hashes of different keys (by chance or chosen) cost a longer probe,
never a wrong row. Only a key new to the window becomes a `str`.

Rows are assigned in order of first appearance, the same numbering as `WindowColumns` rows: the
table holds rows 0..n-1 of the window, and the window syncs keys it added by text before it
probes (`WindowColumns.sync_table`).
"""

from __future__ import annotations

from itertools import pairwise
from typing import Any

import numpy as np
from numpy.typing import NDArray

from cacheroute.schemas.avrojit import njit
from cacheroute.schemas.batch_scan import key_hash

__all__ = ["KeyTable", "hash_keys", "warm_up"]

IntArray = NDArray[np.int64]


@njit
def _hash_ranges(buf: Any, lo: Any, hi: Any, out: Any) -> None:
    for j in range(lo.shape[0]):
        out[j] = key_hash(buf, lo[j], hi[j])


def _ranges(keys: list[bytes]) -> tuple[NDArray[np.uint8], IntArray, IntArray]:
    """(joined bytes, start, end) of each key."""
    buf = np.frombuffer(b"".join(keys), np.uint8)
    lengths = np.fromiter(map(len, keys), np.int64, len(keys))
    hi = np.cumsum(lengths)
    return buf, hi - lengths, hi


def hash_keys(keys: list[bytes]) -> NDArray[np.uint64]:
    """Each key's hash, as the reader computes it (`batch_scan.key_hash`)."""
    buf, lo, hi = _ranges(keys)
    out = np.empty(len(keys), np.uint64)
    _hash_ranges(buf, lo, hi, out)
    return out


@njit
def _probe(  # noqa: PLR0917 - the table's arrays, passed positionally to numba
    buf: Any,
    lo: Any,
    hi: Any,
    h: Any,
    sel: Any,
    slots: Any,
    arena: Any,
    offs: Any,
    n: int,
    used: int,
    insert: bool,
    rows: Any,
) -> tuple[int, int]:
    """rows[j] = the row of key sel[j] (added when new and `insert`, else -1): (n, used) after.

    A slot is (hash bits, row, arena offset, length): one cache line tells a miss, and a hit
    reads the arena once to confirm it."""
    mask = slots.shape[0] - 1
    # Touch every key's home slot, then its arena bytes, before probing: the loads of one pass
    # do not depend on each other, so the CPU overlaps their cache misses (a window's table is
    # rarely in cache when its partition's next batch comes), and the probes then hit.
    touched = 0
    for j in range(sel.shape[0]):
        touched += slots[h[sel[j]] & mask, 2]
    for j in range(sel.shape[0]):
        start = slots[h[sel[j]] & mask, 2]
        if start >= 0:
            touched += arena[start]
    if sel.shape[0]:
        rows[0] = touched  # (keeps the loads; overwritten below)
    for j in range(sel.shape[0]):
        i = sel[j]
        a, b = lo[i], hi[i]
        length = b - a
        hv = h[i]
        slot = hv & mask
        while True:
            r = slots[slot, 1]
            if r < 0:
                if insert:
                    r = n
                    n += 1
                    slots[slot, 0] = hv
                    slots[slot, 1] = r
                    slots[slot, 2] = used
                    slots[slot, 3] = length
                    offs[r] = used
                    arena[used : used + length] = buf[a:b]
                    used += length
                    offs[r + 1] = used
                rows[j] = r
                break
            if slots[slot, 0] == hv and slots[slot, 3] == length:
                start = slots[slot, 2]
                same = True
                for k in range(length):
                    if arena[start + k] != buf[a + k]:
                        same = False
                        break
                if same:
                    rows[j] = r
                    break
            slot = (slot + 1) & mask
    return n, used


def _crc32_table() -> NDArray[np.uint32]:
    """The byte table of CRC-32 (reflected polynomial 0xEDB88320), as zlib's."""
    table = np.empty(256, np.uint32)
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0xEDB88320 if c & 1 else c >> 1
        table[i] = c
    return table


_CRC32 = _crc32_table()


@njit
def _crc32_buckets(arena: Any, offs: Any, table: Any, buckets: int, out: Any) -> None:
    """out[j] = zlib.crc32(arena[offs[j]:offs[j + 1]]) % buckets."""
    for j in range(out.shape[0]):
        c = np.uint32(0xFFFFFFFF)
        for i in range(offs[j], offs[j + 1]):
            c = table[(c ^ arena[i]) & np.uint32(0xFF)] ^ (c >> np.uint32(8))
        out[j] = (c ^ np.uint32(0xFFFFFFFF)) % buckets


@njit
def _rehash(old: Any, slots: Any) -> None:
    mask = slots.shape[0] - 1
    for e in range(old.shape[0]):
        if old[e, 1] < 0:
            continue
        slot = old[e, 0] & mask
        while slots[slot, 1] >= 0:
            slot = (slot + 1) & mask
        slots[slot, :] = old[e, :]


class KeyTable:
    """The keys of one window by their bytes; row numbers in order of addition."""

    __slots__ = ("arena", "n", "offs", "slots", "used")

    def __init__(self) -> None:
        self.slots: IntArray = np.full((1024, 4), -1, np.int64)
        """Per slot: the key's hash bits, its row (-1: empty), arena offset and length."""
        self.offs: IntArray = np.zeros(257, np.int64)
        self.arena: NDArray[np.uint8] = np.zeros(4096, np.uint8)
        self.n = 0
        self.used = 0

    def _reserve(self, rows: int, nbytes: int) -> None:
        """Room for `rows` more keys of `nbytes` bytes in all (load factor kept <= 1/2)."""
        need = self.n + rows
        if need + 1 > self.offs.shape[0]:
            size = max(need, 2 * (self.offs.shape[0] - 1))
            offs = np.zeros(size + 1, np.int64)
            offs[: self.n + 1] = self.offs[: self.n + 1]
            self.offs = offs
        if self.used + nbytes > self.arena.shape[0]:
            size = max(self.used + nbytes, 2 * self.arena.shape[0])
            arena = np.zeros(size, np.uint8)
            arena[: self.used] = self.arena[: self.used]
            self.arena = arena
        if 2 * need > self.slots.shape[0]:
            size = self.slots.shape[0]
            while 2 * need > size:
                size *= 2
            old, self.slots = self.slots, np.full((size, 4), -1, np.int64)
            _rehash(old, self.slots)

    def rows(
        self,
        buf: NDArray[np.uint8],
        lo: IntArray,
        hi: IntArray,
        h: NDArray[np.uint64],
        sel: IntArray,
        *,
        insert: bool,
    ) -> IntArray:
        """Rows of the keys `sel` (byte ranges of `buf` with their hashes): new keys are added
        (with `insert`; else their row is -1). New rows are `n` before .. `n` after, in order."""
        if insert:
            self._reserve(sel.shape[0], int((hi[sel] - lo[sel]).sum()))
        out = np.empty(sel.shape[0], np.int64)
        self.n, self.used = _probe(
            buf,
            lo,
            hi,
            h.view(np.int64),
            sel,
            self.slots,
            self.arena,
            self.offs,
            self.n,
            self.used,
            insert,
            out,
        )
        return out

    def new_keys(self, first: int) -> list[str]:
        """The keys of rows `first`.. as text (what a window keeps of keys new to it)."""
        offs = self.offs[first : self.n + 1].tolist()
        blob = self.arena[offs[0] : offs[-1]].tobytes()
        base = offs[0]
        text = blob.decode()
        if len(text) == len(blob):  # ASCII (what the scanner reads): one decode, then slices
            return [text[a - base : b - base] for a, b in pairwise(offs)]
        return [blob[a - base : b - base].decode() for a, b in pairwise(offs)]

    def new_buckets(self, first: int, buckets: int) -> IntArray:
        """Of rows `first`..: `zlib.crc32(key bytes) % buckets`, the changelog bucket of each
        key (`PartitionState._bucket`), in one compiled pass instead of a call per key."""
        out = np.empty(self.n - first, np.int64)
        _crc32_buckets(self.arena, self.offs[first : self.n + 1], _CRC32, buckets, out)
        return out

    def add(self, keys: list[bytes]) -> None:
        """Add keys known to be new, by their bytes (rows `n`.. in order)."""
        if not keys:
            return
        buf, lo, hi = _ranges(keys)
        self.rows(buf, lo, hi, hash_keys(keys), np.arange(len(keys), dtype=np.int64), insert=True)


def warm_up() -> None:
    """Compile the table's loops now (or load them from numba's disk cache): a worker calls this
    at start, so its first batch does not wait for them."""
    table = KeyTable()
    table.add([b"warm-up"])
    buf, lo, hi = _ranges([b"warm-up"])
    table.rows(buf, lo, hi, hash_keys([b"warm-up"]), np.zeros(1, np.int64), insert=False)
    table.new_buckets(0, 4)
    table._reserve(2000, 0)  # a rehash
