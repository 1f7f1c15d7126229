"""The fold's (row, time) order: one int64 sort where it cannot overflow, lexsort's answer."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from cacheroute.streams.columns import _row_time_order


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 50), st.integers(-(2**40), 2**40)), min_size=0, max_size=60)
)
def test_the_row_time_order_sorts_like_lexsort(pairs: list[tuple[int, int]]) -> None:
    rows = np.array([r for r, _ in pairs], np.int64)
    times = np.array([t + 1_700_000_000_000 for _, t in pairs], np.int64)
    order = _row_time_order(rows, times)
    expected = np.lexsort((times, rows))
    # pairs equal in both may swap; the sorted pairs must be the same
    assert np.array_equal(rows[order], rows[expected])
    assert np.array_equal(times[order], times[expected])


def test_the_row_time_order_falls_back_to_lexsort_where_one_key_would_overflow() -> None:
    rows = np.array([3, 1, 3, 0], np.int64)
    times = np.array([2**61, -(2**61), 5, 7], np.int64)  # span x rows > 2**62
    assert _row_time_order(rows, times).tolist() == [3, 1, 2, 0]
