"""Rate smoothing: latest per (key, window), complete windows only, EWMA in window order."""

from __future__ import annotations

import math

import numpy as np
import pytest

from cacheroute.planner import PlannerError
from cacheroute.planner.smoothing import RateSmoother, SmoothingParams
from cacheroute.schemas import KeyRate

W = 60_000


def rate(key: str, window: int, value: float, count: int = 10, prefix: int = 0) -> KeyRate:
    start = window * W
    return KeyRate(key, start, start + W, count, value, prefix_tokens_sum=prefix)


def rates_of(sm: RateSmoother) -> dict[str, float]:
    snap = sm.snapshot()
    return dict(zip(snap.keys, snap.rates.tolist(), strict=True))


def test_ewma_over_complete_windows() -> None:
    sm = RateSmoother(SmoothingParams(alpha=0.5), partitions=1)
    assert sm.add(rate("a", 1, 4.0), 0, 0) == "accepted"
    assert sm.add(rate("b", 1, 2.0), 0, 0) == "accepted"
    assert sm.advance(1000) == []  # one partition reported w1, but it has not settled
    assert sm.advance(2000) == [W]  # quiet for settle_ms: folded
    assert rates_of(sm) == {"a": 4.0, "b": 2.0}  # first sighting starts at the observed rate
    sm.add(rate("a", 2, 8.0), 0, 3000)
    sm.add(rate("c", 2, 1.0), 0, 3000)
    sm.add(rate("a", 3, 2.0), 0, 3100)  # partition 0 moved on to w3: w2 certainly complete
    assert sm.advance(3100) == [2 * W]
    assert rates_of(sm) == {"a": 6.0, "b": 1.0, "c": 1.0}
    snap = sm.snapshot()
    assert snap.windows == 2
    assert snap.newest_end_ms == 3 * W
    assert sm.pending_windows == (3 * W,)


def test_latest_record_per_key_and_window_wins_and_late_is_dropped() -> None:
    sm = RateSmoother(SmoothingParams(alpha=1.0), partitions=1)
    sm.add(rate("a", 1, 4.0), 0, 0)
    assert sm.add(rate("a", 1, 5.0), 0, 10) == "replaced"  # at-least-once re-emission
    sm.advance(10_000)
    assert rates_of(sm) == {"a": 5.0}
    assert sm.add(rate("a", 1, 9.0), 0, 10_001) == "late"
    assert sm.add(rate("a", 0, 9.0), 0, 10_001) == "late"
    assert rates_of(sm) == {"a": 5.0}


def test_window_waits_for_every_partition() -> None:
    params = SmoothingParams(alpha=1.0, settle_ms=100, max_wait_ms=5000)
    sm = RateSmoother(params, partitions=2)
    sm.add(rate("a", 1, 1.0), 0, 0)
    assert sm.advance(1000) == []  # partition 1 has not reported window 1
    sm.add(rate("b", 1, 2.0), 1, 1000)
    assert sm.advance(1050) == []  # not quiet yet
    assert sm.advance(1100) == [W]
    sm.add(rate("a", 2, 3.0), 0, 2000)  # partition 1 carries no traffic any more
    assert sm.advance(6999) == []
    assert sm.advance(7000) == [2 * W]  # max_wait_ms after the window's first record
    assert rates_of(sm) == {"a": 3.0, "b": 0.0}


def test_windows_fold_in_order_and_keys_are_forgotten() -> None:
    sm = RateSmoother(SmoothingParams(alpha=0.5, forget_after_windows=3), partitions=1)
    sm.add(rate("a", 3, 1.0), 0, 0)  # arrives first, folds last
    sm.add(rate("b", 1, 8.0), 0, 0)
    sm.add(rate("a", 2, 1.0), 0, 0)
    assert sm.advance(10_000) == [W, 2 * W, 3 * W]
    assert rates_of(sm) == {"b": 2.0, "a": 1.0}
    sm.add(rate("a", 4, 1.0), 0, 10_000)
    sm.advance(20_000)
    assert rates_of(sm) == {"a": 1.0}  # b absent from three windows in a row: forgotten
    assert sm.tracked_keys == 1


def test_prefix_tokens_per_request_and_invalid_records() -> None:
    sm = RateSmoother(SmoothingParams(), partitions=2)
    sm.add(rate("a", 1, 1.0, count=4, prefix=400), 0, 0)
    sm.add(rate("z", 1, 1.0, count=0, prefix=0), 1, 0)
    for bad in (
        rate("a", 1, float("nan")),
        rate("a", 1, -1.0),
        rate("", 1, 1.0),
        KeyRate("a", 5, 5, 1, 1.0),
    ):
        assert sm.add(bad, 0, 0) == "invalid"
    assert sm.add(rate("a", 1, 1.0), 7, 0) == "invalid"  # no such partition
    sm.advance(100_000)
    snap = sm.snapshot()
    assert dict(zip(snap.keys, snap.prefix_tokens.tolist(), strict=True)) == {"a": 100.0, "z": 0.0}


def test_snapshot_is_a_copy() -> None:
    sm = RateSmoother(SmoothingParams(alpha=1.0), partitions=1)
    sm.add(rate("a", 1, 1.0), 0, 0)
    sm.advance(10_000)
    snap = sm.snapshot()
    sm.add(rate("a", 2, 7.0), 0, 10_000)
    sm.advance(20_000)
    assert snap.rates.tolist() == [1.0]
    assert np.array_equal(sm.snapshot().rates, [7.0])


