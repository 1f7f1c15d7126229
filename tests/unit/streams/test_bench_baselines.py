"""The numpy baseline of `bench streams`: per-key counts, mean gap and CV, checked by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from cacheroute.benchmarks.streams import aggregate_per_key
from cacheroute.streams.keyagg import KeyAgg

# (key, event time ms), in a scrambled arrival order. Worked out by hand:
#   a: 10 20 30 40    -> gaps 10 10 10 -> count 4, mean 10, CV 0
#   b: 0 10 40        -> gaps 10 30    -> count 3, mean 20, std 10, CV 0.5
#   c: 5              -> count 1, no mean, no CV
#   d: 100 103        -> gap 3         -> count 2, mean 3, no CV (one gap)
#   e: 7 7 7          -> gaps 0 0      -> count 3, mean 0, no CV (zero mean)
#   f: 0 1 4 10       -> gaps 1 3 6    -> count 4, mean 10/3,
#                        var ((7/3)^2 + (1/3)^2 + (8/3)^2) / 3 = 38/9, CV = (sqrt(38)/3)/(10/3)
EVENTS = [
    ("b", 40),
    ("a", 30),
    ("f", 4),
    ("c", 5),
    ("a", 10),
    ("e", 7),
    ("b", 0),
    ("f", 10),
    ("d", 103),
    ("a", 40),
    ("e", 7),
    ("f", 0),
    ("b", 10),
    ("d", 100),
    ("a", 20),
    ("e", 7),
    ("f", 1),
]
EXPECTED = {
    "a": (4, 10.0, 0.0),
    "b": (3, 20.0, 0.5),
    "c": (1, None, None),
    "d": (2, 3.0, None),
    "e": (3, 0.0, None),
    "f": (4, 10 / 3, math.sqrt(38) / 10),
}


def _as_dict(
    keys: np.ndarray, times: np.ndarray
) -> dict[str, tuple[int, float | None, float | None]]:
    agg = aggregate_per_key(keys, times)
    assert list(agg.keys) == sorted(agg.keys.tolist())

    def opt(x: float) -> float | None:
        return None if math.isnan(x) else x

    return {
        str(k): (int(c), opt(m), opt(v))
        for k, c, m, v in zip(
            agg.keys.tolist(),
            agg.counts.tolist(),
            agg.mean_gap_ms.tolist(),
            agg.cv.tolist(),
            strict=True,
        )
    }


def _check(got: dict[str, tuple[int, float | None, float | None]]) -> None:
    assert set(got) == set(EXPECTED)
    for key, (count, mean, cv) in EXPECTED.items():
        g_count, g_mean, g_cv = got[key]
        assert g_count == count, key
        assert g_mean == (None if mean is None else pytest.approx(mean, rel=1e-12)), key
        assert g_cv == (None if cv is None else pytest.approx(cv, rel=1e-12, abs=1e-12)), key


def test_hand_computed_example_with_string_keys() -> None:
    keys = np.array([k for k, _ in EVENTS])
    times = np.array([t for _, t in EVENTS], dtype=np.int64)
    _check(_as_dict(keys, times))
    assert math.sqrt(38) / 10 == pytest.approx(0.61644, abs=1e-5)  # the CV of "f", spelled out


def test_arrival_order_does_not_matter() -> None:
    keys = np.array([k for k, _ in EVENTS])
    times = np.array([t for _, t in EVENTS], dtype=np.int64)
    rng = np.random.default_rng(7)
    for _ in range(5):
        order = rng.permutation(len(EVENTS))
        _check(_as_dict(keys[order], times[order]))


def test_integer_keys_and_empty_input() -> None:
    ids = {"a": 3, "b": 1, "c": 9, "d": 0, "e": 4, "f": 2}
    keys = np.array([ids[k] for k, _ in EVENTS])
    times = np.array([t for _, t in EVENTS], dtype=np.int64)
    agg = aggregate_per_key(keys, times)
    assert agg.keys.tolist() == [0, 1, 2, 3, 4, 9]
    assert agg.counts.tolist() == [2, 3, 4, 4, 3, 1]
    assert agg.counts.sum() == len(EVENTS)
    empty = aggregate_per_key(np.array([], dtype=np.int64), np.array([], dtype=np.int64))
    assert len(empty.keys) == len(empty.counts) == len(empty.mean_gap_ms) == len(empty.cv) == 0


def test_agrees_with_the_agents_estimator() -> None:
    """Same definitions as `KeyAgg` (what the agent emits) on random in-order streams."""
    rng = np.random.default_rng(11)
    n = 5_000
    keys = rng.integers(0, 300, n)
    times = np.sort(rng.integers(0, 50_000, n))  # in time order, as one emitter sends them
    agg = aggregate_per_key(keys, times)
    ref: dict[int, KeyAgg] = {}
    for k, t in zip(keys.tolist(), times.tolist(), strict=True):
        ref.setdefault(k, KeyAgg()).add(t, 100, -1, -1)
    assert agg.keys.tolist() == sorted(ref)
    for k, count, mean, cv in zip(
        agg.keys.tolist(),
        agg.counts.tolist(),
        agg.mean_gap_ms.tolist(),
        agg.cv.tolist(),
        strict=True,
    ):
        stats = ref[k].stats()
        assert count == stats.count
        if stats.interarrival_mean_ms is None:
            assert math.isnan(mean)
        else:
            assert mean == pytest.approx(stats.interarrival_mean_ms, rel=1e-9)
        if stats.interarrival_cv is None:
            assert math.isnan(cv)
        else:
            assert cv == pytest.approx(stats.interarrival_cv, rel=1e-6, abs=1e-9)
