"""Per-key, per-window aggregate of the merged request stream, with its inter-arrival estimator.

Estimator (why this one): the inter-arrival statistics the planner wants are those of the *merged*
per-key stream — all gateways' requests for the key in time order. Events reach the agent in
batches from several gateways, so they interleave and arrive out of order by up to a batch linger
plus transport delay. We therefore keep, per key, a small **reorder buffer**: timestamps newer than
`watermark - reorder_ms` wait in a sorted list; older ones are *folded* in time order into running
sums (number of gaps, sum of gaps, sum of squared gaps). This is exact whenever no event arrives
more than `reorder_ms` behind the newest event seen on its partition, and costs memory only for the
events of the last `reorder_ms`, not the whole window.

- The mean gap is taken as `(last - first) / (count - 1)`: exact for the sorted merged stream
  whatever the arrival order (the gaps telescope), and available for pre-aggregated summaries too.
- The coefficient of variation (std/mean of the gaps) comes from the folded sums. An event that
  arrives later than the reorder horizon (but within the window's grace period) still counts in
  count, rate and token sums; it is left out of the gap sums and counted in `gap_late`, so the CV
  is then computed from the in-order subset (error measured in tests/unit/streams).
- Requests that arrive as pre-aggregated summaries carry no individual timestamps: they add to count,
  tokens and first/last time only.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

__all__ = ["KeyAgg", "KeyStats"]


@dataclass(frozen=True, slots=True)
class KeyStats:
    """What a closed window reports for one key."""

    count: int
    interarrival_mean_ms: float | None
    interarrival_cv: float | None
    prompt_tokens_sum: int
    prefix_tokens_sum: int
    cached_tokens_sum: int


class KeyAgg:
    """Mutable aggregate of one key in one window: the definition the columnar state
    (columns.py) implements per batch, the form changelogs written before it hold (read on
    restore), and the reference its tests compare against."""

    __slots__ = (
        "cached_sum",
        "count",
        "first_ms",
        "gap_late",
        "gaps",
        "last_folded",
        "last_ms",
        "pending",
        "prefix_sum",
        "prompt_sum",
        "sum_gap",
        "sum_gap2",
    )

    def __init__(self) -> None:
        self.count = 0
        self.prompt_sum = 0
        self.prefix_sum = 0
        self.cached_sum = 0
        self.first_ms = 0
        self.last_ms = 0
        self.gaps = 0
        self.sum_gap = 0.0
        self.sum_gap2 = 0.0
        self.last_folded = -1
        self.gap_late = 0
        self.pending: list[int] = []

    def add(self, t: int, prompt: int, prefix: int, cached: int) -> None:
        """One event at time t (ms); prefix/cached of -1 mean unknown."""
        if self.count == 0:
            self.first_ms = self.last_ms = t
        elif t < self.first_ms:
            self.first_ms = t
        elif t > self.last_ms:
            self.last_ms = t
        self.count += 1
        self.prompt_sum += prompt
        if prefix > 0:
            self.prefix_sum += prefix
        if cached > 0:
            self.cached_sum += cached
        if t < self.last_folded:
            self.gap_late += 1
            return
        pending = self.pending
        if not pending or t >= pending[-1]:
            pending.append(t)
        else:
            bisect.insort(pending, t)

    def add_summary(
        self, count: int, *, first: int, last: int, prompt: int, prefix: int, cached: int
    ) -> None:
        """A pre-aggregated block of `count` events between `first` and `last` (no timestamps)."""
        if count <= 0:
            return
        if self.count == 0:
            self.first_ms, self.last_ms = first, last
        else:
            self.first_ms = min(self.first_ms, first)
            self.last_ms = max(self.last_ms, last)
        self.count += count
        self.prompt_sum += prompt
        self.prefix_sum += max(prefix, 0)
        self.cached_sum += max(cached, 0)

    def fold(self, upto: int) -> None:
        """Fold pending timestamps <= upto, in time order, into the gap sums."""
        pending = self.pending
        if not pending or pending[0] > upto:
            return
        cut = bisect.bisect_right(pending, upto)
        prev = self.last_folded
        gaps, s1, s2 = self.gaps, self.sum_gap, self.sum_gap2
        for t in pending[:cut]:
            if prev >= 0:
                g = t - prev
                gaps += 1
                s1 += g
                s2 += g * g
            prev = t
        self.gaps, self.sum_gap, self.sum_gap2, self.last_folded = gaps, s1, s2, prev
        del pending[:cut]

    def stats(self) -> KeyStats:
        """Fold everything and report (call when the window closes)."""
        if self.pending:
            self.fold(self.pending[-1])
        mean = (self.last_ms - self.first_ms) / (self.count - 1) if self.count >= 2 else None
        cv: float | None = None
        if self.gaps >= 2 and self.sum_gap > 0:
            m = self.sum_gap / self.gaps
            var = max(self.sum_gap2 / self.gaps - m * m, 0.0)
            cv = math.sqrt(var) / m
        return KeyStats(
            count=self.count,
            interarrival_mean_ms=mean,
            interarrival_cv=cv,
            prompt_tokens_sum=self.prompt_sum,
            prefix_tokens_sum=self.prefix_sum,
            cached_tokens_sum=self.cached_sum,
        )

    def to_list(self) -> list[object]:
        """Compact, JSON-able form for the table changelog."""
        return [
            self.count,
            self.prompt_sum,
            self.prefix_sum,
            self.cached_sum,
            self.first_ms,
            self.last_ms,
            self.gaps,
            self.sum_gap,
            self.sum_gap2,
            self.last_folded,
            self.gap_late,
            self.pending,
        ]

    @classmethod
    def from_list(cls, data: list[object]) -> KeyAgg:
        """Inverse of `to_list`."""
        agg = cls()
        ints = [int(v) for v in data[:7] if isinstance(v, int | float)]
        if len(data) != 12 or len(ints) != 7 or not isinstance(data[11], list):
            raise ValueError(f"not a KeyAgg list form: {data!r:.80}")
        (agg.count, agg.prompt_sum, agg.prefix_sum, agg.cached_sum) = ints[:4]
        (agg.first_ms, agg.last_ms, agg.gaps) = ints[4:7]
        agg.sum_gap = float(data[7])  # type: ignore[arg-type]
        agg.sum_gap2 = float(data[8])  # type: ignore[arg-type]
        agg.last_folded = int(data[9])  # type: ignore[call-overload]
        agg.gap_late = int(data[10])  # type: ignore[call-overload]
        agg.pending = [int(t) for t in data[11]]
        return agg
