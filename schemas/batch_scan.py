"""A `RequestBatch` read straight into numpy columns, for the streams agent's hot path.

Why by hand: fastavro turns a batch into Python lists - a `str` per key, an `int` per number -
at about 0.8 us an event, more than the agent's whole aggregation, and the agent then turns the
lists back into arrays. The agent needs numbers as arrays and keys only as bytes it can hash (a
key becomes a `str` once, when it is new to a window). One compiled pass over the record gives
exactly that.

Only the common case is read here: every key and destination ASCII, every number in range, the
record well formed to its last byte. Anything else - non-ASCII text, a malformed or truncated
body, trailing bytes, an `int` outside 32 bits - returns None and the caller decodes the record
with fastavro (`codec_for(RequestBatch).decode`), which names the problem or handles the rest.
The tests check this reader against fastavro on random batches and on garbage.

Avro binary, per the specification: `long`/`int` zig-zag varints, `string` a long byte length
then the bytes, an array blocks of (count, items) ending with count 0 (a negative count is
followed by the block's byte size), a union its branch index then the value.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from cacheroute.schemas.avrojit import njit, read_long
from cacheroute.schemas.codec import codec_for
from cacheroute.schemas.records import RequestBatch

__all__ = ["BATCH_FIELDS", "ScannedBatch", "scan_request_batch"]


BATCH_FIELDS = (
    ("gateway_id", "string"),
    ("seq", "long"),
    ("created_ms", "long"),
    ("keys", "array<string>"),
    ("event_time_ms", "array<long>"),
    ("prompt_tokens", "array<int>"),
    ("prefix_tokens", "null|array<int>"),
    ("cached_tokens", "null|array<int>"),
    ("destinations", "null|array<string>"),
    ("prefix_block_hashes", "null|array<array<long>>"),
)
"""The schema this reader reads (checked against request_batch.avsc by the tests)."""


KEY_SEED = np.uint64(0xCBF29CE484222325)
"""FNV-1a's offset basis. Equal hashes are checked byte for byte, so a collision (chosen keys
included) costs only a longer probe, never a wrong count."""
_FNV_PRIME = np.uint64(0x100000001B3)


@njit
def key_hash(buf: Any, lo: int, hi: int) -> Any:
    """FNV-1a (64-bit) of the key bytes buf[lo:hi], from `KEY_SEED`: the hash every key lookup
    uses, whether the key came from a scanned record or was added by text (keytable.py)."""
    h = KEY_SEED
    for i in range(lo, hi):
        h = (h ^ np.uint64(buf[i])) * _FNV_PRIME
    return h


@njit
def _ascii_string(buf: Any, pos: int, end: int) -> tuple[int, int, bool]:
    """(start, end, ok) of an ASCII string's bytes at `pos`; not ok for other text."""
    n, pos, ok = read_long(buf, pos, end)
    if not ok or n < 0 or n > end - pos:  # (pos + n could overflow)
        return 0, 0, False
    for i in range(pos, pos + n):
        if buf[i] >= 0x80:
            return 0, 0, False
    return pos, pos + n, True


@njit
def _block(buf: Any, pos: int, end: int) -> tuple[int, int, bool]:
    """(items in the next array block, position of its first item, ok); 0 items ends the array."""
    count, pos, ok = read_long(buf, pos, end)
    if not ok:
        return 0, pos, False
    if count < 0:
        count = -count
        if count < 0:  # -2**63
            return 0, pos, False
        _, pos, ok = read_long(buf, pos, end)  # the block's byte size: not needed
        if not ok:
            return 0, pos, False
    return count, pos, True


@njit
def _ints(buf: Any, pos: int, end: int, out: Any, int32: bool) -> tuple[int, int, bool]:
    """Read an array of long (or int, range-checked) into `out`: (items, position, ok)."""
    n = 0
    while True:
        count, pos, ok = _block(buf, pos, end)
        if not ok or count > out.shape[0] - n:
            return n, pos, False
        if count == 0:
            return n, pos, True
        for _ in range(count):
            v, pos, ok = read_long(buf, pos, end)
            if not ok or (int32 and (v < -2147483648 or v > 2147483647)):
                return n, pos, False
            out[n] = v
            n += 1


@njit
def _skip_long_array(buf: Any, pos: int, end: int) -> tuple[int, bool]:
    """Skip an array of long: (position after it, ok)."""
    while True:
        count, pos, ok = _block(buf, pos, end)
        if not ok or count == 0:
            return pos, ok
        for _ in range(count):
            _, pos, ok = read_long(buf, pos, end)
            if not ok:
                return pos, False


@njit
def _skip_array(buf: Any, pos: int, end: int, strings: bool) -> tuple[int, int, bool]:
    """Skip an array of ASCII strings (`strings`) or of arrays of long: (items, position, ok)."""
    n = 0
    while True:
        count, pos, ok = _block(buf, pos, end)
        if not ok:
            return n, pos, False
        if count == 0:
            return n, pos, True
        for _ in range(count):
            if strings:
                _, pos, ok = _ascii_string(buf, pos, end)
            else:
                pos, ok = _skip_long_array(buf, pos, end)
            if not ok:
                return n, pos, False
            n += 1


@njit
def _count_keys(buf: Any, pos: int) -> int:
    """How many keys the record holds (-1: malformed before the end of its key array)."""
    end = buf.shape[0]
    _, pos, ok = _ascii_string(buf, pos, end)
    if not ok:
        return -1
    for _ in range(2):  # seq, created_ms
        _, pos, ok = read_long(buf, pos, end)
        if not ok:
            return -1
    n, _, ok = _skip_array(buf, pos, end, True)
    return n if ok else -1


