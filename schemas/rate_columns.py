"""`KeyRate` records encoded many at a time from columns: what the streams agent emits at a close.

Why by hand: a window's close emits one `KeyRate` per key (100k+ at scale). Through fastavro
each took ~9 us (a dataclass, a dict, the writer), over a second per 100k keys with every other
partition of the worker waiting. The schema is fixed and flat, so one compiled loop writes every
record's bytes into one buffer at about 0.1 us each; the bytes are exactly fastavro's (the tests
compare them on random records, and check that the schema still has the fields, in the order and
of the types, written here).

Avro binary, per the specification: `long` is a zig-zag varint, `double` 8 bytes little-endian,
`string` a long byte length then UTF-8, a union the branch index as a long then the value.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from cacheroute.schemas.avrojit import njit, write_long
from cacheroute.schemas.codec import codec_for
from cacheroute.schemas.records import KeyRate

__all__ = ["KEY_RATE_FIELDS", "RateColumns", "encode_key_rates", "from_records", "warm_up"]

KEY_RATE_FIELDS = (
    ("key", "string"),
    ("window_start_ms", "long"),
    ("window_end_ms", "long"),
    ("count", "long"),
    ("rate", "double"),
    ("interarrival_mean_ms", ("null", "double")),
    ("interarrival_cv", ("null", "double")),
    ("prompt_tokens_sum", "long"),
    ("prefix_tokens_sum", "long"),
    ("cached_tokens_sum", "long"),
)
"""The schema this encoder writes (checked against key_rate.avsc by the tests)."""


@dataclass(frozen=True)
class RateColumns:
    """The `KeyRate`s of one closed window, as columns (keys ascending)."""

    window_start_ms: int
    window_end_ms: int
    keys: list[str]
    count: NDArray[np.int64]
    rate: NDArray[np.float64]
    mean: NDArray[np.float64]
    has_mean: NDArray[np.bool_]
    cv: NDArray[np.float64]
    has_cv: NDArray[np.bool_]
    prompt: NDArray[np.int64]
    prefix: NDArray[np.int64]
    cached: NDArray[np.int64]

    def __len__(self) -> int:
        return len(self.keys)

    def records(self) -> list[KeyRate]:
        """The same figures as `KeyRate` objects (slow: for tests and small windows)."""
        cols = [
            c.tolist()
            for c in (
                self.count,
                self.rate,
                self.mean,
                self.has_mean,
                self.cv,
                self.has_cv,
                self.prompt,
                self.prefix,
                self.cached,
            )
        ]
        return [
            KeyRate(
                key=key,
                window_start_ms=self.window_start_ms,
                window_end_ms=self.window_end_ms,
                count=count,
                rate=rate,
                interarrival_mean_ms=mean if has_mean else None,
                interarrival_cv=cv if has_cv else None,
                prompt_tokens_sum=prompt,
                prefix_tokens_sum=prefix,
                cached_tokens_sum=cached,
            )
            for key, count, rate, mean, has_mean, cv, has_cv, prompt, prefix, cached in zip(
                self.keys, *cols, strict=True
            )
        ]


@njit
def _encode(  # noqa: PLR0917 - one array per column, passed positionally to numba
    header: Any,
    key_bytes: Any,
    key_off: Any,
    start: int,
    end: int,
    count: Any,
    rate8: Any,
    mean8: Any,
    has_mean: Any,
    cv8: Any,
    has_cv: Any,
    prompt: Any,
    prefix: Any,
    cached: Any,
    out: Any,
    out_off: Any,
) -> None:
    pos = 0
    h = header.shape[0]
    for i in range(count.shape[0]):
        out_off[i] = pos
        out[pos : pos + h] = header
        pos += h
        lo, hi = key_off[i], key_off[i + 1]
        pos = write_long(out, pos, hi - lo)
        out[pos : pos + hi - lo] = key_bytes[lo:hi]
        pos += hi - lo
        pos = write_long(out, pos, start)
        pos = write_long(out, pos, end)
        pos = write_long(out, pos, count[i])
        out[pos : pos + 8] = rate8[8 * i : 8 * i + 8]
        pos += 8
        if has_mean[i]:
            out[pos] = 2  # union branch 1 ("double"), zig-zag
            out[pos + 1 : pos + 9] = mean8[8 * i : 8 * i + 8]
            pos += 9
        else:
            out[pos] = 0  # branch 0: null
            pos += 1
        if has_cv[i]:
            out[pos] = 2
            out[pos + 1 : pos + 9] = cv8[8 * i : 8 * i + 8]
            pos += 9
        else:
            out[pos] = 0
            pos += 1
        pos = write_long(out, pos, prompt[i])
        pos = write_long(out, pos, prefix[i])
        pos = write_long(out, pos, cached[i])
    out_off[count.shape[0]] = pos


def _le_bytes(values: NDArray[np.float64]) -> NDArray[np.uint8]:
    return np.ascontiguousarray(values, dtype="<f8").view(np.uint8)


def encode_key_rates(cols: RateColumns) -> tuple[list[bytes], list[bytes]]:
    """(Kafka keys, values) of every record: each value is exactly `codec_for(KeyRate).encode`
    of the same record, header included."""
    n = len(cols)
    encoded = [k.encode() for k in cols.keys]
    if not n:
        return [], []
    lengths = np.fromiter(map(len, encoded), np.int64, n)
    key_off = np.zeros(n + 1, np.int64)
    np.cumsum(lengths, out=key_off[1:])
    key_bytes = np.frombuffer(b"".join(encoded), np.uint8)
    header = np.frombuffer(codec_for(KeyRate).prefix, np.uint8)
    out = np.empty(int(key_off[-1]) + n * (header.shape[0] + 10 * 7 + 8 + 2 * 9), np.uint8)
    out_off = np.empty(n + 1, np.int64)
    _encode(
        header,
        key_bytes,
        key_off,
        cols.window_start_ms,
        cols.window_end_ms,
        np.ascontiguousarray(cols.count, np.int64),
        _le_bytes(cols.rate),
        _le_bytes(cols.mean),
        np.ascontiguousarray(cols.has_mean, np.bool_),
        _le_bytes(cols.cv),
        np.ascontiguousarray(cols.has_cv, np.bool_),
        np.ascontiguousarray(cols.prompt, np.int64),
        np.ascontiguousarray(cols.prefix, np.int64),
        np.ascontiguousarray(cols.cached, np.int64),
        out,
        out_off,
    )
    blob = out.tobytes()
    offs = out_off.tolist()
    return encoded, [blob[offs[i] : offs[i + 1]] for i in range(n)]


def from_records(records: Sequence[KeyRate]) -> RateColumns:
    """Columns of `records` of one window (for tests and tools)."""
    if not records:
        raise ValueError("no records")
    first = records[0]

    def col(name: str, dtype: Any) -> Any:
        values = [getattr(r, name) for r in records]
        return np.array([0 if v is None else v for v in values], dtype)

    return RateColumns(
        window_start_ms=first.window_start_ms,
        window_end_ms=first.window_end_ms,
        keys=[r.key for r in records],
        count=col("count", np.int64),
        rate=col("rate", np.float64),
        mean=col("interarrival_mean_ms", np.float64),
        has_mean=np.array([r.interarrival_mean_ms is not None for r in records]),
        cv=col("interarrival_cv", np.float64),
        has_cv=np.array([r.interarrival_cv is not None for r in records]),
        prompt=col("prompt_tokens_sum", np.int64),
        prefix=col("prefix_tokens_sum", np.int64),
        cached=col("cached_tokens_sum", np.int64),
    )


def warm_up() -> None:
    """Compile the encoder now (or load it from numba's disk cache): a worker calls this at
    start, so its first window close does not wait seconds for a compiler."""
    encode_key_rates(from_records([KeyRate("warm-up", 0, 1, 2, 1.0, 1.0, None, 3, 4, 5)]))
