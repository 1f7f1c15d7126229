"""The one schema source of truth: Avro `.avsc` files, their Python record mirrors, and the codec.

Every producer and consumer in CacheRoute encodes and decodes through `codec_for(RecordType)`.
"""

from cacheroute.schemas.codec import MARKER, RecordCodec, codec_for, decode_any, load_schema
from cacheroute.schemas.errors import SchemaError
from cacheroute.schemas.records import (
    MAX_PROMPT_TOKENS,
    Destination,
    KeyRate,
    PlanChunk,
    PlanHeader,
    PlanParams,
    RequestBatch,
    RequestEvent,
    RequestSummary,
)

__all__ = [
    "MARKER",
    "MAX_PROMPT_TOKENS",
    "Destination",
    "KeyRate",
    "PlanChunk",
    "PlanHeader",
    "PlanParams",
    "RecordCodec",
    "RequestBatch",
    "RequestEvent",
    "RequestSummary",
    "SchemaError",
    "codec_for",
    "decode_any",
    "load_schema",
]
