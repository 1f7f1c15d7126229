"""Skewed and hostile clocks in PartitionState: hand-computed answers for the bounds on created_ms,
event times, summaries and a restored watermark.

Config of every test: 1 s windows, 200 ms grace, 50 ms allowed ahead of the trusted clock.
"""

from __future__ import annotations

import pytest

from cacheroute.schemas import RequestBatch, RequestSummary
from cacheroute.schemas.codec import dump_json, load_json
from cacheroute.streams.config import StreamConfig
from cacheroute.streams.metrics import StreamMetrics
from cacheroute.streams.state import ClockError, PartitionState

CFG = StreamConfig(window_ms=1000, grace_ms=200, reorder_ms=100, buckets=4, max_clock_ahead_ms=50)
Y2100 = 4_102_444_800_000  # 2100-01-01T00:00:00Z


def batch(events: list[tuple[str, int]], created: int, gw: str = "gw") -> RequestBatch:
    return RequestBatch(
        gateway_id=gw,
        seq=0,
        created_ms=created,
        keys=[k for k, _ in events],
        event_time_ms=[t for _, t in events],
        prompt_tokens=[10] * len(events),
    )


def counts(state: PartitionState) -> dict[tuple[str, int], int]:
    return {(r.key, r.window_start_ms): r.count for r in state.flush().rates}


def test_empty_heartbeat_from_2100_is_rejected_and_does_not_move_the_watermark() -> None:
    s = PartitionState(0, CFG)
    first = s.apply_batch(batch([("a", 1100), ("a", 1500)], 1600), 0, clock_ms=1700)
    assert first.accepted == 2
    assert s.watermark == 1600
    with pytest.raises(ClockError) as caught:
        s.apply_batch(batch([], Y2100), 1, clock_ms=1700)
    assert caught.value.gateway_id == "gw"
    assert caught.value.ahead_ms == Y2100 - 1700
    assert str(caught.value) == (
        "created_ms 4102444800000 is 4.1e+09 s ahead of the broker timestamp 1700; "
        "gateway clock skew? (an empty batch)"
    )
    assert s.watermark == 1600  # unpoisoned: the next event of window 1000 still counts
    later = s.apply_batch(batch([("a", 1900)], 2000), 2, clock_ms=2100)
    assert (later.accepted, later.late) == (1, 0)
    s.apply_batch(batch([], 2200), 3, clock_ms=2300)  # 1000 + 1000 + 200 <= 2200: closes
    assert counts(s) == {("a", 1000): 3}


def test_heartbeat_ahead_by_exactly_the_margin_is_trusted_one_ms_more_is_not() -> None:
    s = PartitionState(0, CFG)
    s.apply_batch(batch([], 1050), 0, clock_ms=1000)
    assert s.watermark == 1050
    with pytest.raises(ClockError):
        s.apply_batch(batch([], 1101), 1, clock_ms=1050)
    assert s.watermark == 1050


def test_batch_with_a_header_ahead_is_reanchored_and_its_events_judged_one_by_one() -> None:
    """created_ms 4950 against a clock of 1250 (limit 1300): events at 1000..1300 count, 1301 and
    4950 are dead-lettered alone, and the watermark becomes 1300, the newest counted event."""
    s = PartitionState(0, CFG)
    b = batch([("a", 1000), ("a", 1100), ("b", 4950), ("a", 1300), ("c", 1301)], 4950)
    result = s.apply_batch(b, 0, clock_ms=1250, clock_name="Kafka timestamp")
    assert result.accepted == 3
    assert result.header_ahead_ms == 3700
    assert result.future == 2
    assert [(e.index, e.ahead_ms) for e in result.bad] == [(2, 3700), (4, 51)]
    assert result.bad[0].reason == (
        "event time 4950 is 3.7 s ahead of the Kafka timestamp 1250; gateway clock skew?"
    )
    assert s.watermark == 1300
    assert (s.accepted_total, s.future_total, s.bad_total) == (3, 2, 2)
    s.apply_batch(batch([], 2200), 1, clock_ms=2200)
    assert counts(s) == {("a", 1000): 3}


