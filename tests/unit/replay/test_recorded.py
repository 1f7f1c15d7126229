"""Recorded request records -> a replayable RequestSet, and the hit rate the engines served.

Every expected value below is worked out by hand from the records the test writes.
"""

from __future__ import annotations

import numpy as np
import pytest

from cacheroute.replay.errors import ReplayError
from cacheroute.replay.recorded import RecordedTraffic
from cacheroute.replay.sources import SourceSpec, load_source
from cacheroute.schemas import KeyRate, RequestBatch, RequestEvent, RequestSummary


def _batch(gateway: str, times: list[int], **columns: object) -> RequestBatch:
    n = len(times)
    return RequestBatch(
        gateway_id=gateway,
        seq=0,
        created_ms=max(times) if times else 0,
        keys=columns.pop("keys", [f"k{i}" for i in range(n)]),  # type: ignore[arg-type]
        event_time_ms=times,
        prompt_tokens=columns.pop("prompt", [100] * n),  # type: ignore[arg-type]
        **columns,  # type: ignore[arg-type]
    )


def _two_gateways() -> RecordedTraffic:
    """Gateway A records turn 1 of conversation c1 and a request of c2; gateway B turn 2 of c1.

    Blocks are 10 tokens. c1 turn 1: 25 tokens, hashes [11, 12] (2 full blocks); c1 turn 2:
    47 tokens, hashes [11, 12, 13, 14]; c2: 30 tokens, hashes [11, 99, 98] (shares block 0 only).
    """
    out = RecordedTraffic()
    out.add(
        _batch(
            "gw-a",
            [1_000_500, 1_000_000],
            keys=["c2", "c1"],
            prompt=[30, 25],
            cached_tokens=[10, 0],
            destinations=["d1", "d0"],
            prefix_block_hashes=[[11, 99, 98], [11, 12]],
        )
    )
    out.add(
        RequestEvent(
            key="c1",
            event_time_ms=1_002_000,
            gateway_id="gw-b",
            prompt_tokens=47,
            prefix_block_hashes=[11, 12, 13, 14, 15],  # one hash past its 4 full blocks
            destination="d0",
            cached_tokens=20,
        )
    )
    return out


def test_requests_come_out_in_time_order_with_their_recorded_columns() -> None:
    q = _two_gateways().request_set(block_tokens=10, output_tokens=7)
    assert q.times.tolist() == [0.0, 0.5, 2.0]
    assert [q.keys[k] for k in q.key_index.tolist()] == ["c1", "c2", "c1"]
    assert q.prompt_tokens.tolist() == [25, 30, 47]
    assert q.output_tokens.tolist() == [7, 7, 7]
    assert q.block_tokens == 10


def test_blocks_keep_their_identity_and_are_cut_to_full_blocks() -> None:
    q = _two_gateways().request_set(block_tokens=10)
    blocks = [q.blocks_of(i).tolist() for i in range(q.n)]
    # dense ids: 11 -> 0, 12 -> 1, 13 -> 2, 14 -> 3, 98 -> 4, 99 -> 5; hash 15 is cut (47 // 10)
    assert blocks == [[0, 1], [0, 5, 4], [0, 1, 2, 3]]


def test_the_declared_prefix_is_the_leading_blocks_seen_before() -> None:
    q = _two_gateways().request_set(block_tokens=10)
    # c1 turn 1: nothing seen; c2: block 11 seen (10 tokens); c1 turn 2: 11, 12 seen (20)
    assert q.prefix_tokens.tolist() == [0, 10, 20]


def test_a_declared_prefix_wins_over_the_derived_one() -> None:
    out = RecordedTraffic()
    out.add(_batch("g", [5, 6], prefix_tokens=[-1, 40], prefix_block_hashes=[[1, 2], [1, 2]]))
    assert out.request_set(block_tokens=10).prefix_tokens.tolist() == [0, 40]


def test_served_hit_rate_counts_only_requests_that_reported_usage() -> None:
    traffic = _two_gateways()
    traffic.add(_batch("gw-a", [1_003_000], keys=["c3"], prompt=[1000]))  # no usage reported
    served = traffic.served()
    assert served.requests == 4
    assert served.reported == 3
    assert served.hit_rate == pytest.approx((10 + 0 + 20) / (30 + 25 + 47))
    assert served.gateways == ("gw-a", "gw-b")
    assert served.destinations == ("d0", "d1")


