"""Pre-aggregation of request events into per-key, per-tick summaries (the emitter's summary mode).

Why: a gateway at very high QPS can send one row per key per tick instead of one entry per event;
the streams agent then adds counts instead of counting events. Rates over windows made of whole
ticks are identical either way (a count is a count), which the unit tests check against events
mode on the same input. Inter-arrival statistics are not recoverable exactly from first/last times;
that trade-off is the streams agent's to document.

Ticks are aligned to multiples of `tick_ms` since the epoch, by event time, so summaries from
different gateways line up with each other and with the agent's windows. Pure logic: time comes in
as arguments.
"""

from __future__ import annotations

from cacheroute.schemas.records import RequestSummary

__all__ = ["TickAccumulator", "summary_from"]

# Row layout: [count, first_ms, last_ms, prompt_sum, prefix_sum, cached_sum]; a list, because
# `add` updates it in place for every event.
_COUNT, _FIRST, _LAST, _PROMPT, _PREFIX, _CACHED = range(6)


class TickAccumulator:
    """Per-key aggregates of one partition, grouped by tick.

    `add` counts one event (the emitter calls it under its lock, in place of appending to column
    buffers); `due` names the ticks that are over at `now_ms`; `pop` removes one tick's rows.
    `rows` counts the (tick, key) rows held, which is what memory grows with.
    """

    __slots__ = ("_current", "_current_start", "rows", "tick_ms", "ticks")

    def __init__(self, tick_ms: int) -> None:
        if tick_ms <= 0:
            raise ValueError(f"tick_ms must be positive, got {tick_ms}")
        self.tick_ms = tick_ms
        self.ticks: dict[int, dict[str, list[int]]] = {}
        self.rows = 0
        self._current_start = -1  # the tick most events fall into, to skip one dict lookup
        self._current: dict[str, list[int]] = {}

    def add(self, key: str, t: int, prompt: int, prefix: int, cached: int) -> int:
        """Count one event (`prefix`/`cached` -1 when unknown); returns 1 if it made a new row."""
        start = t - t % self.tick_ms
        if start != self._current_start:
            found = self.ticks.get(start)
            if found is None:
                found = self.ticks[start] = {}
            self._current_start, self._current = start, found
        tick = self._current
        row = tick.get(key)
        if row is None:
            tick[key] = [1, t, t, prompt, prefix if prefix > 0 else 0, cached if cached > 0 else 0]
            self.rows += 1
            return 1
        row[_COUNT] += 1
        if t > row[_LAST]:
            row[_LAST] = t
        elif t < row[_FIRST]:
            row[_FIRST] = t
        row[_PROMPT] += prompt
        if prefix > 0:
            row[_PREFIX] += prefix
        if cached > 0:
            row[_CACHED] += cached
        return 0

    def due(self, now_ms: int) -> list[int]:
        """Starts of the ticks that ended at or before `now_ms`, oldest first."""
        return sorted(s for s in self.ticks if s + self.tick_ms <= now_ms)

    def pop(self, tick_start: int) -> dict[str, list[int]]:
        """Remove and return one tick's rows (key -> [count, first, last, sums...])."""
        rows = self.ticks.pop(tick_start)
        self.rows -= len(rows)
        if tick_start == self._current_start:
            self._current_start = -1
        return rows

    def __len__(self) -> int:
        return self.rows


def summary_from(
    gateway_id: str,
    seq: int,
    now_ms: int,
    *,
    tick_start: int,
    tick_ms: int,
    rows: list[tuple[str, list[int]]],
) -> RequestSummary:
    """The RequestSummary record of some rows of one tick.

    `created_ms` is at least the newest event time in the rows (the schema's "no event newer"
    promise, even when a flush seals a tick before it ends).
    """
    newest = max((r[_LAST] for _, r in rows), default=now_ms)
    return RequestSummary(
        gateway_id=gateway_id,
        seq=seq,
        created_ms=max(now_ms, newest),
        tick_start_ms=tick_start,
        tick_end_ms=tick_start + tick_ms,
        keys=[k for k, _ in rows],
        counts=[r[_COUNT] for _, r in rows],
        first_ms=[r[_FIRST] for _, r in rows],
        last_ms=[r[_LAST] for _, r in rows],
        prompt_tokens_sum=[r[_PROMPT] for _, r in rows],
        prefix_tokens_sum=[r[_PREFIX] for _, r in rows],
        cached_tokens_sum=[r[_CACHED] for _, r in rows],
    )
