"""A `RequestBatch` written by one compiled loop: the gateway emitter's sealing step.

Why by hand: fastavro writes a batch at about 1 us an event, and the emitter's sealing thread
holds the GIL while it does, so every gateway request thread waits its share (`bench emitter`'s
`emit_ns` counts it). The record is flat columns; here the numbers go in as arrays and the keys
as one joined byte string, and the loop writes exactly fastavro's bytes (the tests compare them
on random batches).

Only the common case is written here: every key, destination and the gateway id ASCII, and no
`prefix_block_hashes`. Anything else returns None and the caller uses fastavro.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray

from cacheroute.schemas.avrojit import njit, write_long
from cacheroute.schemas.codec import codec_for
from cacheroute.schemas.records import RequestBatch

__all__ = ["encode_request_batch", "warm_up"]


@njit
def _write_strings(out: Any, pos: int, data: Any, lengths: Any) -> int:
    """An Avro array of strings (one block, then the 0 that ends it)."""
    n = lengths.shape[0]
    if n:
        pos = write_long(out, pos, n)
        start = 0
        for i in range(n):
            length = lengths[i]
            pos = write_long(out, pos, length)
            out[pos : pos + length] = data[start : start + length]
            pos += length
            start += length
    return write_long(out, pos, 0)


@njit
def _write_longs(out: Any, pos: int, values: Any) -> int:
    """An Avro array of long or int (one block, then 0)."""
    n = values.shape[0]
    if n:
        pos = write_long(out, pos, n)
        for i in range(n):
            pos = write_long(out, pos, values[i])
    return write_long(out, pos, 0)


@njit
def _write(  # noqa: PLR0917 - the columns, passed positionally to numba
    out: Any,
    header: Any,
    gateway: Any,
    seq: int,
    created: int,
    key_bytes: Any,
    key_lengths: Any,
    times: Any,
    prompts: Any,
    prefix: Any,
    has_prefix: bool,
    cached: Any,
    has_cached: bool,
    dest_bytes: Any,
    dest_lengths: Any,
    has_dests: bool,
) -> int:
    pos = header.shape[0]
    out[:pos] = header
    pos = write_long(out, pos, gateway.shape[0])
    out[pos : pos + gateway.shape[0]] = gateway
    pos += gateway.shape[0]
    pos = write_long(out, pos, seq)
    pos = write_long(out, pos, created)
    pos = _write_strings(out, pos, key_bytes, key_lengths)
    pos = _write_longs(out, pos, times)
    pos = _write_longs(out, pos, prompts)
    if has_prefix:
        out[pos] = 2  # union branch 1 (the array), zig-zag
        pos = _write_longs(out, pos + 1, prefix)
    else:
        out[pos] = 0  # branch 0: null
        pos += 1
    if has_cached:
        out[pos] = 2
        pos = _write_longs(out, pos + 1, cached)
    else:
        out[pos] = 0
        pos += 1
    if has_dests:
        out[pos] = 2
        pos = _write_strings(out, pos + 1, dest_bytes, dest_lengths)
    else:
        out[pos] = 0
        pos += 1
    out[pos] = 0  # prefix_block_hashes: null
    return pos + 1


def _ascii(texts: list[str]) -> tuple[NDArray[np.uint8], NDArray[np.int64]] | None:
    """(joined bytes, lengths) of ASCII texts; None if any is not ASCII."""
    joined = "".join(texts)
    if not joined.isascii():
        return None
    lengths = np.fromiter(map(len, texts), np.int64, len(texts))
    return np.frombuffer(joined.encode("ascii"), np.uint8), lengths


def _ints(values: list[int] | None, n: int) -> NDArray[np.int64]:
    return np.zeros(n, np.int64) if values is None else np.asarray(values, np.int64)


_NONE: tuple[NDArray[np.uint8], NDArray[np.int64]] = (
    np.zeros(0, np.uint8),
    np.zeros(0, np.int64),
)


def encode_request_batch(batch: RequestBatch) -> bytes | None:
    """`codec_for(RequestBatch).encode(batch)`, byte for byte, for a batch of ASCII text without
    block hashes; None for any other batch (encode it with fastavro). Values are not range
    checked: the emitter checked them when they were emitted."""
    if batch.prefix_block_hashes is not None or not batch.gateway_id.isascii():
        return None
    n = len(batch.keys)
    keys = _ascii(batch.keys)
    dests = _NONE if batch.destinations is None else _ascii(batch.destinations)
    if keys is None or dests is None:
        return None
    columns = (batch.event_time_ms, batch.prompt_tokens, batch.prefix_tokens, batch.cached_tokens)
    if any(c is not None and len(c) != n for c in columns) or len(dests[1]) not in (0, n):
        return None  # fastavro writes what it is given; the reader side rejects it
    try:
        numbers = [_ints(c, n) for c in columns]
    except (OverflowError, TypeError, ValueError):  # not 64-bit ints: fastavro says what
        return None
    gateway = np.frombuffer(batch.gateway_id.encode("ascii"), np.uint8)
    header = np.frombuffer(_PREFIX, np.uint8)
    size = header.shape[0] + 3 * 10 + gateway.shape[0] + 8 * 10 + 6 * 10 * n
    out = np.empty(size + keys[0].shape[0] + dests[0].shape[0], np.uint8)
    end = _write(
        out,
        header,
        gateway,
        batch.seq,
        batch.created_ms,
        keys[0],
        keys[1],
        numbers[0],
        numbers[1],
        numbers[2],
        batch.prefix_tokens is not None,
        numbers[3],
        batch.cached_tokens is not None,
        dests[0],
        dests[1],
        batch.destinations is not None,
    )
    return out[:end].tobytes()


_PREFIX = codec_for(RequestBatch).prefix


def warm_up() -> None:
    """Compile the writer now (or load it from numba's disk cache), not at the first seal."""
    encode_request_batch(RequestBatch("warm-up", 0, 1, ["k"], [1], [2], [3], [4], ["d"]))