def test_reanchored_batch_judges_the_past_against_the_clock_not_the_bad_header() -> None:
    """Against its 2100 header an event of 1000 would be 'too far in the past' (max_past_ms is a
    day); against the trusted clock 1250 it is fine and counts."""
    s = PartitionState(0, CFG)
    result = s.apply_batch(batch([("a", 1000)], Y2100), 0, clock_ms=1250)
    assert (result.accepted, result.bad, result.header_ahead_ms) == (1, [], Y2100 - 1250)
    assert s.watermark == 1000


def test_without_a_clock_nothing_is_bounded_as_before() -> None:
    s = PartitionState(0, CFG)
    s.apply_batch(batch([], Y2100), 0)
    assert s.watermark == Y2100


def test_every_event_of_a_gateway_ten_minutes_ahead_is_future_dated() -> None:
    now = 1_800_000_000_000
    s = PartitionState(0, CFG)
    ahead = [("k", now + 600_000 + i) for i in range(4)]
    result = s.apply_batch(batch(ahead, now + 600_010, gw="gw-fast"), 0, clock_ms=now)
    assert (result.accepted, result.future, result.header_ahead_ms) == (0, 4, 600_010)
    assert [e.ahead_ms for e in result.bad] == [600_000, 600_001, 600_002, 600_003]
    assert s.watermark == -1
    punctual = s.apply_batch(batch([("k", now - 10)], now), 1, clock_ms=now + 5)
    assert (punctual.accepted, punctual.late) == (1, 0)


def test_late_events_report_their_indices_and_how_far_behind_they_are() -> None:
    """Watermark 3000: window 0 (closes at 1200) and 1000 (2200) are past; 2000 (3200) is not."""
    s = PartitionState(0, CFG)
    s.apply_batch(batch([], 3000), 0, clock_ms=3000)
    result = s.apply_batch(
        batch([("a", 500), ("b", 2900), ("c", 1700), ("d", 2000)], 3000, gw="gw-slow"),
        1,
        clock_ms=3000,
    )
    assert (result.accepted, result.late) == (2, 2)
    assert result.late_index == [0, 2]
    assert result.late_behind_ms == 2500  # 3000 - 500
    assert s.late_total == 2


def test_a_gateway_ten_minutes_behind_has_every_event_late_and_moves_nothing() -> None:
    now = 1_800_000_000_000
    s = PartitionState(0, CFG)
    s.apply_batch(batch([("k", now - 5)], now, gw="gw-ok"), 0, clock_ms=now)
    behind = [("k", now - 600_000 + i) for i in range(3)]
    result = s.apply_batch(batch(behind, now - 599_990, gw="gw-slow"), 1, clock_ms=now + 10)
    assert (result.accepted, result.late, result.late_index) == (0, 3, [0, 1, 2])
    assert result.late_behind_ms == 600_000
    assert s.watermark == now


def _summary(
    keys: list[str], counts_: list[int], first: list[int], last: list[int], created: int
) -> RequestSummary:
    n = len(keys)
    return RequestSummary(
        gateway_id="gw-sum",
        seq=0,
        created_ms=created,
        tick_start_ms=min(first, default=created),
        tick_end_ms=created,
        keys=keys,
        counts=counts_,
        first_ms=first,
        last_ms=last,
        prompt_tokens_sum=[10] * n,
        prefix_tokens_sum=[0] * n,
        cached_tokens_sum=[0] * n,
    )


def test_summaries_are_bounded_like_batches() -> None:
    s = PartitionState(0, CFG)
    with pytest.raises(ClockError):
        s.apply_summary(_summary([], [], [], [], Y2100), 0, clock_ms=1000)
    assert s.watermark == -1
    mixed = _summary(["a", "b", "c"], [3, 4, 5], [1000, 1010, 1020], [1040, Y2100, 1050], Y2100)
    result = s.apply_summary(mixed, 1, clock_ms=1000)
    assert result.accepted == 8  # a (3) + c (5)
    assert result.future == 4  # b's four requests
    assert [(e.index, e.ahead_ms) for e in result.bad] == [(1, Y2100 - 1000)]
    assert result.header_ahead_ms == Y2100 - 1000
    assert s.watermark == -1  # the header is not trusted; summaries move it only by header
    s.apply_summary(_summary([], [], [], [], 2200), 2, clock_ms=2200)
    assert counts(s) == {("a", 1000): 3, ("c", 1000): 5}


