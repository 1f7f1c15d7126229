"""The inter-arrival estimator: exact within the reorder horizon, small error beyond it."""

from __future__ import annotations

import numpy as np
import pytest

from cacheroute.streams.keyagg import KeyAgg


def _true_stats(times: np.ndarray) -> tuple[float, float]:
    gaps = np.diff(np.sort(times)).astype(float)
    return float(gaps.mean()), float(gaps.std() / gaps.mean())


def _arrivals(times: np.ndarray, jitter_ms: int, rng: np.random.Generator) -> np.ndarray:
    """Arrival order when each event is delayed by up to jitter_ms (several gateways, batching)."""
    return times[np.argsort(times + rng.integers(0, jitter_ms + 1, len(times)), kind="stable")]


def _feed(order: np.ndarray, reorder_ms: int, fold_every: int = 50) -> KeyAgg:
    agg = KeyAgg()
    newest = -1
    for i, t in enumerate(order.tolist()):
        agg.add(t, 100, -1, -1)
        newest = max(newest, t)
        if i % fold_every == 0:
            agg.fold(newest - reorder_ms)
    return agg


def _poisson(rate: float, seconds: float, rng: np.random.Generator) -> np.ndarray:
    gaps = rng.exponential(1000.0 / rate, int(rate * seconds * 1.2))
    t = np.cumsum(gaps)
    return np.round(t[t < seconds * 1000]).astype(np.int64) + 1_000_000


def _gamma(rate: float, cv: float, seconds: float, rng: np.random.Generator) -> np.ndarray:
    shape = 1.0 / cv**2
    gaps = rng.gamma(shape, 1000.0 / rate / shape, int(rate * seconds * 3))
    t = np.cumsum(gaps)
    return np.round(t[t < seconds * 1000]).astype(np.int64) + 1_000_000


@pytest.mark.parametrize(
    ("name", "make", "nominal_cv"),
    [
        ("poisson", lambda rng: _poisson(50, 120, rng), 1.0),
        ("periodic", lambda rng: np.arange(1_000_000, 1_120_000, 200, dtype=np.int64), 0.0),
        ("gamma-cv2", lambda rng: _gamma(10, 2.0, 600, rng), 2.0),
    ],
)
def test_exact_when_disorder_is_within_the_reorder_horizon(
    name: str, make: object, nominal_cv: float
) -> None:
    rng = np.random.default_rng(7)
    times = make(rng)  # type: ignore[operator]
    agg = _feed(_arrivals(times, jitter_ms=300, rng=rng), reorder_ms=500)
    stats = agg.stats()
    mean, cv = _true_stats(times)
    assert stats.count == len(times)
    assert stats.interarrival_mean_ms == pytest.approx(mean, rel=1e-12)
    assert stats.interarrival_cv == pytest.approx(cv, rel=1e-9, abs=1e-12)
    assert agg.gap_late == 0
    # and the merged stream's CV is what the generator intended (sampling error only)
    assert stats.interarrival_cv == pytest.approx(nominal_cv, abs=0.25 if nominal_cv > 1 else 0.08)


def test_error_when_disorder_exceeds_the_horizon_is_small_and_counted() -> None:
    rng = np.random.default_rng(3)
    times = _poisson(50, 120, rng)
    agg = _feed(_arrivals(times, jitter_ms=400, rng=rng), reorder_ms=100)
    stats = agg.stats()
    _, cv = _true_stats(times)
    assert stats.count == len(times)  # counts never suffer
    assert agg.gap_late > 0
    assert abs((stats.interarrival_cv or 0) - cv) < 0.1


def test_too_few_events() -> None:
    agg = KeyAgg()
    assert agg.stats().interarrival_mean_ms is None
    agg.add(10, 1, -1, -1)
    agg.add(30, 1, -1, -1)
    s = agg.stats()
    assert (s.count, s.interarrival_mean_ms, s.interarrival_cv) == (2, 20.0, None)


def test_token_sums_skip_unknown_values() -> None:
    agg = KeyAgg()
    agg.add(1, 100, 60, -1)
    agg.add(2, 50, -1, 30)
    s = agg.stats()
    assert (s.prompt_tokens_sum, s.prefix_tokens_sum, s.cached_tokens_sum) == (150, 60, 30)


def test_round_trips_through_its_list_form() -> None:
    agg = _feed(np.array([5, 1, 9, 3, 7], dtype=np.int64), reorder_ms=2, fold_every=1)
    back = KeyAgg.from_list(agg.to_list())
    assert back.to_list() == agg.to_list()
    assert back.stats() == agg.stats()
