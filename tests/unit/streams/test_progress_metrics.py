"""The worker's Unix-time gauges: when it began, last handled a message, last emitted rates.

`bench streams` times the agent by them (a scrape every 20 ms had cost the worker ~8% of its
CPU), and an operator reads how stale the rates are from the last one.
"""

from __future__ import annotations

import asyncio
import time

from .fakes import CFG, T0, event, make_runtime
from .fakes import gw0_batch as _batch


def _gauge(runtime: object, name: str) -> float:
    value = runtime.metrics.registry.get_sample_value(name)  # type: ignore[attr-defined]
    assert value is not None
    return float(value)


def test_first_batch_is_kept_and_rates_time_moves_only_when_rates_are_emitted() -> None:
    runtime, _ = make_runtime()
    first = "cacheroute_streams_first_batch_timestamp_seconds"
    rates = "cacheroute_streams_last_rates_timestamp_seconds"
    assert _gauge(runtime, first) == 0.0
    before = time.time()
    runtime.handle(event(runtime, 0, _batch([("a", T0 + 100)], T0 + 150), partition=0))
    after = time.time()
    began = _gauge(runtime, first)
    assert before - 1e-3 <= began <= after + 1e-3  # ms resolution: the handler's clock
    runtime.handle(event(runtime, 1, _batch([("b", T0 + 200)], T0 + 250), partition=0))
    assert _gauge(runtime, first) == began  # the first batch's time, kept
    asyncio.run(runtime.flush_partitions([0]))  # nothing closed yet: no rates
    assert _gauge(runtime, rates) == 0.0
    # an event past the window and its grace moves the watermark on: the window closes
    late = T0 + CFG.window_ms + CFG.grace_ms + 1
    runtime.handle(event(runtime, 2, _batch([("c", late)], late), partition=0))
    before = time.time()
    asyncio.run(runtime.flush_partitions([0]))
    after = time.time()
    assert before <= _gauge(runtime, rates) <= after


def test_batch_done_records_the_latest_time() -> None:
    runtime, _ = make_runtime()
    runtime.metrics.batch_done(10.5)
    runtime.metrics.batch_done(12.25)
    assert _gauge(runtime, "cacheroute_streams_last_batch_timestamp_seconds") == 12.25
