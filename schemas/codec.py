"""Encoding and decoding of CacheRoute records: Avro single-object encoding, plus a JSON form.

Wire format (Avro specification, "Single object encoding"): two marker bytes `C3 01`, the 8-byte
little-endian CRC-64-AVRO fingerprint of the writer schema's Parsing Canonical Form, then the
schemaless Avro binary body. Why this rather than a bare format byte or the Confluent wire format:
it needs no schema registry (the Confluent format carries a registry id), it is a standard that
Java's `BinaryMessageDecoder` and other Avro libraries read, and the fingerprint tells a decoder
*which* schema wrote the bytes, so a record sent to the wrong topic or written by an unknown schema
version fails with a clear `SchemaError` instead of decoding into nonsense.

This is the only module that imports fastavro and orjson. Schemas are read from the `.avsc` files
next to this module and parsed once per process.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from functools import cache
from importlib import resources
from types import ModuleType
from typing import Any, Generic, TypeVar, cast

import fastavro
import fastavro.validation
import numpy as np
import orjson
from fastavro.schema import fingerprint, to_parsing_canonical_form

from cacheroute.schemas.convert import from_dict, to_dict
from cacheroute.schemas.errors import SchemaError
from cacheroute.schemas.gc_tracking import untrack_strings
from cacheroute.schemas.records import (
    KeyRate,
    PlanChunk,
    PlanHeader,
    RequestBatch,
    RequestEvent,
    RequestSummary,
)

__all__ = [
    "MARKER",
    "SCHEMA_FILES",
    "PlanChunkColumns",
    "RecordCodec",
    "codec_for",
    "compiled_strings",
    "decode_any",
    "decode_plan_chunk_columns",
    "dump_columns",
    "dump_json",
    "load_json",
    "load_schema",
    "warm_up_plan_decoding",
]

R = TypeVar("R")

AnyRecord = RequestEvent | KeyRate | PlanHeader | PlanChunk | RequestBatch | RequestSummary
"""Any top-level CacheRoute record."""

MARKER = b"\xc3\x01"
"""Avro single-object encoding marker."""
_HEADER_LEN = len(MARKER) + 8

SCHEMA_FILES: dict[type[Any], str] = {
    RequestEvent: "request_event.avsc",
    KeyRate: "key_rate.avsc",
    PlanHeader: "plan_header.avsc",
    PlanChunk: "plan_chunk.avsc",
    RequestBatch: "request_batch.avsc",
    RequestSummary: "request_summary.avsc",
}
"""Top-level record types and the schema file that defines each."""


def dump_json(value: Any) -> bytes:
    """Compact JSON (orjson) for internal state such as stream-table values."""
    return orjson.dumps(value)


def dump_columns(value: Any) -> bytes:
    """Compact JSON whose values may include numpy arrays (written as lists), for columnar state."""
    return orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY)


def load_json(data: bytes | bytearray | memoryview | str) -> Any:
    """Parse JSON written by `dump_json`; malformed input is a SchemaError."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise SchemaError(f"invalid JSON: {exc}") from exc


@cache
def load_schema(filename: str) -> dict[str, Any]:
    """The JSON schema as written in the `.avsc` file (docs and logical types included)."""
    text = resources.files("cacheroute.schemas").joinpath(filename).read_bytes()
    schema = orjson.loads(text)
    if not isinstance(schema, dict):
        raise SchemaError(f"{filename} is not an Avro record schema")
    return schema


def _strip_logical_types(node: Any) -> Any:
    """Copy of a schema without `logicalType` annotations.

    Timestamps travel as Avro `long` (timestamp-millis); the codebase works in integer ms, and letting
    fastavro turn them into `datetime` objects and back would cost time on the request path for
    nothing. The annotation stays in the `.avsc` file for other readers; it does not change the bytes
    or the fingerprint (the Parsing Canonical Form drops it).
    """
    if isinstance(node, dict):
        return {k: _strip_logical_types(v) for k, v in node.items() if k != "logicalType"}
    if isinstance(node, list):
        return [_strip_logical_types(v) for v in node]
    return node


