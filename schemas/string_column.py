"""An Avro `array<string>` read with one compiled pass and one `str.split`, for plan chunks.

Why: a gateway decodes every key of every plan version (61k keys for a 128k-key workload), and a
Python loop that reads each length varint and decodes each key's bytes costs ~170 ns a key: about
a fifth of a version's CPU in a gateway, where eight gateways on two cores queue behind each other
(`bench propagation`). Here a compiled pass walks the length varints and copies the keys' bytes
into one buffer with a NUL byte between keys; one `bytes.decode` and one `str.split("\\x00")` then
make every `str` in C.

Exactness: the result is the list the per-key loop gives, or the same failure. Joining cannot
change what decodes: UTF-8 is self-synchronising and NUL (0x00) is neither a lead nor a
continuation byte, so the joined buffer is valid exactly when every key is, and each key's text
is exactly the decoding of its bytes. A key that itself holds a NUL byte would split in two, so
the pass reports it and the caller uses the per-key loop for that column.

Avro binary, per the specification: an array is blocks of (count, items) ending with count 0 (a
negative count is followed by the block's byte size; our writer never emits it, and it is
refused here like in the loop), a string is a zig-zag `long` byte length and the bytes.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from cacheroute.schemas.avrojit import njit, read_long

__all__ = ["HAS_NUL", "NOT_FAST", "OK", "join_strings", "split_joined", "warm_up"]

OK = 0
"""The column was read; `joined[:size]` holds its keys separated by NUL bytes."""
NOT_FAST = 1
"""Not handled here (negative count or length, a varint over 64 bits, a truncated body)."""
HAS_NUL = 2
"""Well formed, but some key holds a NUL byte: read it key by key."""


@njit
def join_strings(buf: Any, pos: int, joined: Any) -> tuple[int, int, int, int]:
    """Read the `array<string>` at `pos` of `buf`, copying its items into `joined` NUL-separated.

    Returns (status, items, bytes written to `joined`, position after the array). `joined` needs
    `len(buf) - pos` bytes: every item spends at least one length byte, which becomes its
    separator (the last item's is not written).
    """
    n = buf.shape[0]
    items = 0
    size = 0
    nul = False
    while True:
        count, pos, ok = read_long(buf, pos, n)
        if not ok or count < 0:
            return NOT_FAST, items, size, pos
        if count == 0:
            return (HAS_NUL if nul else OK), items, size, pos
        for _ in range(count):
            length, pos, ok = read_long(buf, pos, n)
            if not ok or length < 0 or length > n - pos:
                return NOT_FAST, items, size, pos
            if items:
                joined[size] = 0
                size += 1
            for j in range(pos, pos + length):
                b = buf[j]
                if b == 0:
                    nul = True
                joined[size] = b
                size += 1
            pos += length
            items += 1


def split_joined(joined: Any, items: int, size: int) -> list[str]:
    """The `items` keys of `joined[:size]` (raises UnicodeDecodeError on invalid UTF-8)."""
    if items == 0:
        return []
    text: str = joined[:size].tobytes().decode()
    return text.split("\x00")


def warm_up() -> None:
    """Compile (or load from the disk cache) before the first plan arrives."""
    buf = np.frombuffer(b"\x02\x02a\x00", np.uint8)
    join_strings(buf, 0, np.empty(4, np.uint8))
