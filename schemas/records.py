"""Python mirrors of the Avro records in this folder.

The `.avsc` files are the source of truth; these frozen dataclasses exist so that the rest of the code
gets attribute access, type checking and immutability instead of loose dicts. Field names, order,
types and defaults match the schemas exactly — `tests/unit/test_schema_records.py` asserts that
field for field, so a schema change without the matching change here fails the build.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = [
    "MAX_PROMPT_TOKENS",
    "Destination",
    "KeyRate",
    "PlanChunk",
    "PlanHeader",
    "PlanParams",
    "RequestBatch",
    "RequestEvent",
    "RequestSummary",
]


MAX_PROMPT_TOKENS = 4_000_000
"""The most prompt (or prefix, or cached) tokens one request may plausibly carry, though Avro's
`int` allows 2**31 - 1: the planner's bound on a key's mean (`SmoothingParams.max_prompt_tokens`)
and the streams agent's per event (`StreamConfig.max_prompt_tokens`), one default for both."""


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
    admission: str = "rate"
    fair_share: float | None = None
    group_separator: str | None = None


@dataclass(frozen=True, slots=True)
class Destination:
    """A serving replica as named in a plan (schema `cacheroute.Destination`)."""

    name: str
    capacity: float = 1.0


@dataclass(frozen=True, slots=True)
class PlanHeader:
    """Header/commit record of one plan version (schema `cacheroute.PlanHeader`).

    Besides the commit data (chunk count, checksum) it carries every scalar of the planner's `Plan`
    (totals, stats), so a consumer rebuilds the published plan bit for bit.
    """

    version: int
    created_ms: int
    params: PlanParams
    destinations: list[Destination]
    key_count: int
    chunk_count: int
    checksum: str
    planner_id: str = ""
    expected_load: list[float] = field(default_factory=list)
    total_rate: float = 0.0
    cold_rate: float = 0.0
    planned_keys: int = 0
    capped_keys: int = 0
    cutoff: float = 0.0
    kept_keys: int = 0
    new_keys: int = 0
    dropped_keys: int = 0
    resized_keys: int = 0
    displaced_replicas: int = 0
    balanced: int | None = None
    inputs_until_ms: int = 0
    protocol: int = 1


@dataclass(frozen=True, slots=True)
class PlanChunk:
    """One chunk of a plan version, column by column (schema `cacheroute.PlanChunk`).

    Key i's replica set is `targets[sum(replicas[:i]) : sum(replicas[:i + 1])]`.
    """

    version: int
    index: int
    keys: list[str]
    replicas: list[int]
    targets: list[int]
    rates: list[float]


@dataclass(frozen=True, slots=True)
class RequestBatch:
    """Column-wise batch of request events (schema `cacheroute.RequestBatch`).

    Column i of each list belongs to event i. Optional columns are None when no event has the value;
    inside a present column, -1 (ints) or "" (destinations) or [] (hashes) marks a missing value.
    """

    gateway_id: str
    seq: int
    created_ms: int
    keys: list[str]
    event_time_ms: list[int]
    prompt_tokens: list[int]
    prefix_tokens: list[int] | None = None
    cached_tokens: list[int] | None = None
    destinations: list[str] | None = None
    prefix_block_hashes: list[list[int]] | None = None

    def __len__(self) -> int:
        return len(self.keys)

    def events(self) -> list[RequestEvent]:
        """The batch as individual events (convenient, not fast: the agent reads the columns)."""
        out = []
        for i, key in enumerate(self.keys):
            prefix = self.prefix_tokens[i] if self.prefix_tokens is not None else -1
            cached = self.cached_tokens[i] if self.cached_tokens is not None else -1
            dest = self.destinations[i] if self.destinations is not None else ""
            hashes = self.prefix_block_hashes[i] if self.prefix_block_hashes is not None else []
            out.append(
                RequestEvent(
                    key=key,
                    event_time_ms=self.event_time_ms[i],
                    gateway_id=self.gateway_id,
                    prompt_tokens=self.prompt_tokens[i],
                    prefix_tokens=None if prefix < 0 else prefix,
                    prefix_block_hashes=hashes or None,
                    destination=dest or None,
                    cached_tokens=None if cached < 0 else cached,
                )
            )
        return out


@dataclass(frozen=True, slots=True)
class RequestSummary:
    """Per-key pre-aggregated requests of one tick (schema `cacheroute.RequestSummary`)."""

    gateway_id: str
    seq: int
    created_ms: int
    tick_start_ms: int
    tick_end_ms: int
    keys: list[str]
    counts: list[int]
    first_ms: list[int]
    last_ms: list[int]
    prompt_tokens_sum: list[int]
    prefix_tokens_sum: list[int]
    cached_tokens_sum: list[int]