@dataclass(frozen=True)
class RecordCodec(Generic[R]):
    """Encoder/decoder for one record type; get one with `codec_for(RecordType)`."""

    record_type: type[R]
    name: str
    parsed: Any
    fingerprint: bytes

    @property
    def prefix(self) -> bytes:
        """The 10 bytes every encoded record of this type starts with."""
        return MARKER + self.fingerprint

    def encode(self, record: R, *, validate: bool = True) -> bytes:
        """Single-object encoding of `record`; a value that does not fit the schema is a SchemaError.

        fastavro's writer alone does not range-check: it would write 2**40 into an Avro `int`, which
        Java readers then reject. `validate=False` skips that check for hot paths whose values are
        already known to fit (it roughly halves the cost); type errors are still caught.
        """
        value = to_dict(record)
        if validate:
            try:
                fastavro.validation.validate(value, self.parsed, raise_errors=True)
            except Exception as exc:
                raise SchemaError(
                    f"value does not fit the schema: {exc}", schema=self.name
                ) from exc
        buf = io.BytesIO()
        buf.write(MARKER)
        buf.write(self.fingerprint)
        try:
            fastavro.schemaless_writer(buf, self.parsed, value)
        except Exception as exc:  # fastavro raises ValueError/TypeError/OverflowError/...
            raise SchemaError(f"value does not fit the schema: {exc}", schema=self.name) from exc
        return buf.getvalue()

    def decode(
        self,
        data: bytes | bytearray | memoryview | None,
        *,
        topic: str | None = None,
        partition: int | None = None,
        offset: int | None = None,
    ) -> R:
        """Decode bytes written by `encode`. Anything else raises SchemaError naming its location."""

        def fail(reason: str) -> SchemaError:
            return SchemaError(
                reason, schema=self.name, topic=topic, partition=partition, offset=offset
            )

        if data is None:
            raise fail("no value (a tombstone or an empty message)")
        if len(data) < _HEADER_LEN:
            raise fail(f"truncated record: {len(data)} bytes, the header alone is {_HEADER_LEN}")
        if data[:2] != MARKER:
            raise fail(f"unknown format marker {bytes(data[:2]).hex()} (expected c301)")
        if data[2:_HEADER_LEN] != self.fingerprint:
            other = _by_fingerprint().get(bytes(data[2:_HEADER_LEN]))
            if other is not None:
                raise fail(f"record is a {other.name}, not a {self.name}")
            raise fail(f"unknown schema fingerprint {bytes(data[2:_HEADER_LEN]).hex()}")
        return self._decode_body(data, fail)

    def _decode_body(self, data: bytes | bytearray | memoryview, fail: Any) -> R:
        buf = io.BytesIO(data)
        buf.seek(_HEADER_LEN)
        try:
            value = fastavro.schemaless_reader(buf, self.parsed, None)
        except EOFError as exc:
            raise fail(f"truncated record ({str(exc) or 'ran out of bytes'})") from exc
        except Exception as exc:  # garbage: bad union index, invalid UTF-8, overflow, ...
            raise fail(f"malformed body: {type(exc).__name__}: {exc}") from exc
        if buf.tell() != len(data):
            raise fail(f"{len(data) - buf.tell()} trailing bytes after the record")
        if not isinstance(value, dict):
            raise fail("body is not a record")
        return from_dict(self.record_type, value)

    def to_json(self, record: R) -> bytes:
        """The record as compact JSON (field names as in the schema, optional fields as null).

        JSON has no Infinity or NaN: such doubles come out as null, and `from_json` then rejects
        them. The binary form carries them exactly.
        """
        return orjson.dumps(to_dict(record))

    def from_json(self, data: bytes | str) -> R:
        """Parse and validate the JSON form; missing optional fields take their schema defaults."""
        try:
            value = orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            raise SchemaError(f"invalid JSON: {exc}", schema=self.name) from exc
        if not isinstance(value, dict):
            raise SchemaError("JSON form must be an object", schema=self.name)
        value = _fill_defaults(self.parsed, value)
        try:
            fastavro.validation.validate(value, self.parsed, raise_errors=True)
        except Exception as exc:
            raise SchemaError(f"JSON does not fit the schema: {exc}", schema=self.name) from exc
        return from_dict(self.record_type, value)


def _fill_defaults(schema: Any, value: dict[str, Any]) -> dict[str, Any]:
    """Add schema defaults for absent fields of a record (and of nested records)."""
    out = dict(value)
    for f in schema.get("fields", []):
        name = f["name"]
        if name not in out:
            if "default" in f:
                out[name] = f["default"]
            continue
        ftype = f["type"]
        if (
            isinstance(ftype, dict)
            and ftype.get("type") == "record"
            and isinstance(out[name], dict)
        ):
            out[name] = _fill_defaults(ftype, out[name])
        elif (
            isinstance(ftype, dict)
            and ftype.get("type") == "array"
            and isinstance(ftype.get("items"), dict)
            and ftype["items"].get("type") == "record"
            and isinstance(out[name], list)
        ):
            out[name] = [
                _fill_defaults(ftype["items"], x) if isinstance(x, dict) else x for x in out[name]
            ]
    return out


