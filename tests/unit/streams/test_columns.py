"""The fold's compiled pass against a plain per-row loop: the gaps between each row's sorted times."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from cacheroute.streams.columns import _fold_pairs


def _reference(
    pairs: list[tuple[int, int]], last: list[int]
) -> tuple[list[int], list[int], list[int], list[int]]:
    """Per row: its times sorted, gaps from the last folded time (a gap counts once a time >= 0
    precedes it), as `KeyAgg` folds its reorder buffer."""
    n = len(last)
    gaps, s1, s2, out = [0] * n, [0] * n, [0] * n, list(last)
    for r in range(n):
        prev = last[r]
        for t in sorted(t for row, t in pairs if row == r):
            if prev >= 0:
                gaps[r] += 1
                s1[r] += t - prev
                s2[r] += (t - prev) ** 2
            prev = t
        out[r] = prev
    return gaps, s1, s2, out


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 7), st.integers(-50, 10**6)), max_size=80),
    st.lists(st.integers(-1, 10**5), min_size=8, max_size=8),
)
def test_the_fold_gives_each_rows_gaps_in_time_order(
    pairs: list[tuple[int, int]], last: list[int]
) -> None:
    rows = np.array([r for r, _ in pairs], np.int64)
    times = np.array([t for _, t in pairs], np.int64)
    cols = [np.zeros(8, np.int64) for _ in range(3)]
    folded = np.array(last, np.int64)
    _fold_pairs(rows, times, 8, cols[0], cols[1], cols[2], folded)
    gaps, s1, s2, out = _reference(pairs, last)
    assert cols[0].tolist() == gaps
    assert cols[1].tolist() == s1
    assert cols[2].tolist() == s2
    assert folded.tolist() == out


def test_a_hand_worked_fold() -> None:
    # row 0: last folded 10, times 40, 15 (out of order) -> gaps 5 and 25; row 1: none before,
    # times 7, 3 -> one gap of 4; row 2: untouched
    rows = np.array([0, 1, 0, 1], np.int64)
    times = np.array([40, 7, 15, 3], np.int64)
    gaps, s1, s2 = (np.zeros(3, np.int64) for _ in range(3))
    last = np.array([10, -1, 99], np.int64)
    _fold_pairs(rows, times, 3, gaps, s1, s2, last)
    assert gaps.tolist() == [2, 1, 0]
    assert s1.tolist() == [30, 4, 0]
    assert s2.tolist() == [25 + 625, 16, 0]
    assert last.tolist() == [40, 7, 99]
