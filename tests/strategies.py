"""Hypothesis strategies for every CacheRoute record (values within Avro's int/long ranges)."""

from __future__ import annotations

from hypothesis import strategies as st

from cacheroute.schemas import (
    Destination,
    KeyRate,
    PlanChunk,
    PlanEntry,
    PlanHeader,
    PlanParams,
    RequestEvent,
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
    ),
    destinations=st.lists(st.builds(Destination, name=TEXT, capacity=DOUBLE), max_size=6),
    key_count=LONG,
    chunk_count=INT,
    checksum=TEXT,
    planner_id=TEXT,
    expected_load=st.lists(DOUBLE, max_size=6),
)

plan_chunks = st.builds(
    PlanChunk,
    version=LONG,
    index=INT,
    entries=st.lists(
        st.builds(PlanEntry, key=TEXT, destinations=st.lists(INT, max_size=4), rate=DOUBLE),
        max_size=6,
    ),
)

ALL_RECORDS = {
    RequestEvent: request_events,
    KeyRate: key_rates,
    PlanHeader: plan_headers,
    PlanChunk: plan_chunks,
}