_CODECS: dict[type[Any], RecordCodec[Any]] = {}
"""Codecs built so far: each schema is parsed once per process (a memo, not configuration)."""


def codec_for(record_type: type[R]) -> RecordCodec[R]:
    """The (cached) codec of a top-level record type such as `RequestEvent`."""
    cached = _CODECS.get(record_type)
    if cached is not None:
        return cast(RecordCodec[R], cached)
    try:
        filename = SCHEMA_FILES[record_type]
    except KeyError:
        raise SchemaError(f"{record_type.__name__} is not a top-level CacheRoute record") from None
    raw = load_schema(filename)
    parsed = fastavro.parse_schema(_strip_logical_types(raw))
    pcf = to_parsing_canonical_form(raw)
    fp = bytes.fromhex(fingerprint(pcf, "CRC-64-AVRO"))
    name = f"{raw.get('namespace', '')}.{raw['name']}".lstrip(".")
    codec = RecordCodec(record_type=record_type, name=name, parsed=parsed, fingerprint=fp)
    _CODECS[record_type] = codec
    return codec


@cache
def _by_fingerprint() -> dict[bytes, RecordCodec[Any]]:
    return {c.fingerprint: c for c in (codec_for(t) for t in SCHEMA_FILES)}


def decode_any(
    data: bytes | bytearray | memoryview | None,
    *,
    topic: str | None = None,
    partition: int | None = None,
    offset: int | None = None,
) -> AnyRecord:
    """Decode a record of any CacheRoute type, chosen by the fingerprint in its header.

    Used where one topic carries several record types (plan headers and chunks) and by tools that
    inspect topics.
    """
    if data is None:
        raise SchemaError(
            "no value (a tombstone or an empty message)",
            topic=topic,
            partition=partition,
            offset=offset,
        )
    if len(data) < _HEADER_LEN:
        raise SchemaError(
            f"truncated record: {len(data)} bytes, the header alone is {_HEADER_LEN}",
            topic=topic,
            partition=partition,
            offset=offset,
        )
    if data[:2] != MARKER:
        raise SchemaError(
            f"unknown format marker {bytes(data[:2]).hex()} (expected c301)",
            topic=topic,
            partition=partition,
            offset=offset,
        )
    codec = _by_fingerprint().get(bytes(data[2:_HEADER_LEN]))
    if codec is None:
        raise SchemaError(
            f"unknown schema fingerprint {bytes(data[2:_HEADER_LEN]).hex()}",
            topic=topic,
            partition=partition,
            offset=offset,
        )
    result: AnyRecord = codec.decode(data, topic=topic, partition=partition, offset=offset)
    return result


@dataclass(frozen=True, slots=True)
class PlanChunkColumns:
    """A PlanChunk's fields with its numeric columns as numpy arrays (what a follower needs)."""

    version: int
    index: int
    keys: list[str]
    replicas: np.ndarray[Any, np.dtype[np.int64]]
    targets: np.ndarray[Any, np.dtype[np.int64]]
    rates: np.ndarray[Any, np.dtype[np.float64]]


def decode_plan_chunk_columns(data: bytes) -> PlanChunkColumns | None:
    """A PlanChunk decoded column by column, or None: then decode it with `codec_for(PlanChunk)`.

    fastavro builds one Python object per array item through its generic reader (~2 ms for a
    64 KB chunk of ~1,500 keys); here the three numeric columns are decoded by numpy in a few
    vectorised passes, and the keys by one compiled pass and a split (`string_column`, with
    numba; else a Python loop). This is a fast path, not a second
    decoder to trust: it returns None for anything it does not fully understand (a wrong prefix,
    array blocks with byte counts, a varint wider than its type allows, invalid UTF-8, a
    truncated body, trailing bytes), and the caller then decodes the same bytes with fastavro,
    which accepts or rejects them with its usual error. When it returns columns, they are exactly
    what fastavro decodes (tested on valid and corrupted chunks).
    """
    if data[:_HEADER_LEN] != codec_for(PlanChunk).prefix:
        return None
    try:
        version, pos = _varint(data, _HEADER_LEN, 10)
        index, pos = _varint(data, pos, 5)
        keys, pos = _string_array(data, pos)
        untrack_strings(keys)  # decoded strings only, and nothing adds to it (gc_tracking)
        replicas, pos = _int_array(data, pos)
        targets, pos = _int_array(data, pos)
        rates, pos = _double_array(data, pos)
    except (_NotFastError, IndexError, UnicodeDecodeError, ValueError):
        return None
    if pos != len(data):
        return None
    return PlanChunkColumns(version, index, keys, replicas, targets, rates)