def test_late_summary_entries_are_indexed() -> None:
    s = PartitionState(0, CFG)
    s.apply_batch(batch([], 3000), 0, clock_ms=3000)
    result = s.apply_summary(_summary(["a", "b"], [2, 6], [100, 2500], [150, 2600], 3000), 1)
    assert (result.accepted, result.late, result.late_index) == (6, 2, [0])
    assert result.late_behind_ms == 2900


def _poisoned_table() -> dict[bytes, bytes]:
    """The changelog the old code left: window 1000 held "a" (offset 0), then a batch dated 2100
    (offset 1, applied without a clock bound) closed it and opened a window in 2100."""
    old = PartitionState(0, CFG)
    table: dict[bytes, bytes] = {}
    old.apply_batch(batch([("a", 1100)], 1200), 0)
    old.apply_batch(batch([("z", Y2100 + 500)], Y2100 + 600), 1)
    for key, value in old.flush().writes:
        if value is None:
            table.pop(key, None)
        else:
            table[key] = value
    assert load_json(table[b"0|meta"]) == {"watermark": Y2100 + 600, "offset": 1}
    return table


def test_restore_discards_a_watermark_from_the_future_and_the_windows_dated_there() -> None:
    table = _poisoned_table()
    future_keys = sorted(k for k in table if k.startswith(b"0|%d|" % Y2100))
    assert len(future_keys) == 1
    s = PartitionState.restore(0, CFG, table.items(), now_ms=10_000)
    assert s.watermark == -1  # no restored window left to vouch for a time
    assert s.open_windows == []
    assert s.restore_warning is not None
    assert "watermark 4102444800600 is 4.1e+09 s ahead of now (10000)" in s.restore_warning
    assert "dropped 1 window(s) dated in the future" in s.restore_warning
    # re-delivered: offset 0 was counted before (its window closed since): not again
    again = s.apply_batch(batch([("a", 1100)], 1200), 0, clock_ms=9_000)
    assert (again.accepted, again.replayed, again.late) == (0, 1, 0)
    # offset 1, the culprit: its event is now dead-lettered, its header ignored
    culprit = s.apply_batch(batch([("z", Y2100 + 500)], Y2100 + 600), 1, clock_ms=9_000)
    assert (culprit.accepted, culprit.future, s.watermark) == (0, 1, 1200)
    # new events count again
    assert s.apply_batch(batch([("b", 2500)], 2600), 2, clock_ms=9_000).accepted == 1
    s.apply_batch(batch([], 3300), 3, clock_ms=9_000)
    out = s.flush()
    assert {(r.key, r.window_start_ms): r.count for r in out.rates} == {("b", 2000): 1}
    deleted = [k for k, v in out.writes if v is None]
    assert future_keys[0] in deleted
    assert load_json(dict(out.writes)[b"0|meta"]) == {"watermark": 3300, "offset": 3}  # type: ignore[arg-type]


def test_restore_keeps_a_watermark_within_the_margin_and_restarts_from_restored_events() -> None:
    s = PartitionState(0, CFG)
    s.apply_batch(batch([("a", 1100), ("a", 1400)], 1500), 0)
    table = {k: v for k, v in s.flush().writes if v is not None}
    kept = PartitionState.restore(0, CFG, table.items(), now_ms=1450)  # 1500 <= 1450 + 50
    assert (kept.watermark, kept.restore_warning) == (1500, None)
    table[b"0|meta"] = dump_json({"watermark": 9_999_999, "offset": 0})
    healed = PartitionState.restore(0, CFG, table.items(), now_ms=1450)
    assert healed.watermark == 1400  # the newest event the restored window holds
    assert healed.open_windows == [1000]
    assert healed.restore_warning is not None
    assert "dropped" not in healed.restore_warning


def test_gateway_labels_are_bounded() -> None:
    m = StreamMetrics.create(max_gateway_labels=2)
    assert [m.gateway(g) for g in ("gw-a", "gw-b", "gw-c", "gw-a", "other")] == [
        "gw-a",
        "gw-b",
        "other",
        "gw-a",
        "other",
    ]