@njit
def _scan(  # noqa: PLR0911, PLR0912, PLR0917 - one compiled pass, a bail-out per malformation
    buf: Any,
    pos: int,
    head: Any,
    key_lo: Any,
    key_hi: Any,
    hashes: Any,
    times: Any,
    prompts: Any,
    prefix: Any,
    cached: Any,
    lengths: Any,
) -> bool:
    """Fill the columns; head = (gateway lo, gateway hi, seq, created_ms); lengths = items per
    column (keys, times, prompts, prefix, cached, destinations, hashes; -1 for a null)."""
    end = buf.shape[0]
    lo, hi, ok = _ascii_string(buf, pos, end)
    if not ok:
        return False
    pos = hi
    head[0] = lo
    head[1] = hi
    seq, pos, ok = read_long(buf, pos, end)
    if not ok:
        return False
    created, pos, ok = read_long(buf, pos, end)
    if not ok:
        return False
    head[2] = seq
    head[3] = created
    n = 0
    while True:
        count, pos, ok = _block(buf, pos, end)
        if not ok or count > key_lo.shape[0] - n:
            return False
        if count == 0:
            break
        for _ in range(count):
            lo, hi, ok = _ascii_string(buf, pos, end)
            if not ok:
                return False
            pos = hi
            key_lo[n] = lo
            key_hi[n] = hi
            hashes[n] = key_hash(buf, lo, hi)
            n += 1
    lengths[0] = n
    m, pos, ok = _ints(buf, pos, end, times, False)
    if not ok:
        return False
    lengths[1] = m
    m, pos, ok = _ints(buf, pos, end, prompts, True)
    if not ok:
        return False
    lengths[2] = m
    for col in range(3, 7):
        branch, pos, ok = read_long(buf, pos, end)
        if not ok or branch < 0 or branch > 1:
            return False
        m = -1
        if branch == 1:
            if col == 3:
                m, pos, ok = _ints(buf, pos, end, prefix, True)
            elif col == 4:
                m, pos, ok = _ints(buf, pos, end, cached, True)
            elif col == 5:
                m, pos, ok = _skip_array(buf, pos, end, True)
            else:
                m, pos, ok = _skip_array(buf, pos, end, False)
            if not ok:
                return False
        lengths[col] = m
    return bool(pos == end)


@dataclass(frozen=True)
class ScannedBatch:
    """The columns of a `RequestBatch` the agent aggregates; keys as byte ranges of `buf`."""

    buf: NDArray[np.uint8]
    gateway_id: str
    seq: int
    created_ms: int
    key_lo: NDArray[np.int64]
    key_hi: NDArray[np.int64]
    key_hash: NDArray[np.uint64]
    """Per key, FNV-1a of its bytes from `KEY_SEED` (equal keys, equal hashes)."""
    event_time_ms: NDArray[np.int64]
    prompt_tokens: NDArray[np.int64]
    prefix_tokens: NDArray[np.int64] | None
    cached_tokens: NDArray[np.int64] | None
    column_lengths: tuple[int, ...]
    """Items per column in `BATCH_FIELDS` order from `keys` (-1: null); equal for a good batch."""

    def __len__(self) -> int:
        return int(self.key_lo.shape[0])

    def key(self, i: int) -> str:
        """Key `i` as text (ASCII by construction)."""
        return self.buf[self.key_lo[i] : self.key_hi[i]].tobytes().decode("ascii")


def scan_request_batch(data: bytes) -> ScannedBatch | None:
    """The batch's columns if `data` is a plain `RequestBatch` (header included) that this
    reader takes (see the module docstring); None: decode it with fastavro instead."""
    prefix = _PREFIX
    if len(data) < len(prefix) or data[: len(prefix)] != prefix:
        return None
    buf = np.frombuffer(data, np.uint8)
    cap = _count_keys(buf, len(prefix))  # columns longer than the keys are declined below
    if cap < 0:
        return None
    head = np.zeros(4, np.int64)
    lengths = np.full(7, -1, np.int64)
    key_lo = np.empty(cap, np.int64)
    key_hi = np.empty(cap, np.int64)
    hashes = np.empty(cap, np.uint64)
    times = np.empty(cap, np.int64)
    prompts = np.empty(cap, np.int64)
    prefix_col = np.empty(cap, np.int64)
    cached_col = np.empty(cap, np.int64)
    if not _scan(
        buf,
        len(prefix),
        head,
        key_lo,
        key_hi,
        hashes,
        times,
        prompts,
        prefix_col,
        cached_col,
        lengths,
    ):
        return None
    n = int(lengths[0])
    lens = tuple(int(v) for v in lengths.tolist())
    return ScannedBatch(
        buf=buf,
        gateway_id=data[int(head[0]) : int(head[1])].decode("ascii"),
        seq=int(head[2]),
        created_ms=int(head[3]),
        key_lo=key_lo[:n],
        key_hi=key_hi[:n],
        key_hash=hashes[:n],
        event_time_ms=times[: max(lens[1], 0)],
        prompt_tokens=prompts[: max(lens[2], 0)],
        prefix_tokens=None if lens[3] < 0 else prefix_col[: lens[3]],
        cached_tokens=None if lens[4] < 0 else cached_col[: lens[4]],
        column_lengths=lens,
    )


_PREFIX = codec_for(RequestBatch).prefix


def warm_up() -> None:
    """Compile the reader now (or load it from numba's disk cache), not at the first batch."""
    codec = codec_for(RequestBatch)
    scan_request_batch(codec.encode(RequestBatch("warm-up", 0, 1, ["k"], [1], [2], [3], [4])))
