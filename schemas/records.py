"""Python mirrors of the Avro records in this folder.

The `.avsc` files are the source of truth; these frozen dataclasses exist so that the rest of the code
gets attribute access, type checking and immutability instead of loose dicts. Field names, order,
types and defaults match the schemas exactly — `tests/unit/test_schema_records.py` asserts that
field for field, so a schema change without the matching change here fails the build.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = [
    "Destination",
    "KeyRate",
    "PlanChunk",
    "PlanEntry",
    "PlanHeader",
    "PlanParams",
    "RequestEvent",
]


@dataclass(frozen=True, slots=True)
class RequestEvent:
    """One request as a gateway saw it (schema `cacheroute.RequestEvent`)."""

    key: str
    event_time_ms: int
    gateway_id: str
    prompt_tokens: int
    prefix_tokens: int | None = None
    prefix_block_hashes: list[int] | None = None
    destination: str | None = None
    cached_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class KeyRate:
    """Per-key statistics of one window (schema `cacheroute.KeyRate`)."""

    key: str
    window_start_ms: int
    window_end_ms: int
    count: int
    rate: float
    interarrival_mean_ms: float | None = None
    interarrival_cv: float | None = None
    prompt_tokens_sum: int = 0
    prefix_tokens_sum: int = 0
    cached_tokens_sum: int = 0


@dataclass(frozen=True, slots=True)
class PlanParams:
    """Algorithm-1 parameters carried in every plan header (schema `cacheroute.PlanParams`)."""

    q_cap: float
    warm_slots: int
    control_interval_s: float = 60.0
    imbalance_tolerance: float = 1.05
    hysteresis: float = 0.0


@dataclass(frozen=True, slots=True)
class Destination:
    """A serving replica as named in a plan (schema `cacheroute.Destination`)."""

    name: str
    capacity: float = 1.0


@dataclass(frozen=True, slots=True)
class PlanHeader:
    """Header/commit record of one plan version (schema `cacheroute.PlanHeader`)."""

    version: int
    created_ms: int
    params: PlanParams
    destinations: list[Destination]
    key_count: int
    chunk_count: int
    checksum: str
    planner_id: str = ""
    expected_load: list[float] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class PlanEntry:
    """One admitted key and its destination indices (schema `cacheroute.PlanEntry`)."""

    key: str
    destinations: list[int]
    rate: float = 0.0


@dataclass(frozen=True, slots=True)
class PlanChunk:
    """One chunk of a plan version (schema `cacheroute.PlanChunk`)."""

    version: int
    index: int
    entries: list[PlanEntry]
