"""The columnar `PartitionState` against the per-event one it replaced (oracle_state.py).

Random multi-gateway input - out of order within and beyond the reorder horizon, late events,
clocks behind and ahead, malformed events, summaries, flushes, crashes with restore from each
one's own changelog entries (or the columnar state from the oracle's per-key entries: an upgrade)
and re-delivery of the messages after (and some before) the last flush - must give the same `KeyRate` records bit for bit, the same accepted / late / replayed /
bad / future counts, the same watermark and the same table keys written.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from cacheroute.schemas import RequestBatch, RequestSummary, codec_for
from cacheroute.schemas.batch_scan import scan_request_batch
from cacheroute.streams.config import StreamConfig
from cacheroute.streams.state import ClockError, PartitionState

from . import oracle_state

CFG = StreamConfig(
    window_ms=1000,
    grace_ms=300,
    reorder_ms=100,
    buckets=4,
    max_future_ms=2000,
    max_clock_ahead_ms=300,
)
KEYS = ["a", "b", "tenant-1/c", "tenant-1/d", "é-long", "k5", "k6", "", "x" * 1100]
"""Two malformed keys (empty, over max_key_bytes) among good ones."""
SKEW = [0, -450, 700]
"""Per gateway clock offset, ms: punctual, behind (its events turn late), ahead (future-dated)."""


@dataclass
class Twin:
    """The two implementations fed the same messages, each with its own table."""

    new: Any
    old: Any
    table_new: dict[bytes, bytes]
    table_old: dict[bytes, bytes]


def _results(res: Any) -> tuple[Any, ...]:
    return (
        res.accepted,
        res.late,
        res.replayed,
        res.future,
        res.header_ahead_ms,
        res.late_behind_ms,
        list(res.late_index),
        [(b.index, b.reason, b.ahead_ms) for b in res.bad],
    )


def _apply(
    state: Any, record: Any, offset: int, clock: int, *, scanned: bool = False
) -> tuple[Any, ...]:
    try:
        if isinstance(record, RequestBatch):
            if scanned:
                # the agent's path: the record's bytes read into columns, when that reader
                # takes it and every event is good (else None: the decoded path, as the agent)
                read = scan_request_batch(codec_for(RequestBatch).encode(record))
                done = None if read is None else state.apply_scanned(read, offset, clock_ms=clock)
                if done is not None:
                    return _results(done)
            return _results(state.apply_batch(record, offset, clock_ms=clock))
        return _results(state.apply_summary(record, offset, clock_ms=clock))
    except ClockError as exc:
        return ("clock", str(exc))
    except oracle_state.ClockError as exc:
        return ("clock", str(exc))


def _flush(state: Any, table: dict[bytes, bytes]) -> tuple[Any, ...]:
    out = state.flush()
    for key, value in out.writes:
        if value is None:
            table.pop(key, None)
        else:
            table[key] = value
    return (out.rates, out.closed_windows, [k for k, _ in out.writes])


def _check_same(twin: Twin) -> None:
    a, b = twin.new, twin.old
    assert (a.watermark, a.last_offset) == (b.watermark, b.last_offset)
    assert (a.accepted_total, a.late_total, a.replayed_total, a.bad_total, a.future_total) == (
        b.accepted_total,
        b.late_total,
        b.replayed_total,
        b.bad_total,
        b.future_total,
    )
    assert a.open_windows == b.open_windows


op = st.one_of(
    st.tuples(st.just("batch"), st.integers(0, 2), st.integers(0, 2**32), st.integers(0, 250)),
    st.tuples(
        st.just("summary"),
        st.integers(0, 2),
        st.lists(st.tuples(st.integers(0, 6), st.integers(0, 4)), max_size=3),
        st.integers(0, 250),
    ),
    st.tuples(st.just("flush")),
    st.tuples(st.just("crash"), st.integers(0, 3), st.booleans()),
)


def _events(seed: int) -> list[tuple[int, int, int]]:
    """(key, time relative to the gateway's clock, prompt tokens) of up to 48 events, most on two
    busy keys (so their reorder buffers pass the fold threshold), times up to 400 ms behind (past
    the reorder horizon: late for the gap sums once a fold has passed them), a few malformed."""
    rng = random.Random(seed)
    out = []
    for _ in range(rng.randint(0, 48)):
        key = rng.choice((0, 0, 1, 1, rng.randrange(len(KEYS))))
        out.append((key, rng.randint(-400, 60), -1 if rng.random() < 0.02 else rng.randint(0, 900)))
    return out


def _record(kind: str, gw: int, items: list[Any], now: int) -> Any:
    base = now + SKEW[gw]
    if kind == "batch":
        times = [base + dt for _, dt, _ in items]
        return RequestBatch(
            gateway_id=f"gw{gw}",
            seq=0,
            created_ms=max(times, default=base),
            keys=[KEYS[k] for k, _, _ in items],
            event_time_ms=times,
            prompt_tokens=[p for _, _, p in items],
            prefix_tokens=[p // 2 for _, _, p in items],
            cached_tokens=[(p // 3) if k % 2 else -1 for k, _, p in items],
        )
    return RequestSummary(
        gateway_id=f"gw{gw}",
        seq=0,
        created_ms=base,
        tick_start_ms=base - 200,
        tick_end_ms=base,
        keys=[KEYS[k] for k, _ in items],
        counts=[c for _, c in items],
        first_ms=[base - 200 for _ in items],
        last_ms=[base - 100 + c for _, c in items],
        prompt_tokens_sum=[10 * c for _, c in items],
        prefix_tokens_sum=[5 * c for _, c in items],
        cached_tokens_sum=[c for _, c in items],
    )


@settings(max_examples=300, deadline=None)
@given(st.lists(op, min_size=1, max_size=60))
def test_columnar_state_matches_the_per_event_oracle(ops: list[Any]) -> None:
    """Batches as the agent takes them: scanned from their bytes where that reader can."""
    _run(ops, scanned=True)


@settings(max_examples=200, deadline=None)
@given(st.lists(op, min_size=1, max_size=60))
def test_columnar_state_from_decoded_batches_matches_the_oracle(ops: list[Any]) -> None:
    """Batches decoded by fastavro (`apply_batch`), as for records the reader does not take."""
    _run(ops, scanned=False)


def _run(ops: list[Any], *, scanned: bool) -> None:
    twin = Twin(PartitionState(0, CFG), oracle_state.PartitionState(0, CFG), {}, {})
    log: list[tuple[int, Any, int]] = []  # (offset, record, clock) as Kafka holds them
    flushed_upto = -1  # newest offset whose effect a flush made durable (acked)
    now = 100_000
    for step in ops:
        if step[0] in ("batch", "summary"):
            _, gw, items, advance = step
            now += advance
            if step[0] == "batch":
                items = _events(items)
            offset = len(log)
            log.append((offset, _record(step[0], gw, items, now), now))
            got = _apply(twin.new, log[-1][1], offset, now, scanned=scanned)
            want = _apply(twin.old, log[-1][1], offset, now)
            assert got == want
        elif step[0] == "flush":
            assert _flush(twin.new, twin.table_new) == _flush(twin.old, twin.table_old)
            flushed_upto = len(log) - 1
        else:  # crash: restore from the table, re-deliver from a little before the last ack
            back, upgrade = step[1], step[2]
            if upgrade:  # a worker of the columnar version takes over a per-key changelog
                twin.table_new = dict(twin.table_old)
            twin.new = PartitionState.restore(0, CFG, list(twin.table_new.items()), now_ms=now)
            twin.old = oracle_state.PartitionState.restore(
                0, CFG, list(twin.table_old.items()), now_ms=now
            )
            for offset, record, clock in log[max(0, flushed_upto + 1 - back) :]:
                assert _apply(twin.new, record, offset, clock, scanned=scanned) == _apply(
                    twin.old, record, offset, clock
                )
        _check_same(twin)
    now += 10 * CFG.window_ms  # a heartbeat past every window: everything closes
    beat = RequestBatch("gw0", 0, now, [], [], [])
    assert _apply(twin.new, beat, len(log), now, scanned=scanned) == _apply(
        twin.old, beat, len(log), now
    )
    assert _flush(twin.new, twin.table_new) == _flush(twin.old, twin.table_old)
    _check_same(twin)
