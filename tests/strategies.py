"""Hypothesis strategies for every CacheRoute record (values within Avro's int/long ranges)."""

from __future__ import annotations

from hypothesis import strategies as st

from cacheroute.schemas import (
    Destination,
    KeyRate,
    PlanChunk,
    PlanHeader,
    PlanParams,
    RequestBatch,
    RequestEvent,
    RequestSummary,
)

INT = st.integers(-(2**31), 2**31 - 1)
LONG = st.integers(-(2**63), 2**63 - 1)
DOUBLE = st.floats(allow_nan=False, allow_infinity=False)
TEXT = st.text(max_size=40)

request_events = st.builds(
    RequestEvent,
    key=TEXT,
    event_time_ms=LONG,
    gateway_id=TEXT,
    prompt_tokens=INT,
    prefix_tokens=st.none() | INT,
    prefix_block_hashes=st.none() | st.lists(LONG, max_size=8),
    destination=st.none() | TEXT,
    cached_tokens=st.none() | INT,
)

key_rates = st.builds(
    KeyRate,
    key=TEXT,
    window_start_ms=LONG,
    window_end_ms=LONG,
    count=LONG,
    rate=DOUBLE,
    interarrival_mean_ms=st.none() | DOUBLE,
    interarrival_cv=st.none() | DOUBLE,
    prompt_tokens_sum=LONG,
    prefix_tokens_sum=LONG,
    cached_tokens_sum=LONG,
)

plan_headers = st.builds(
    PlanHeader,
    version=LONG,
    created_ms=LONG,
    params=st.builds(
        PlanParams,
        q_cap=DOUBLE,
        warm_slots=INT,
        control_interval_s=DOUBLE,
        imbalance_tolerance=DOUBLE,
        hysteresis=DOUBLE,
        admission=TEXT,
    ),
    destinations=st.lists(st.builds(Destination, name=TEXT, capacity=DOUBLE), max_size=6),
    key_count=LONG,
    chunk_count=INT,
    checksum=TEXT,
    planner_id=TEXT,
    expected_load=st.lists(DOUBLE, max_size=6),
    total_rate=DOUBLE,
    cold_rate=DOUBLE,
    planned_keys=LONG,
    capped_keys=LONG,
    cutoff=DOUBLE,
    kept_keys=LONG,
    new_keys=LONG,
    dropped_keys=LONG,
    resized_keys=LONG,
    displaced_replicas=LONG,
    balanced=st.none() | INT,
    inputs_until_ms=LONG,
    protocol=INT,
)


@st.composite
def _plan_chunks(draw: st.DrawFn) -> PlanChunk:
    n = draw(st.integers(0, 6))
    replicas = draw(st.lists(st.integers(1, 3), min_size=n, max_size=n))
    return PlanChunk(
        version=draw(LONG),
        index=draw(INT),
        keys=draw(st.lists(TEXT, min_size=n, max_size=n)),
        replicas=replicas,
        targets=draw(st.lists(INT, min_size=sum(replicas), max_size=sum(replicas))),
        rates=draw(st.lists(DOUBLE, min_size=n, max_size=n)),
    )


plan_chunks = _plan_chunks()


@st.composite
def request_batches(draw: st.DrawFn) -> RequestBatch:
    n = draw(st.integers(0, 6))

    def column(items: st.SearchStrategy[object]) -> st.SearchStrategy[list[object]]:
        return st.lists(items, min_size=n, max_size=n)

    return RequestBatch(
        gateway_id=draw(TEXT),
        seq=draw(LONG),
        created_ms=draw(LONG),
        keys=draw(column(TEXT)),  # type: ignore[arg-type]
        event_time_ms=draw(column(LONG)),  # type: ignore[arg-type]
        prompt_tokens=draw(column(INT)),  # type: ignore[arg-type]
        prefix_tokens=draw(st.none() | column(INT)),  # type: ignore[arg-type]
        cached_tokens=draw(st.none() | column(INT)),  # type: ignore[arg-type]
        destinations=draw(st.none() | column(TEXT)),  # type: ignore[arg-type]
        prefix_block_hashes=draw(st.none() | column(st.lists(LONG, max_size=3))),  # type: ignore[arg-type]
    )


@st.composite
def request_summaries(draw: st.DrawFn) -> RequestSummary:
    n = draw(st.integers(0, 6))

    def longs() -> list[int]:
        return draw(st.lists(LONG, min_size=n, max_size=n))

    return RequestSummary(
        gateway_id=draw(TEXT),
        seq=draw(LONG),
        created_ms=draw(LONG),
        tick_start_ms=draw(LONG),
        tick_end_ms=draw(LONG),
        keys=draw(st.lists(TEXT, min_size=n, max_size=n)),
        counts=longs(),
        first_ms=longs(),
        last_ms=longs(),
        prompt_tokens_sum=longs(),
        prefix_tokens_sum=longs(),
        cached_tokens_sum=longs(),
    )


ALL_RECORDS = {
    RequestBatch: request_batches(),
    RequestSummary: request_summaries(),
    RequestEvent: request_events,
    KeyRate: key_rates,
    PlanHeader: plan_headers,
    PlanChunk: plan_chunks,
}
