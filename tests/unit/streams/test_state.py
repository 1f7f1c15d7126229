"""PartitionState: exact windows, lateness, malformed events, flush/restore with exact replay."""

from __future__ import annotations

import pytest

from cacheroute.planner.smoothing import SmoothingParams
from cacheroute.schemas import KeyRate, RequestBatch, RequestSummary
from cacheroute.streams.config import StreamConfig
from cacheroute.streams.state import BatchError, PartitionState

CFG = StreamConfig(window_ms=1000, grace_ms=200, reorder_ms=100, buckets=4)


def batch(
    events: list[tuple[str, int]],
    created: int | None = None,
    prompt: int = 10,
    seq: int = 0,
) -> RequestBatch:
    return RequestBatch(
        gateway_id="gw",
        seq=seq,
        created_ms=created if created is not None else max([t for _, t in events], default=0),
        keys=[k for k, _ in events],
        event_time_ms=[t for _, t in events],
        prompt_tokens=[prompt] * len(events),
    )


def heartbeat(t: int) -> RequestBatch:
    return batch([], created=t)


def rates_of(state: PartitionState) -> dict[tuple[str, int], KeyRate]:
    return {(r.key, r.window_start_ms): r for r in state.flush().rates}


def test_window_boundaries_are_exact() -> None:
    s = PartitionState(0, CFG)
    s.apply_batch(batch([("a", 999), ("a", 1000), ("a", 1999), ("a", 2000), ("b", 1500)]), 0)
    assert s.open_windows == [0, 1000, 2000]
    s.apply_batch(heartbeat(3200), 1)  # 2000 + 1000 + 200 <= 3200: windows 0..2000 close
    rates = rates_of(s)
    assert {k: r.count for k, r in rates.items()} == {
        ("a", 0): 1,
        ("a", 1000): 2,
        ("b", 1000): 1,
        ("a", 2000): 1,
    }
    assert rates[("a", 1000)].window_end_ms == 2000
    assert rates[("a", 1000)].rate == 2.0
    assert rates[("a", 1000)].interarrival_mean_ms == 999.0
    assert s.open_windows == []


def test_window_waits_for_grace_then_late_events_are_dropped_and_counted() -> None:
    s = PartitionState(0, CFG)
    s.apply_batch(batch([("a", 100), ("a", 900)]), 0)
    s.apply_batch(heartbeat(1199), 1)
    assert s.flush().rates == []  # 0 + 1000 + 200 > 1199: still open
    result = s.apply_batch(batch([("a", 950)], created=1199), 2)  # within grace: counts
    assert (result.accepted, result.late) == (1, 0)
    s.apply_batch(heartbeat(1200), 3)
    (rate,) = s.flush().rates
    assert rate.count == 3
    late = s.apply_batch(batch([("a", 500)], created=1300), 4)
    assert (late.accepted, late.late) == (0, 1)
    assert s.late_total == 1
    assert s.flush().rates == []


def test_malformed_events_are_named_and_the_rest_counts() -> None:
    s = PartitionState(0, CFG)
    b = RequestBatch(
        gateway_id="gw",
        seq=0,
        created_ms=10_000,
        keys=["ok", "", "neg", "future", "x" * 2000, "pre"],
        event_time_ms=[9_000, 9_000, 9_000, 80_000, 9_000, 9_000],
        prompt_tokens=[5, 5, -1, 5, 5, 5],
        prefix_tokens=[1, 1, 1, 1, 1, -7],
    )
    result = s.apply_batch(b, 0)
    assert result.accepted == 1
    assert [(e.index, e.reason) for e in result.bad] == [
        (1, "empty key"),
        (2, "negative prompt_tokens"),
        (3, "event time in the future of its batch"),
        (4, "key longer than 1024 bytes"),
        (5, "prefix_tokens below -1"),
    ]
    assert s.bad_total == 5


def test_token_counts_no_model_serves_are_dead_lettered_and_do_not_reach_the_rates() -> None:
    # One event claiming 2 billion prompt tokens (Avro's int allows it) would make its key most
    # of the cluster's work in a plan on work; the bound is the config's, inclusive.
    cfg = StreamConfig(window_ms=1000, grace_ms=200, reorder_ms=100, buckets=4)
    top = cfg.max_prompt_tokens
    s = PartitionState(0, cfg)
    b = RequestBatch(
        gateway_id="gw",
        seq=0,
        created_ms=500,
        keys=["a", "a", "a", "a"],
        event_time_ms=[100, 200, 300, 400],
        prompt_tokens=[1000, 2_000_000_000, top, 1000],
        prefix_tokens=[0, 0, 0, top + 1],
        cached_tokens=[0, 0, top + 1, 0],
    )
    result = s.apply_batch(b, 0)
    assert [(e.index, e.reason) for e in result.bad] == [
        (1, "prompt_tokens above max_prompt_tokens"),
        (2, "cached_tokens above max_prompt_tokens"),
        (3, "prefix_tokens above max_prompt_tokens"),
    ]
    assert result.accepted == 1
    s.apply_batch(RequestBatch("gw", 1, 1300, [], [], []), 1)  # a heartbeat closes the window
    (rate,) = s.flush().rates
    assert (rate.key, rate.count, rate.prompt_tokens_sum) == ("a", 1, 1000)
    # a gateway's per-key summary: sums above count x the bound are refused the same way
    summary = RequestSummary(
        gateway_id="gw",
        seq=2,
        created_ms=2500,
        tick_start_ms=2000,
        tick_end_ms=2500,
        keys=["ok", "huge"],
        counts=[2, 2],
        first_ms=[2100, 2100],
        last_ms=[2200, 2200],
        prompt_tokens_sum=[2 * top, 2 * top + 1],
        prefix_tokens_sum=[0, 0],
        cached_tokens_sum=[0, 0],
    )
    got = s.apply_summary(summary, 2)
    assert [(e.index, e.reason) for e in got.bad] == [
        (1, "token sums above count x max_prompt_tokens")
    ]
    assert got.accepted == 2