def test_no_usage_anywhere_means_no_served_hit_rate() -> None:
    out = RecordedTraffic()
    out.add(_batch("g", [1, 2]))
    assert out.served().hit_rate is None
    assert out.served().reported == 0


def test_the_time_range_keeps_events_from_from_ms_up_to_before_to_ms() -> None:
    out = RecordedTraffic(from_ms=1_000_500, to_ms=1_002_000)
    for record in (_batch("g", [1_000_000, 1_000_500, 1_001_999, 1_002_000]),):
        out.add(record)
    assert out.times_ms == [1_000_500, 1_001_999]
    assert out.outside == 2


def test_summaries_and_other_records_are_counted_never_invented() -> None:
    out = RecordedTraffic()
    out.add(_batch("g", [10]))
    out.add(
        RequestSummary(
            gateway_id="g",
            seq=1,
            created_ms=20,
            tick_start_ms=0,
            tick_end_ms=20,
            keys=["a", "b"],
            counts=[3, 4],
            first_ms=[11, 12],
            last_ms=[15, 16],
            prompt_tokens_sum=[300, 400],
            prefix_tokens_sum=[0, 0],
            cached_tokens_sum=[0, 0],
        )
    )
    out.add(KeyRate("a", 0, 1000, 1, 1.0))
    q = out.request_set(block_tokens=10)
    assert q.n == 1
    assert out.summarised == 7
    assert out.other_records == 1
    assert any("7 requests recorded only in pre-aggregated summaries" in n for n in q.notes)
    assert any("1 of 1 requests of a block or more recorded without" in n for n in q.notes)


def test_nothing_recorded_is_a_clear_error() -> None:
    with pytest.raises(ReplayError, match="no request events"):
        RecordedTraffic().request_set(block_tokens=10, source="topic x")


def test_a_prompt_shorter_than_a_block_is_not_missing_its_hashes() -> None:
    out = RecordedTraffic()
    out.add(_batch("g", [1, 2], prompt=[9, 10]))
    notes = out.request_set(block_tokens=10).notes
    assert any("1 of 2 requests of a block or more recorded without" in n for n in notes)


def test_a_prompt_of_zero_tokens_replays_as_one() -> None:
    out = RecordedTraffic()
    out.add(_batch("g", [1], prompt=[0]))
    assert out.request_set(block_tokens=10).prompt_tokens.tolist() == [1]


def test_recorded_requests_are_tiled_as_a_trace_is() -> None:
    q = _two_gateways().request_set(block_tokens=10)
    spec = SourceSpec(recorded=q, recorded_from="topic t", requests=9, seed=3)
    tiled = load_source(spec)
    assert tiled.n == 9  # three copies of three requests
    assert np.array_equal(np.sort(tiled.prompt_tokens), np.repeat([25, 30, 47], 3))
    assert spec.describe() == {"recorded": "topic t", "requests_recorded": 3}
    assert load_source(SourceSpec(recorded=q, requests=3)) is q
    cut = load_source(SourceSpec(recorded=q, requests=2))  # more than asked for: the first ones
    assert cut.times.tolist() == [0.0, 0.5]
    assert cut.notes[-1] == "first 2 of the 3 requests (--requests for more)"


def test_events_the_streams_agent_dead_letters_are_left_out_and_named() -> None:
    # An empty key used to stop the whole evaluation ("routing keys must be non-empty strings")
    # and a negative prompt was replayed as a 1-token request.
    out = RecordedTraffic()
    out.add(
        _batch(
            "g",
            [1, 2, 3, 4, 5],
            keys=["a", "", "b", "c", "d"],
            prompt=[100, 100, -5, 100, 100],
            prefix_tokens=[-1, -1, -1, -7, -1],
            cached_tokens=[-1, -1, -1, -1, -2],
        )
    )
    q = out.request_set(block_tokens=10)
    assert [q.keys[k] for k in q.key_index.tolist()] == ["a"]
    assert out.malformed == 4
    assert any("left out 4 malformed request events" in note for note in q.notes)
    assert out.served().requests == 1
    nothing = RecordedTraffic()
    nothing.add(_batch("g", [1], keys=[""]))
    with pytest.raises(ReplayError, match=r"no request events in the range read \(1 malformed\)"):
        nothing.request_set(block_tokens=10)
