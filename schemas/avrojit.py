"""numba for the hand-written Avro loops (batch_scan.py, batch_write.py, rate_columns.py).

`cache=True` keeps compiled loops on disk, so a new process loads them instead of compiling; each
module has a `warm_up()` that a long-running process calls at start. No fastmath: IEEE semantics.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, cast

import numba
import numpy as np

__all__ = ["njit", "read_long", "write_long"]

F = TypeVar("F", bound=Callable[..., Any])


def njit(fn: F) -> F:
    """Compile `fn` in nopython mode, cached on disk, releasing the GIL while it runs."""
    return cast(F, numba.njit(cache=True, nogil=True)(fn))


@njit
def write_long(out: Any, pos: int, value: int) -> int:
    """Write `value` (int64) as Avro's zig-zag varint at `pos`; the position after it."""
    v = np.uint64((value << 1) ^ (value >> 63))
    while v >= np.uint64(0x80):
        out[pos] = np.uint8((v & np.uint64(0x7F)) | np.uint64(0x80))
        v >>= np.uint64(7)
        pos += 1
    out[pos] = np.uint8(v)
    return pos + 1


@njit
def read_long(buf: Any, pos: int, end: int) -> tuple[Any, int, bool]:
    """(value, position after it, ok) of the zig-zag varint at `pos`, read below `end`: at most
    10 bytes, and the 10th may hold only the 64th bit (wider values are refused, not wrapped)."""
    acc = np.uint64(0)
    shift = np.uint64(0)
    for i in range(10):
        if pos >= end:
            return 0, pos, False
        b = np.uint64(buf[pos])
        pos += 1
        if i == 9 and b > np.uint64(1):  # more than 64 bits
            return 0, pos, False
        acc |= (b & np.uint64(0x7F)) << shift
        if b < np.uint64(0x80):
            value = np.int64(acc >> np.uint64(1)) ^ -np.int64(acc & np.uint64(1))
            return value, pos, True
        shift += np.uint64(7)
    return 0, pos, False