def test_the_per_event_token_bound_is_the_planners_ceiling_on_a_mean() -> None:
    # an event the agent accepts never alone makes a record the planner refuses as implausible
    assert StreamConfig().max_prompt_tokens == SmoothingParams().max_prompt_tokens


def test_unequal_columns_reject_the_whole_batch() -> None:
    s = PartitionState(0, CFG)
    b = RequestBatch("gw", 0, 10, ["a", "b"], [1, 2], [3])
    with pytest.raises(BatchError, match="prompt_tokens has 1 values, keys has 2"):
        s.apply_batch(b, 0)


def _run(batches: list[RequestBatch], flush_after: set[int], state: PartitionState) -> None:
    for offset, b in enumerate(batches):
        state.apply_batch(b, offset)
        if offset in flush_after:
            state.flush()


def _table_after(state: PartitionState, table: dict[bytes, bytes]) -> list[KeyRate]:
    out = state.flush()
    for k, v in out.writes:
        if v is None:
            table.pop(k, None)
        else:
            table[k] = v
    return out.rates


def test_restore_then_replay_counts_every_event_exactly_once() -> None:
    keys = [f"k{i}" for i in range(13)]
    batches = [
        batch([(keys[(i * 7 + j) % 13], 100 * i + j) for j in range(20)], seq=i) for i in range(30)
    ]
    batches.append(heartbeat(10_000))

    reference = PartitionState(0, CFG)
    _run(batches, set(), reference)
    expected = {(r.key, r.window_start_ms): r for r in reference.flush().rates}

    # crash run: flushes (and would commit) at offset 11; processes up to 20, then dies
    table: dict[bytes, bytes] = {}
    crashed = PartitionState(0, CFG)
    collected: list[KeyRate] = []
    for offset, b in enumerate(batches[:21]):
        crashed.apply_batch(b, offset)
        if offset in (5, 11, 17):
            collected += _table_after(crashed, table)
    # committed offset was 11 at best: Faust re-delivers from 12 (here even from 6, to be strict)
    restored = PartitionState.restore(0, CFG, table.items())
    for offset in range(6, len(batches)):
        restored.apply_batch(batches[offset], offset)
    collected += _table_after(restored, table)
    got = {(r.key, r.window_start_ms): r for r in collected}
    assert got == expected
    assert restored.replayed_total > 0
    assert all(not k.split(b"|")[1].isdigit() for k in table)  # only meta left


def test_summaries_give_the_same_rates_as_events() -> None:
    events = [("a", 10), ("a", 300), ("b", 400), ("a", 900), ("b", 950)]
    by_events = PartitionState(0, CFG)
    by_events.apply_batch(batch(events, prompt=7), 0)
    by_events.apply_batch(heartbeat(5000), 1)
    summary = RequestSummary(
        gateway_id="gw",
        seq=0,
        created_ms=1000,
        tick_start_ms=0,
        tick_end_ms=1000,
        keys=["a", "b"],
        counts=[3, 2],
        first_ms=[10, 400],
        last_ms=[900, 950],
        prompt_tokens_sum=[21, 14],
        prefix_tokens_sum=[0, 0],
        cached_tokens_sum=[0, 0],
    )
    by_summary = PartitionState(0, CFG)
    by_summary.apply_summary(summary, 0)
    by_summary.apply_batch(heartbeat(5000), 1)
    a = {r.key: r for r in by_events.flush().rates}
    b = {r.key: r for r in by_summary.flush().rates}
    for key in ("a", "b"):
        assert (a[key].count, a[key].rate, a[key].interarrival_mean_ms) == (
            b[key].count,
            b[key].rate,
            b[key].interarrival_mean_ms,
        )
        assert a[key].prompt_tokens_sum == b[key].prompt_tokens_sum


def test_flush_writes_buckets_then_meta_and_tombstones_closed_windows() -> None:
    s = PartitionState(3, CFG)
    s.apply_batch(batch([("a", 10), ("b", 20)]), 0)
    first = s.flush()
    assert first.writes[-1][0] == b"3|meta"
    bucket_keys = [k for k, v in first.writes[:-1]]
    assert bucket_keys
    assert all(k.startswith(b"3|0|") for k in bucket_keys)
    s.apply_batch(heartbeat(1200), 1)
    second = s.flush()
    tombstones = [k for k, v in second.writes if v is None]
    assert sorted(tombstones) == sorted(bucket_keys)
    assert second.closed_windows == [0]
