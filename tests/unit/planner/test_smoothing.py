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


# ------------------------------------------------------------------------------ hostile records
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

    (The clamp's floor is max_key_rate / 1000 = 10/s here, so the total of 10/s is what counts.
    The total ceiling is lifted out of the way: this test is about the per-key clamp alone.)"""
    params = SmoothingParams(alpha=1.0, max_surge=100.0, max_key_rate=1e4, max_total_growth=1e3)
    sm = RateSmoother(params, partitions=1)
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
        {"max_total_growth": 0.9},
        {"max_total_growth": float("nan")},
        {"total_floor": 0.0},
        {"total_floor": float("inf")},
    ):
        with pytest.raises(PlannerError):
            SmoothingParams(**bad)


def _window(sm: RateSmoother, window: int, rates: dict[str, float]) -> None:
    for key, value in rates.items():
        assert sm.add(rate(key, window, value), 0, 0) == "accepted"
    assert sm.advance(10**9) == [window * W]


REAL = {f"k{i:03d}": 1.0 for i in range(100)}  # 100 real keys at 1/s: a total of 100/s


def test_first_window_one_made_up_key_cannot_set_the_scale() -> None:
    """No smoothed total yet: the reference is 101 keys x the median 1/s = 101/s.

    Per-key clamp: 100 x max(101, 1e6 / 1000) = 1e5/s, so 9e5 -> 1e5 (clamped 1).
    Total ceiling: 10 x max(101, 100) = 1010/s. The real keys give 100/s, so the made-up key is
    cut to the level that leaves 1010 - 100 = 910/s: the total is 1010/s, not 900,100/s.
    """
    sm = RateSmoother(SmoothingParams(alpha=1.0), partitions=1)
    _window(sm, 1, {**REAL, "made-up": 9e5})
    got = rates_of(sm)
    assert got["made-up"] == pytest.approx(910.0, rel=1e-12)
    assert all(got[k] == 1.0 for k in REAL)  # the real keys keep their rates exactly
    assert float(sm.snapshot().rates.sum()) == pytest.approx(1010.0, rel=1e-12)
    assert (sm.clamped, sm.scaled) == (1, 1)
    (limit,) = sm.limits
    assert limit.first
    assert limit.window_start_ms == W
    assert limit.reference == 101.0
    assert limit.reported == 900_100.0
    assert limit.folded == pytest.approx(1010.0, rel=1e-12)
    assert (limit.clamped, limit.scaled) == (1, 1)
    assert limit.largest == "'made-up' at 9e+05/s"


def test_first_window_of_a_real_skewed_cluster_is_not_cut() -> None:
    """Keys at 50, 20, 10, 5 and 1/s: median 10, reference 5 x 10 = 50/s, ceiling
    10 x max(50, 100) = 1000/s; the reported total of 86/s is far below it: nothing changes."""
    sm = RateSmoother(SmoothingParams(alpha=1.0), partitions=1)
    real = {"a": 50.0, "b": 20.0, "c": 10.0, "d": 5.0, "e": 1.0}
    _window(sm, 1, real)
    assert rates_of(sm) == real
    assert (sm.clamped, sm.scaled, len(sm.limits)) == (0, 0, 0)


def test_first_window_made_up_key_is_cut_and_the_skewed_real_keys_are_not() -> None:
    """The same five real keys (86/s) and one made-up key at 9e5/s: median (5 + 10) / 2 = 7.5,
    reference 6 x 7.5 = 45/s, ceiling 10 x max(45, 100) = 1000/s. The excess comes off the top:
    the made-up key is cut to 1000 - 86 = 914/s; even the real 50/s key, above the median, keeps
    all of its rate (a common scale factor would have cut it too)."""
    sm = RateSmoother(SmoothingParams(alpha=1.0), partitions=1)
    real = {"a": 50.0, "b": 20.0, "c": 10.0, "d": 5.0, "e": 1.0}
    _window(sm, 1, {**real, "made-up": 9e5})
    assert rates_of(sm) == pytest.approx({**real, "made-up": 914.0}, rel=1e-12)
    assert {k: rates_of(sm)[k] for k in real} == real  # exactly
    assert (sm.clamped, sm.scaled) == (1, 1)


def test_many_made_up_keys_cannot_inflate_the_total() -> None:
    """Total 100/s; next window 50 made-up keys at 9e5/s each beside the real ones.

    Per-key clamp: 100 x max(100, 1000) = 1e5/s each (clamped 50), 5e6/s in all.
    Total ceiling: 10 x max(100, 100) = 1000/s. The real keys keep their 1/s (100/s); the 50
    made-up keys share the 900/s left at one level: 18/s each. The total is 1000/s, not
    5,000,100/s.
    """
    sm = RateSmoother(SmoothingParams(alpha=1.0), partitions=1)
    _window(sm, 1, REAL)
    bogus = {f"b{j:02d}": 9e5 for j in range(50)}
    _window(sm, 2, {**REAL, **bogus})
    got = rates_of(sm)
    assert all(got[k] == 1.0 for k in REAL)
    assert all(got[k] == pytest.approx(18.0, rel=1e-12) for k in bogus)
    assert float(sm.snapshot().rates.sum()) == pytest.approx(1000.0, rel=1e-12)
    assert (sm.clamped, sm.scaled) == (50, 50)
    (limit,) = sm.limits
    assert not limit.first
    assert limit.reference == 100.0
    assert limit.reported == pytest.approx(100.0 + 50 * 9e5, rel=1e-12)
    assert (limit.clamped, limit.scaled) == (50, 50)


def test_total_ceiling_cuts_only_growth_and_lifts_as_the_total_follows() -> None:
    """alpha 0.5. Window 1: a = 300, b = 100 (median 200, reference 400, ceiling 4000): kept.

    Window 2 reports a = 300, b = 5000, c = 2000 (7300/s); ceiling 10 x 400 = 4000/s. a did not
    grow and keeps 300; b (trusted base 100) and c (new, base 0) are cut to one level L with
    300 + L + L = 4000: L = 1850. EWMA: b = (100 + 1850) / 2 = 975; c starts at 1850.
    Window 3 reports the same 7300/s; the smoothed total is now 300 + 975 + 1850 = 3125/s, the
    ceiling 31,250/s: nothing is cut, b = (975 + 5000) / 2 = 2987.5, c = (1850 + 2000) / 2 = 1925.
    """
    sm = RateSmoother(SmoothingParams(alpha=0.5), partitions=1)
    _window(sm, 1, {"a": 300.0, "b": 100.0})
    assert rates_of(sm) == {"a": 300.0, "b": 100.0}
    assert not sm.limits
    _window(sm, 2, {"a": 300.0, "b": 5000.0, "c": 2000.0})
    assert rates_of(sm) == pytest.approx({"a": 300.0, "b": 975.0, "c": 1850.0}, rel=1e-12)
    assert (sm.clamped, sm.scaled) == (0, 2)
    _window(sm, 3, {"a": 300.0, "b": 5000.0, "c": 2000.0})
    assert rates_of(sm) == pytest.approx({"a": 300.0, "b": 2987.5, "c": 1925.0}, rel=1e-12)
    assert (sm.clamped, sm.scaled) == (0, 2)  # window 3 was not cut
    assert len(sm.limits) == 1


def test_a_flood_of_made_up_keys_cannot_cut_a_key_below_its_trusted_rate() -> None:
    """alpha 1. Window 1: a = 900, b = 100 (median 500, reference 1000, ceiling 10,000): kept.

    Window 2: a = 1000 (trusted base 900), b absent, and 50 made-up keys at 1e5/s each (the
    per-key clamp, 100 x max(1000, 1000) = 1e5, does not bind): 5,001,000/s. Ceiling
    10 x 1000 = 10,000/s. One level L for every key that grew, never below its base: with
    L < 900, a keeps its 900 and 50 L = 10,000 - 900 gives L = 182 (< 900, as assumed).
    """
    sm = RateSmoother(SmoothingParams(alpha=1.0), partitions=1)
    _window(sm, 1, {"a": 900.0, "b": 100.0})
    bogus = {f"b{j:02d}": 1e5 for j in range(50)}
    _window(sm, 2, {"a": 1000.0, **bogus})
    got = rates_of(sm)
    assert got["a"] == 900.0  # its growth to 1000 is cut, its trusted 900 is not
    assert got["b"] == 0.0
    assert all(got[k] == pytest.approx(182.0, rel=1e-12) for k in bogus)
    assert float(sm.snapshot().rates.sum()) == pytest.approx(10_000.0, rel=1e-12)
    assert (sm.clamped, sm.scaled) == (0, 51)


def test_an_idle_cluster_may_still_grow_to_the_floor() -> None:
    """Total 0.5/s; the next window reports 800/s. The reference counts as total_floor = 100,
    so the ceiling is 10 x 100 = 1000/s: a real ramp from near idle is not cut."""
    sm = RateSmoother(SmoothingParams(alpha=1.0), partitions=1)
    _window(sm, 1, {"a": 0.5})
    _window(sm, 2, {"a": 300.0, "b": 500.0})
    assert rates_of(sm) == {"a": 300.0, "b": 500.0}
    assert sm.scaled == 0


@pytest.mark.parametrize("seed", range(20))
def test_a_cut_window_totals_the_ceiling_and_never_cuts_below_a_base(seed: int) -> None:
    """Properties on random windows (ties included): after a cut the window's total is the
    ceiling, no key is below min(reported, trusted base), and no key is above what it reported."""
    rng = np.random.default_rng(seed)
    first = {f"k{i}": float(v) for i, v in enumerate(rng.integers(1, 5, 30))}  # many ties
    sm = RateSmoother(SmoothingParams(alpha=1.0), partitions=1)
    _window(sm, 1, first)
    total = sum(first.values())
    second = {k: float(v) * float(rng.choice([1.0, 1.0, 50.0, 400.0])) for k, v in first.items()}
    second.update({f"new{j}": float(rng.integers(1, 3000)) for j in range(10)})
    _window(sm, 2, second)
    got = rates_of(sm)
    ceiling = 10 * max(total, 100.0)
    assert sum(second.values()) > ceiling  # the case under test
    assert sum(got.values()) == pytest.approx(ceiling, rel=1e-9)
    for key, reported in second.items():
        assert got[key] <= reported
        assert got[key] >= min(reported, first.get(key, 0.0))


def test_a_forged_prompt_sum_is_implausible_not_folded() -> None:
    sm = RateSmoother(SmoothingParams(alpha=1.0, max_prompt_tokens=1_000), partitions=1)
    ok = KeyRate("a", 0, W, 10, 1.0, prompt_tokens_sum=10_000)  # 1,000 a request: the ceiling
    forged = KeyRate("b", 0, W, 10, 1.0, prompt_tokens_sum=10_001)
    assert sm.add(ok, 0, 0) == "accepted"
    assert sm.add(forged, 0, 0) == "invalid"
    assert sm.add(KeyRate("c", 0, W, 1, 1.0, prompt_tokens_sum=-1), 0, 0) == "invalid"
    sm.advance(10_000)
    snap = sm.snapshot()
    assert snap.keys == ("a",)
    assert snap.prompt_tokens.tolist() == [1_000.0]
    assert sm.rejections == {"malformed": 1, "future": 0, "implausible": 1}
    assert "prompt tokens" in sm.last_rejection["implausible"]
