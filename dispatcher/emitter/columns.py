"""Per-partition column buffers of request events, and the rules that seal them into batches.

Why columns: `RequestBatch` is column-wise on the wire, so appending each event's fields to lists
costs the request path a few list appends and makes sealing a swap of list objects, with no
per-event transposition. Optional fields are stored with their schema sentinel (-1, "", empty
hashes) so every column always has one entry per event; `batch_from` turns a column that holds
only sentinels into `None`, as the schema asks.

Pure logic: no Kafka client, no clock. Time comes in as `now_ms`.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass

from cacheroute.schemas.records import RequestBatch

__all__ = [
    "NO_HASHES",
    "ColumnBuffer",
    "Columns",
    "batch_from",
    "heartbeat_due",
    "seal_due",
]

NO_HASHES: tuple[int, ...] = ()
"""Stored in the hashes column for an event without prefix block hashes (immutable, shared)."""


@dataclass(frozen=True, slots=True)
class Columns:
    """The events taken out of a buffer: column i of every list belongs to event i."""

    keys: list[str]
    event_time_ms: list[int]
    prompt_tokens: list[int]
    prefix_tokens: list[int]
    cached_tokens: list[int]
    destinations: list[str]
    hashes: list[Sequence[int]]

    def __len__(self) -> int:
        return len(self.keys)

    def slice(self, start: int, stop: int) -> Columns:
        """Events start..stop-1 as their own Columns (lists are copied)."""
        return Columns(
            self.keys[start:stop],
            self.event_time_ms[start:stop],
            self.prompt_tokens[start:stop],
            self.prefix_tokens[start:stop],
            self.cached_tokens[start:stop],
            self.destinations[start:stop],
            self.hashes[start:stop],
        )


class ColumnBuffer:
    """The not-yet-sealed events of one partition.

    The emitter appends to the list attributes directly (a method call per event would double the
    cost of `emit`), under its lock; `take` hands the lists over and starts new ones.
    `opened_ms` is the emitter clock when the first event of the current batch arrived: the linger
    rule measures from it, not from the events' own times, which a caller may set to anything.
    """

    __slots__ = (
        "cached_tokens",
        "destinations",
        "event_time_ms",
        "hashes",
        "keys",
        "opened_ms",
        "prefix_tokens",
        "prompt_tokens",
    )

    def __init__(self) -> None:
        self.keys: list[str] = []
        self.event_time_ms: list[int] = []
        self.prompt_tokens: list[int] = []
        self.prefix_tokens: list[int] = []
        self.cached_tokens: list[int] = []
        self.destinations: list[str] = []
        self.hashes: list[Sequence[int]] = []
        self.opened_ms = 0

    def __len__(self) -> int:
        return len(self.keys)

    def take(self) -> Columns:
        """All buffered events; the buffer is empty afterwards."""
        cols = Columns(
            self.keys,
            self.event_time_ms,
            self.prompt_tokens,
            self.prefix_tokens,
            self.cached_tokens,
            self.destinations,
            self.hashes,
        )
        self.keys = []
        self.event_time_ms = []
        self.prompt_tokens = []
        self.prefix_tokens = []
        self.cached_tokens = []
        self.destinations = []
        self.hashes = []
        return cols


def seal_due(count: int, opened_ms: int, now_ms: int, *, max_events: int, linger_ms: int) -> bool:
    """Whether a buffer of `count` events, the first arriving at `opened_ms`, is sealed now.

    Full buffers are sealed at once (bounded record size); others once the oldest event has waited
    `linger_ms`, which bounds the time an event spends in the gateway. A clock that stepped back
    (`now_ms < opened_ms`, e.g. an NTP correction) seals at once rather than holding events for
    the length of the step.
    """
    return count > 0 and (
        count >= max_events or now_ms - opened_ms >= linger_ms or now_ms < opened_ms
    )


def heartbeat_due(last_sent_ms: int, now_ms: int, *, heartbeat_ms: int, holding: bool) -> bool:
    """Whether an idle partition gets an empty batch now.

    Only when nothing is held for the partition: a heartbeat says "this gateway's clock reached
    now_ms", and sending it while older events are still buffered would let the streams agent
    close their window before they arrive.
    """
    return not holding and now_ms - last_sent_ms >= heartbeat_ms


def batch_from(gateway_id: str, seq: int, now_ms: int, cols: Columns) -> RequestBatch:
    """The RequestBatch record of `cols`.

    `created_ms` is the later of `now_ms` and the newest event time, so the schema's promise "no
    event in the batch is newer" holds even for caller-supplied event times ahead of the clock.
    Optional columns that hold only sentinels are sent as null (smaller, and faster to encode).
    """
    n = len(cols.keys)
    newest = max(cols.event_time_ms, default=now_ms)
    created = max(now_ms, newest)
    prefix = cols.prefix_tokens if cols.prefix_tokens.count(-1) != n else None
    cached = cols.cached_tokens if cols.cached_tokens.count(-1) != n else None
    dests = cols.destinations if cols.destinations.count("") != n else None
    hashes: list[list[int]] | None = None
    if cols.hashes.count(NO_HASHES) != n:
        hashes = [h.tolist() if isinstance(h, array) else list(h) for h in cols.hashes]
    return RequestBatch(
        gateway_id=gateway_id,
        seq=seq,
        created_ms=created,
        keys=cols.keys,
        event_time_ms=cols.event_time_ms,
        prompt_tokens=cols.prompt_tokens,
        prefix_tokens=prefix,
        cached_tokens=cached,
        destinations=dests,
        prefix_block_hashes=hashes,
    )
