"""Summary mode: per-key tick aggregates, and rates equal to those computed from individual events."""

from __future__ import annotations

from collections import defaultdict

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cacheroute.dispatcher.emitter.summary import TickAccumulator, summary_from
from cacheroute.schemas import RequestSummary, codec_for
from tests.unit.dispatcher.fakes import FakeProducer
from tests.unit.dispatcher.helpers import batches, make_emitter, summaries

TICK = 1000
WINDOW = 2 * TICK  # the agent's windows are made of whole ticks

Event = tuple[str, int, int, int | None, int | None]  # key, time, prompt, prefix, cached
Stats = dict[tuple[int, str], tuple[int, int, int, int, int, int]]


def test_add_aggregates_per_key_and_tick() -> None:
    acc = TickAccumulator(TICK)
    new = [
        acc.add("a", 5_100, 10, 4, -1),
        acc.add("b", 5_200, 20, -1, 7),
        acc.add("a", 5_050, 30, -1, 2),  # earlier than the first one seen
        acc.add("a", 5_900, 40, 6, -1),
        acc.add("a", 6_000, 50, -1, -1),  # next tick
    ]
    assert new == [1, 1, 0, 0, 1]
    assert len(acc) == 3
    assert acc.due(5_999) == []
    assert acc.due(6_000) == [5_000]
    rows = acc.pop(5_000)
    assert rows == {"a": [3, 5_050, 5_900, 80, 10, 2], "b": [1, 5_200, 5_200, 20, 0, 7]}
    assert len(acc) == 1
    assert acc.due(10**6) == [6_000]
    assert acc.add("a", 6_500, 1, -1, -1) == 0  # an existing row grows
    assert acc.add("a", 5_500, 1, -1, -1) == 1  # a late event re-opens a popped tick
    assert acc.ticks[5_000] == {"a": [1, 5_500, 5_500, 1, 0, 0]}


def test_summary_record_round_trips_and_is_never_older_than_its_events() -> None:
    rows = [("a", [3, 5_050, 5_900, 80, 10, 2]), ("b", [1, 5_200, 5_200, 20, 0, 7])]
    summary = summary_from("gw", 4, 5_500, tick_start=5_000, tick_ms=TICK, rows=rows)
    assert summary == RequestSummary(
        gateway_id="gw",
        seq=4,
        created_ms=5_900,  # flushed before the tick ended: still not older than its last event
        tick_start_ms=5_000,
        tick_end_ms=6_000,
        keys=["a", "b"],
        counts=[3, 1],
        first_ms=[5_050, 5_200],
        last_ms=[5_900, 5_200],
        prompt_tokens_sum=[80, 20],
        prefix_tokens_sum=[10, 0],
        cached_tokens_sum=[2, 7],
    )
    codec = codec_for(RequestSummary)
    assert codec.decode(codec.encode(summary)) == summary


def _drive(mode: str, events: list[Event], producer: FakeProducer) -> None:
    """Emit `events` in time order with the clock at each event's time, pumping as time passes."""
    emitter, _, clock = make_emitter(producer=producer, mode=mode, tick_ms=TICK)
    for key, t, prompt, prefix, cached in events:
        if t > clock.now:
            clock.now = t
            emitter.pump()
        assert emitter.emit(
            key, prompt, prefix_tokens=prefix, cached_tokens=cached, event_time_ms=t
        )
    clock.now += 3 * TICK
    emitter.pump()  # all ticks are over: summary mode seals them without a flush
    assert emitter.flush()
    stats = emitter.stats()
    assert stats.events_sent == len(events)
    assert stats.buffered == 0


def _from_events(producer: FakeProducer) -> Stats:
    acc: dict[tuple[int, str], list[int]] = {}
    for batch in batches(producer):
        for e in batch.events():
            row = acc.setdefault(
                (e.event_time_ms - e.event_time_ms % WINDOW, e.key), [0, 2**63, -1, 0, 0, 0]
            )
            row[0] += 1
            row[1] = min(row[1], e.event_time_ms)
            row[2] = max(row[2], e.event_time_ms)
            row[3] += e.prompt_tokens
            row[4] += e.prefix_tokens or 0
            row[5] += e.cached_tokens or 0
    return {k: (v[0], v[1], v[2], v[3], v[4], v[5]) for k, v in acc.items()}


def _from_summaries(producer: FakeProducer) -> Stats:
    acc: dict[tuple[int, str], list[int]] = defaultdict(lambda: [0, 2**63, -1, 0, 0, 0])
    for s in summaries(producer):
        assert s.tick_end_ms - s.tick_start_ms == TICK
        for i, key in enumerate(s.keys):
            row = acc[(s.tick_start_ms - s.tick_start_ms % WINDOW, key)]
            row[0] += s.counts[i]
            row[1] = min(row[1], s.first_ms[i])
            row[2] = max(row[2], s.last_ms[i])
            row[3] += s.prompt_tokens_sum[i]
            row[4] += s.prefix_tokens_sum[i]
            row[5] += s.cached_tokens_sum[i]
    return {k: (v[0], v[1], v[2], v[3], v[4], v[5]) for k, v in acc.items()}


_events = st.lists(
    st.tuples(
        st.sampled_from(["a", "b", "conv-1", "conv-2", "x" * 30]),
        st.integers(0, 700),  # gap to the previous event, ms
        st.integers(0, 5000),
        st.none() | st.integers(0, 5000),
        st.none() | st.integers(0, 5000),
    ),
    max_size=200,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_events)
def test_rates_from_summaries_equal_rates_from_events(
    raw: list[tuple[str, int, int, int | None, int | None]],
) -> None:
    t = 1_700_000_000_000
    events: list[Event] = []
    for key, gap, prompt, prefix, cached in raw:
        t += gap
        events.append((key, t, prompt, prefix, cached))
    by_events, by_summaries = FakeProducer(), FakeProducer()
    _drive("events", events, by_events)
    _drive("summary", events, by_summaries)
    from_events = _from_events(by_events)
    assert _from_summaries(by_summaries) == from_events
    rates = {k: v[0] / (WINDOW / 1000) for k, v in from_events.items()}
    assert sum(rates.values()) * WINDOW / 1000 == len(events)


def test_late_events_of_a_sealed_tick_add_a_second_summary_and_keep_rates() -> None:
    emitter, producer, clock = make_emitter(mode="summary", tick_ms=TICK)
    start = clock.now - clock.now % TICK
    clock.now = start + 10
    emitter.emit("a", 1)
    clock.now = start + TICK  # tick over
    emitter.pump()
    emitter.emit("a", 2, event_time_ms=start + 500)  # arrives after its tick was sealed
    assert emitter.flush()
    sent = summaries(producer)
    assert [(s.tick_start_ms, s.counts, s.seq) for s in sent] == [(start, [1], 0), (start, [1], 1)]
    assert sum(s.prompt_tokens_sum[0] for s in sent) == 3


def test_summary_memory_grows_with_keys_not_events() -> None:
    emitter, producer, clock = make_emitter(mode="summary", max_buffered_events=50)
    for i in range(5000):
        assert emitter.emit(f"k{i % 5}", 1)
        if i % 40 == 39:
            emitter.pump()  # folds buffered events into 5 rows per tick
        if i % 1000 == 999:
            clock.advance(TICK)
    assert emitter.stats().dropped == 0
    assert emitter.flush()
    assert sum(sum(s.counts) for s in summaries(producer)) == 5000
    assert batches(producer) == []