class _NotFastError(Exception):
    """The fast path does not handle these bytes (the caller falls back to fastavro)."""


def _varint(data: bytes, pos: int, width: int) -> tuple[int, int]:
    """(zig-zag decoded value, next position) of the varint at `pos`, at most `width` bytes."""
    result = shift = 0
    for _ in range(width):
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return (result >> 1) ^ -(result & 1), pos
    raise _NotFastError


def _block_count(data: bytes, pos: int) -> tuple[int, int]:
    count, pos = _varint(data, pos, 10)
    if count < 0:  # a block with its byte size: legal Avro, not what our writer emits
        raise _NotFastError
    return count, pos


@cache
def compiled_strings() -> ModuleType | None:
    """`string_column` when numba is installed (imported on first use), else None.

    numba is optional for gateways (the base install has none): without it the keys are read
    key by key, with the same result at about twice a version's decode time.
    """
    try:
        from cacheroute.schemas import string_column  # noqa: PLC0415 - numba is optional
    except ImportError:
        return None
    return string_column


def warm_up_plan_decoding() -> None:
    """Import and compile (or load from numba's disk cache) the compiled key reader, if any.

    Followers call it as their thread starts, so the first plan version does not pay ~0.15 s.
    """
    string_column = compiled_strings()
    if string_column is not None:
        string_column.warm_up()


def _string_array(data: bytes, pos: int) -> tuple[list[str], int]:
    """The keys column: one compiled pass and a split (`string_column`), else key by key."""
    string_column = compiled_strings()
    if string_column is None:
        return _string_array_by_key(data, pos)
    buf = np.frombuffer(data, np.uint8)
    joined = np.empty(len(data) - pos, np.uint8)
    status, items, size, end = string_column.join_strings(buf, pos, joined)
    if status == string_column.OK:
        return string_column.split_joined(joined, items, size), end
    if status == string_column.NOT_FAST:
        raise _NotFastError
    return _string_array_by_key(data, pos)  # a key holds a NUL byte


def _string_array_by_key(data: bytes, pos: int) -> tuple[list[str], int]:
    out: list[str] = []
    append = out.append
    count, pos = _block_count(data, pos)
    while count:
        for _ in range(count):
            n = data[pos]
            if n < 0x80 and not n & 1:  # a one-byte, non-negative length: nearly every key
                pos += 1
                end = pos + (n >> 1)
            else:
                n, pos = _varint(data, pos, 10)
                if n < 0:
                    raise _NotFastError
                end = pos + n
            # a slice past the end is cut short, but the next read at `end` then fails
            append(data[pos:end].decode())
            pos = end
        count, pos = _block_count(data, pos)
    return out, pos


def _int_array(data: bytes, pos: int) -> tuple[np.ndarray[Any, np.dtype[np.int64]], int]:
    parts: list[np.ndarray[Any, np.dtype[np.int64]]] = []
    count, pos = _block_count(data, pos)
    while count:
        # an Avro int takes 1 to 5 bytes: the block's varints lie within the next 5 * count bytes
        window = np.frombuffer(data, np.uint8, min(5 * count, len(data) - pos), pos)
        ends = np.flatnonzero(window < 0x80)[:count]
        if len(ends) < count:
            raise _NotFastError
        size = int(ends[-1]) + 1
        if size == count:  # every varint is one byte (small values: the normal case)
            raw = window[:count].astype(np.int64)
        else:
            starts = np.empty(count, np.int64)
            starts[0] = 0
            starts[1:] = ends[:-1] + 1
            widths = ends - starts + 1
            if int(widths.max()) > 5:
                raise _NotFastError
            shift = 7 * (np.arange(size, dtype=np.int64) - np.repeat(starts, widths))
            raw = np.add.reduceat((window[:size].astype(np.int64) & 0x7F) << shift, starts)
        parts.append((raw >> 1) ^ -(raw & 1))
        pos += size
        count, pos = _block_count(data, pos)
    values = parts[0] if len(parts) == 1 else np.concatenate([np.zeros(0, np.int64), *parts])
    return values, pos


def _double_array(data: bytes, pos: int) -> tuple[np.ndarray[Any, np.dtype[np.float64]], int]:
    parts: list[np.ndarray[Any, np.dtype[np.float64]]] = []
    count, pos = _block_count(data, pos)
    while count:
        if pos + 8 * count > len(data):
            raise _NotFastError
        parts.append(np.frombuffer(data, "<f8", count, pos).astype(np.float64))
        pos += 8 * count
        count, pos = _block_count(data, pos)
    values = parts[0] if len(parts) == 1 else np.concatenate([np.zeros(0, np.float64), *parts])
    return values, pos
