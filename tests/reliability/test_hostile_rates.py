"""Hostile KeyRate records against `cacheroute planner run` on the real broker.

One record from the future (a window in 2100) or two rates of 1e308 must not poison the planner:
the records are counted `invalid` and logged with their reason, the real windows keep folding, a
new hot key is still admitted, no plan ever holds a bogus key or a non-finite total, and a planner
restarted while the records are inside its look-back is not poisoned either.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import orjson
import pytest
from confluent_kafka import Producer

from cacheroute.kafkaio import producer_config
from cacheroute.planservice.follower import FollowerConfig, PlanFollower
from cacheroute.schemas import KeyRate, codec_for
from cacheroute.settings import Settings
from cacheroute.topics import ensure_topics
from tests.integration.planservice_support import planner_process, produce_rates

WINDOW_MS = 10_000
YEAR_2100_MS = 4_102_444_800_000
INVALID = 'outcome="invalid"'


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


def test_future_windows_and_huge_rates_never_reach_a_plan(
    settings: Settings, tmp_path: Path
) -> None:
    ensure_topics(settings)
    rng = np.random.default_rng(5)
    # the same rates in every window: the smoothed rate of a key is exactly its window rate
    steady = {f"key-{i:03d}": float(r) for i, r in enumerate(rng.lognormal(0.0, 1.0, 120))}
    now_ms = int(time.time() * 1000) // WINDOW_MS * WINDOW_MS
    produce_rates(settings, [steady], window_ms=WINDOW_MS, end_ms=now_ms - WINDOW_MS)
    _produce_hostile(settings, now_ms - WINDOW_MS)  # the bogus rates share a real window
    produce_rates(settings, [steady], window_ms=WINDOW_MS, end_ms=now_ms)
    config = _config(tmp_path / "planner.toml")
    follower = PlanFollower(settings, FollowerConfig(poll_timeout_s=0.2)).start()
    try:
        with planner_process(settings, config, "A", tmp_path) as planner:
            live = follower.wait_for_version(1, timeout=90)
            assert live is not None, planner.tail()
            while live.plan.stats.keys < len(steady):  # the newest window folds after settling
                live = follower.wait_for_version(live.version + 1, timeout=60)
                assert live is not None, planner.tail()
            plan = live.plan
            assert set(plan.keys) == set(steady)  # no bogus key, every real one
            assert plan.total_rate == pytest.approx(sum(steady.values()), rel=1e-9)
            assert planner.wait_metric("cacheroute_planner_rates_records_total", 3, INVALID) == 3
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
            text = planner.tail(400)
            assert "from the future" in text
            assert "'from-2100'" in text
            assert "rate above max_key_rate" in text
        # a restart while the hostile records are inside the look-back: not poisoned either
        with planner_process(settings, config, "B", tmp_path) as planner:
            assert planner.wait_metric("cacheroute_planner_rates_records_total", 3, INVALID) == 3
            after = follower.wait_for_version(live.version + 1, timeout=90)
            assert after is not None, planner.tail()
            while after.header.planner_id != "B" or after.plan.stats.keys < len(steady) + 1:
                nxt = follower.wait_for_version(after.version + 1, timeout=60)
                assert nxt is not None, planner.tail()
                after = nxt
            assert set(after.plan.keys) == {*steady, "newcomer"}
            assert np.isfinite(after.plan.total_rate)
            assert after.destinations_of("newcomer") is not None
    finally:
        follower.close()
