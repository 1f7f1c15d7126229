"""Hostile KeyRate records against `cacheroute planner run` on the real broker.

One record from the future (a window in 2100) or two rates of 1e308 must not poison the planner:
the records are counted `invalid` and logged with their reason, the real windows keep folding, a
new hot key is still admitted, no plan ever holds one of those keys or a non-finite total, and a
planner restarted while the records are inside its look-back is not poisoned either.

A made-up key at 9e5/s (under the per-key ceiling of 1e6/s) in the first window the planner folds,
where there is no smoothed total yet to bound it by, is cut: counted `clamped` and `scaled`,
logged once, and the totals of every plan are the hand-derived ones (see the test).
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np
import orjson
import pytest
from confluent_kafka import Producer

from cacheroute.dispatcher.follower import FollowerConfig, PlanFollower
from cacheroute.kafkaio import producer_config
from cacheroute.planner import Plan
from cacheroute.schemas import KeyRate, codec_for
from cacheroute.settings import Settings
from cacheroute.topics import ensure_topics
from tests.integration.planservice_support import planner_process, produce_rates

WINDOW_MS = 10_000
YEAR_2100_MS = 4_102_444_800_000
INVALID = 'outcome="invalid"'
CLAMPED = 'outcome="clamped"'
SCALED = 'outcome="scaled"'


def _config(path: Path) -> Path:
    values: dict[str, object] = {
        "destinations": 4,
        "q_cap": 6.0,
        "warm_slots": 40,
        "interval_s": 2.0,
        "settle_s": 0.5,
        "max_wait_s": 5.0,
        "rewarm_s": 0.0,
        "rates_lookback_s": 600.0,
    }
    path.write_text(
        "\n".join(f"{k} = {orjson.dumps(v).decode()}" for k, v in values.items()) + "\n",
        encoding="utf-8",
    )
    return path


def _produce_hostile(settings: Settings, window_start: int) -> None:
    codec = codec_for(KeyRate)
    producer = Producer(producer_config(settings))
    topic = settings.topics["rates"]
    records = [
        KeyRate("from-2100", YEAR_2100_MS, YEAR_2100_MS + WINDOW_MS, 5, 0.5),
        KeyRate("huge-1", window_start, window_start + WINDOW_MS, 10, 1e308),
        KeyRate("huge-2", window_start, window_start + WINDOW_MS, 10, 1e308),
    ]
    for record in records:
        producer.produce(topic, key=record.key.encode(), value=codec.encode(record))
    assert producer.flush(30) == 0


def _rate_in(plan: Plan, key: str) -> float:
    return float(plan.rates[plan.keys.index(key)])


def test_future_windows_and_huge_rates_never_reach_a_plan(
    settings: Settings, tmp_path: Path
) -> None:
    ensure_topics(settings)
    rng = np.random.default_rng(5)
    # the same rates in every window: the smoothed rate of a key is exactly its window rate
    steady = {f"key-{i:03d}": float(r) for i, r in enumerate(rng.lognormal(0.0, 1.0, 120))}
    real = sum(steady.values())  # about 152.8/s; no real key above 12/s
    # Window A, the first the planner folds, also holds a made-up key at 9e5/s. No smoothed total
    # yet: the reference is 121 keys x the window's median (the 61st smallest rate, a real one,
    # about 0.78/s), about 94/s, below total_floor = 100/s, so the window's total may be at most
    # 10 x 100 = 1000/s. The excess comes off the top: the made-up key keeps 1000 - real (about
    # 847/s), every real key all of its rate. alpha 0.5 and the key absent afterwards: it halves
    # in window B (huge rates there are invalid) and again in window C.
    assert 121 * sorted(steady.values())[60] < 100.0  # the floor is what counts
    made_up = 1000.0 - real
    assert max(steady.values()) < made_up  # every real key is below the level: not cut
    now_ms = int(time.time() * 1000) // WINDOW_MS * WINDOW_MS
    produce_rates(
        settings, [{**steady, "made-up": 9e5}], window_ms=WINDOW_MS, end_ms=now_ms - WINDOW_MS
    )
    _produce_hostile(settings, now_ms - WINDOW_MS)  # the bogus rates share a real window
    produce_rates(settings, [steady], window_ms=WINDOW_MS, end_ms=now_ms)
    config = _config(tmp_path / "planner.toml")
    follower = PlanFollower(settings, FollowerConfig(poll_timeout_s=0.2)).start()
    try:
        with planner_process(settings, config, "A", tmp_path) as planner:
            live = follower.wait_for_version(1, timeout=90)
            assert live is not None, planner.tail()
            # The first plan may hold window A alone (B folds after settling) or A and B. When it
            # holds A alone, the plan of A and B may never come: B does not change the routing,
            # so the advisor keeps v1 and age refreshes re-publish v1 as it is. Window C below
            # checks B's fold either way (the made-up key's rate there is a quarter).
            plan = live.plan
            if math.isclose(plan.total_rate, 1000.0, rel_tol=1e-9):
                made_up_now = made_up  # A alone
            else:
                assert plan.total_rate == pytest.approx(real + made_up / 2, rel=1e-9)
                made_up_now = made_up / 2
            assert set(plan.keys) == {*steady, "made-up"}  # no invalid key, every real one
            assert _rate_in(plan, "made-up") == pytest.approx(made_up_now, rel=1e-9)
            assert all(_rate_in(plan, k) == pytest.approx(v, rel=1e-9) for k, v in steady.items())
            assert planner.wait_metric("cacheroute_planner_rates_records_total", 3, INVALID) == 3
            assert planner.metric("cacheroute_planner_rates_records_total", CLAMPED) == 1
            assert planner.metric("cacheroute_planner_rates_records_total", SCALED) == 1
            # a new hot key in the next window is admitted: the real stream was not made "late"
            produce_rates(
                settings,
                [{**steady, "newcomer": 30.0}],
                window_ms=WINDOW_MS,
                end_ms=now_ms + WINDOW_MS,
            )
            while live.destinations_of("newcomer") is None:
                nxt = follower.wait_for_version(live.version + 1, timeout=60)
                assert nxt is not None, planner.tail()
                live = nxt
            assert planner.metric("cacheroute_planner_rates_records_total", INVALID) == 3
            assert planner.metric("cacheroute_planner_rates_records_total", 'outcome="late"') == 0
            # window C: the newcomer starts at 30/s, the made-up key halves again
            assert live.plan.total_rate == pytest.approx(real + 30.0 + made_up / 4, rel=1e-9)
            assert planner.metric("cacheroute_planner_rates_records_total", SCALED) == 1
            lag = planner.metric("cacheroute_planner_input_lag_seconds")
            assert 0.0 <= lag < 600.0  # a far-future window never made it negative
            text = planner.tail(400)
            assert "from the future" in text
            assert "'from-2100'" in text
            assert "rate above max_key_rate" in text
            flat = " ".join(text.split())  # the log wraps long lines at spaces
            assert flat.count(": reported a total of") == 1, text  # once per window
            assert "reported a total of 9.002e+05 requests/s, folded as 1000;" in flat
            assert "(no smoothed total yet)" in flat
            assert "largest cut: key 'made-up' at 9e+05/s" in flat
        # a restart while the hostile records are inside the look-back: not poisoned either
        with planner_process(settings, config, "B", tmp_path) as planner:
            assert planner.wait_metric("cacheroute_planner_rates_records_total", 3, INVALID) == 3
            after = follower.wait_for_version(live.version + 1, timeout=90)
            assert after is not None, planner.tail()
            while after.header.planner_id != "B" or after.plan.stats.keys < len(steady) + 2:
                nxt = follower.wait_for_version(after.version + 1, timeout=60)
                assert nxt is not None, planner.tail()
                after = nxt
            assert set(after.plan.keys) == {*steady, "made-up", "newcomer"}
            # the same three windows folded again from the look-back: the same cut, the same total
            assert after.plan.total_rate == pytest.approx(real + 30.0 + made_up / 4, rel=1e-9)
            assert planner.metric("cacheroute_planner_rates_records_total", CLAMPED) == 1
            assert planner.metric("cacheroute_planner_rates_records_total", SCALED) == 1
            assert after.destinations_of("newcomer") is not None
    finally:
        follower.close()