@pytest.mark.parametrize(
    "kwargs",
    [{"alpha": 0.0}, {"alpha": 1.5}, {"settle_ms": -1}, {"forget_after_windows": 0}],
)
def test_bad_parameters(kwargs: dict[str, float]) -> None:
    with pytest.raises(PlannerError):
        SmoothingParams(**kwargs)  # type: ignore[arg-type]
    with pytest.raises(PlannerError):
        RateSmoother(SmoothingParams(), partitions=0)


# --------------------------------------------------------------------- hostile records (issue 13)
def test_far_future_window_is_rejected_and_later_windows_still_fold() -> None:
    """A window in 2100 is `invalid` ("future"); it never makes the real windows late."""
    sm = RateSmoother(SmoothingParams(alpha=1.0, max_ahead_ms=5_000), partitions=1)
    now = 10 * W
    year_2100 = 4_102_444_800_000
    bogus = KeyRate("bogus", year_2100, year_2100 + W, 10, 1.0)
    assert sm.add(bogus, 0, now, now) == "invalid"
    assert sm.rejections["future"] == 1
    assert "bogus" in sm.last_rejection["future"]
    # the real stream goes on: window 9 ended at `now`, window 10 later
    assert sm.add(rate("a", 9, 3.0), 0, now, now) == "accepted"
    assert sm.add(rate("a", 10, 5.0), 0, now + W, now + W) == "accepted"
    assert sm.advance(now + W) == [9 * W]
    assert rates_of(sm) == {"a": 3.0}
    assert sm.newest_end_ms == 10 * W


def test_future_bound_uses_the_earlier_of_record_time_and_planner_clock() -> None:
    """A forged record timestamp does not help, nor does a planner clock that runs ahead alone."""
    sm = RateSmoother(SmoothingParams(max_ahead_ms=5_000), partitions=1)
    end = 10 * W  # rate("a", 9, ...) ends here
    # window end 5 s after both clocks: on the bound, accepted
    assert sm.add(rate("a", 9, 1.0), 0, end - 5_000, end - 5_000) == "accepted"
    # 5.001 s ahead of the planner clock, though the record claims a time far ahead: rejected
    assert sm.add(rate("b", 9, 1.0), 0, end - 5_001, end + 10**9) == "invalid"
    # the record's own timestamp is what is behind: rejected too
    assert sm.add(rate("c", 9, 1.0), 0, end + 10**9, end - 5_001) == "invalid"
    # no record timestamp (-1): the planner clock alone
    assert sm.add(rate("d", 9, 1.0), 0, end, -1) == "accepted"
    assert sm.rejections == {"malformed": 0, "future": 2, "implausible": 0}


def test_implausible_rates_are_rejected_not_folded() -> None:
    """Rates of 1e308 (or counts no window can hold) never reach the averages."""
    sm = RateSmoother(SmoothingParams(alpha=1.0, max_key_rate=1000.0), partitions=1)
    assert sm.add(rate("x", 1, 1e308), 0, 0) == "invalid"
    assert sm.add(rate("y", 1, 1e308), 0, 0) == "invalid"
    # a count of 60,001 in a 60 s window is above 1000/s even with a small rate field
    assert sm.add(rate("z", 1, 1.0, count=60_001), 0, 0) == "invalid"
    assert sm.add(rate("ok", 1, 1000.0, count=60_000), 0, 0) == "accepted"  # on the ceiling
    sm.advance(10**9)
    assert rates_of(sm) == {"ok": 1000.0}
    assert sm.rejections["implausible"] == 3
    assert math.isfinite(float(sm.snapshot().rates.sum()))


def test_a_key_cannot_outgrow_the_cluster_a_hundredfold_in_one_window() -> None:
    """Cluster total 10/s: a key reporting 5000/s next window is clamped to 100 x 10 = 1000/s.

    (The clamp's floor is max_key_rate / 1000 = 10/s here, so the total of 10/s is what counts.)"""
    sm = RateSmoother(SmoothingParams(alpha=1.0, max_surge=100.0, max_key_rate=1e4), partitions=1)
    sm.add(rate("a", 1, 4.0), 0, 0)
    sm.add(rate("b", 1, 6.0), 0, 0)
    sm.advance(10**9)
    sm.add(rate("a", 2, 4.0), 0, 0)
    sm.add(rate("hot", 2, 5000.0), 0, 0)
    sm.advance(10**9)
    assert rates_of(sm) == {"a": 4.0, "b": 0.0, "hot": 1000.0}
    assert sm.clamped == 1
    # a genuine surge is followed: the total is now 1004/s, so 5000/s passes next window
    sm.add(rate("hot", 3, 5000.0), 0, 0)
    sm.advance(10**9)
    assert rates_of(sm)["hot"] == 5000.0
    assert sm.clamped == 1


def test_new_limits_are_validated() -> None:
    for bad in (
        {"max_ahead_ms": -1},
        {"max_key_rate": 0.0},
        {"max_key_rate": float("inf")},
        {"max_surge": 0.5},
    ):
        with pytest.raises(PlannerError):
            SmoothingParams(**bad)
