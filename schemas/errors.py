"""The schema package's one root error."""

from __future__ import annotations

from cacheroute.errors import CacheRouteError

__all__ = ["SchemaError", "format_location"]


def format_location(topic: str | None, partition: int | None, offset: int | None) -> str:
    """Render where a record came from as `topic[partition]@offset`, leaving out what is unknown."""
    if topic is None and partition is None and offset is None:
        return ""
    text = topic if topic is not None else "?"
    if partition is not None:
        text += f"[{partition}]"
    if offset is not None:
        text += f"@{offset}"
    return text


class SchemaError(CacheRouteError, ValueError):
    """A record could not be encoded or decoded.

    Raised for garbage bytes, truncated records, unknown format markers or schema fingerprints, and
    values that do not fit the schema. It is never retriable: the same bytes fail the same way, so the
    caller's right move is the dead-letter topic, not a retry. The message names the record's
    location (`topic[partition]@offset`) whenever the caller passed it.
    """

    retriable = False

    def __init__(
        self,
        reason: str,
        *,
        schema: str | None = None,
        topic: str | None = None,
        partition: int | None = None,
        offset: int | None = None,
    ) -> None:
        self.reason = reason
        self.schema = schema
        self.topic = topic
        self.partition = partition
        self.offset = offset
        where = format_location(topic, partition, offset)
        what = f"cannot decode/encode {schema}" if schema else "bad record"
        super().__init__(f"{what}{' at ' + where if where else ''}: {reason}")
