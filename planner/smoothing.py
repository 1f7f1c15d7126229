"""Per-key rates for the planner: the latest KeyRate per (key, window), smoothed across windows.

The streams agent emits one KeyRate per key per closed window, at least once, from every `rates`
partition independently (each partition closes a window when its own watermark passes it). So the
smoother (1) keeps the latest record per (key, window) while a window is open here, (2) decides when
a window is complete, and (3) folds complete windows, oldest first, into an exponentially weighted
moving average per key:

    s_key <- alpha * rate_key(w) + (1 - alpha) * s_key      (a key absent from w has rate 0)

A key seen for the first time starts at its observed rate (no warm-up bias towards 0), and a key
absent from `forget_after_windows` folded windows in a row is forgotten, which bounds memory.

A window is complete when every partition has reported a *later* window (it has certainly closed
w), or when every partition has reported w and no record of w arrived for `settle_ms`, or, for
partitions that carry no traffic at all, `max_wait_ms` after w's first record. Records for a window
that is already folded are late: counted and dropped (folding cannot be undone). Windows with no
records at all are not folded as zeros: a gap is more likely a stalled stream than silence.

Because folding cannot be undone, one record must never be able to poison it. Every clock and every
figure a record carries is bounded before it is accepted:

- a window that ends more than `max_ahead_ms` after the record's timestamp (the smaller of the
  broker's record timestamp and the planner's own clock, so a forged record timestamp does not
  help) is `invalid` ("future"): folded, it would make every real window after it "late";
- a rate above `max_key_rate` (an absolute ceiling, default 1e6 requests/s per key) is `invalid`
  ("implausible"), and so is a count that could not fit the window at that ceiling;
- a mean prompt (or reusable prefix) above `max_prompt_tokens` a request is `invalid`
  ("implausible"): the planner weighs each key by its requests' cost (`planner.work`), so one
  forged token sum must not make a key look like the cluster's whole workload;
- a key's rate in a new window is clamped to `max_surge` x the window's *reference total*
  (at least `max_key_rate` / 1000), counted in `clamped`: a real key cannot outgrow the whole
  cluster a hundredfold in one window, and the clamp lifts as the total follows a genuine surge;
- the window's total is bounded too, or many made-up keys, each under every per-key limit, could
  still inflate it a thousandfold: it may be at most `max_total_growth` x the reference total
  (which counts as at least `total_floor`, so an idle or tiny cluster can still grow). Above
  that, the largest rates are cut down to one common level, never below a key's *trusted base*,
  until the total fits (water-filling from the top), counted in `scaled`: the excess is taken
  from the outliers first, so real keys below the level keep every request. The trusted base is
  what the averages already believe, the key's smoothed rate (0 for a key never seen), so the
  established keys keep their rates and only growth is cut.

The reference total is the smoothed cluster total. In the first window folded after a start (or
whenever that total is 0) there is none, and trusting the window itself would let one record set
the scale: so it is the window's key count x its *median* key rate, which a minority of made-up
keys cannot move, and the trusted base of each key is the median. A real, heavily skewed first
window may be cut too; the key then catches up at the EWMA's pace over the next windows, where the
smoothed total is the reference. Each limited window is noted once (`limits`), with its numbers,
for the log.

Every rejection is counted per reason (`rejections`) with its last example, for the log.

Pure: time comes in as `now_ms` / `arrived_ms` arguments.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from cacheroute.planner.errors import PlannerError
from cacheroute.planner.plan import FloatArray, IntArray
from cacheroute.schemas import MAX_PROMPT_TOKENS, KeyRate

__all__ = [
    "AddResult",
    "RateSmoother",
    "RatesSnapshot",
    "Rejection",
    "SmoothingParams",
    "WindowLimit",
]

AddResult = Literal["accepted", "replaced", "late", "invalid"]
Rejection = Literal["malformed", "future", "implausible"]
"""Why a record was `invalid`: impossible values, a window from the future, an implausible rate."""


@dataclass(frozen=True, slots=True)
class SmoothingParams:
    """How rates are smoothed and when a window counts as complete."""

    alpha: float = 0.5
    """Weight of the newest window in (0, 1]; 1 means no smoothing (the last window only)."""
    settle_ms: int = 2_000
    """Quiet time after a window's last record before it folds (once all partitions reported it)."""
    max_wait_ms: int = 30_000
    """A window folds this long after its first record even if some partition never reported."""
    forget_after_windows: int = 10
    """A key absent from this many folded windows in a row is forgotten."""
    max_ahead_ms: int = 30_000
    """A window may end at most this long after its record's timestamp (clock skew margin)."""
    max_key_rate: float = 1_000_000.0
    """Absolute ceiling of one key's rate, requests/s: above it a record is implausible."""
    max_surge: float = 100.0
    """A key's rate in a new window is clamped to this x the window's reference total."""
    max_total_growth: float = 10.0
    """A window's total rate may be at most this x its reference total; the growth above is cut."""
    total_floor: float = 100.0
    """Requests/s the reference total counts as at least (an idle cluster may still grow)."""
    max_prompt_tokens: int = MAX_PROMPT_TOKENS
    """Ceiling of one request's mean prompt (or prefix) tokens: above it a record is
    implausible. The planner weighs keys by their prompts, so one forged sum must not make a key
    look like all of the cluster's work."""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.alpha) and 0.0 < self.alpha <= 1.0):
            raise PlannerError(f"EWMA alpha must be in (0, 1], got {self.alpha!r}")
        if self.settle_ms < 0 or self.max_wait_ms < 0:
            raise PlannerError("settle_ms and max_wait_ms must be >= 0")
        if self.forget_after_windows < 1:
            raise PlannerError("forget_after_windows must be >= 1")
        if self.max_ahead_ms < 0:
            raise PlannerError("max_ahead_ms must be >= 0")
        if not (math.isfinite(self.max_key_rate) and self.max_key_rate > 0):
            raise PlannerError(f"max_key_rate must be finite and > 0, got {self.max_key_rate!r}")
        if not (math.isfinite(self.max_surge) and self.max_surge >= 1):
            raise PlannerError(f"max_surge must be finite and >= 1, got {self.max_surge!r}")
        if not (math.isfinite(self.max_total_growth) and self.max_total_growth >= 1):
            raise PlannerError(
                f"max_total_growth must be finite and >= 1, got {self.max_total_growth!r}"
            )
        if not (math.isfinite(self.total_floor) and self.total_floor > 0):
            raise PlannerError(f"total_floor must be finite and > 0, got {self.total_floor!r}")
        if self.max_prompt_tokens < 1:
            raise PlannerError(f"max_prompt_tokens must be >= 1, got {self.max_prompt_tokens!r}")


@dataclass(frozen=True, slots=True)
class RatesSnapshot:
    """Smoothed rates of every tracked key (the planner's input), in first-seen order."""

    keys: tuple[str, ...]
    rates: FloatArray  # (n_keys,) requests/s, finite, >= 0
    prefix_tokens: FloatArray  # (n_keys,) mean reusable prefix tokens per request (last known)
    prompt_tokens: FloatArray  # (n_keys,) mean prompt tokens per request (last known)
    windows: int
    """Windows folded so far."""
    newest_end_ms: int
    """End of the newest folded window (0 when none)."""
    cached_tokens: FloatArray | None = None
    """(n_keys,) mean prompt tokens per request the engines served from their prefix caches
    (last known, as the gateways read them from each answer's usage); None: not tracked."""

    def __len__(self) -> int:
        return len(self.keys)


@dataclass(frozen=True, slots=True)
class WindowLimit:
    """One folded window whose rates were cut to plausible ones: what the log line says."""

    window_start_ms: int
    first: bool
    """No smoothed total yet: the reference is the window's key count x its median key rate."""
    reference: float
    """The reference total (before `total_floor`), requests/s."""
    reported: float
    """The window's total as its records reported it, requests/s."""
    folded: float
    """The window's total after the cuts, requests/s."""
    clamped: int
    """Keys clamped to `max_surge` x the reference total."""
    scaled: int
    """Keys cut down to the common level that fits `max_total_growth` x the reference total."""
    largest: str
    """The key cut the most, with its reported rate."""


@dataclass(slots=True)
class _Window:
    start: int
    end: int
    first_ms: int
    last_ms: int
    records: dict[str, tuple[float, int, int, int, int]] = field(default_factory=dict)
    """key -> (rate, count, prefix_tokens_sum, prompt_tokens_sum, cached_tokens_sum) of the
    latest record."""


class RateSmoother:
    """The EWMA state of the planner service (see the module docstring)."""

    def __init__(self, params: SmoothingParams, partitions: int) -> None:
        if partitions < 1:
            raise PlannerError("the rates topic needs at least one partition")
        self.params = params
        self._partitions = partitions
        self._progress = [-1] * partitions  # newest window start reported per partition
        self._pending: dict[int, _Window] = {}
        self._last_folded = -(2**63)
        self._folded = 0
        self._newest_end = 0
        self._keys: list[str] = []
        self._index: dict[str, int] = {}
        self._smoothed: FloatArray = np.zeros(0, dtype=np.float64)
        self._idle: IntArray = np.zeros(0, dtype=np.int64)
        self._tokens: FloatArray = np.zeros(0, dtype=np.float64)
        self._prompts: FloatArray = np.zeros(0, dtype=np.float64)
        self._cached: FloatArray = np.zeros(0, dtype=np.float64)
        self.rejections: dict[Rejection, int] = {"malformed": 0, "future": 0, "implausible": 0}
        """Invalid records so far, per reason."""
        self.last_rejection: dict[Rejection, str] = {}
        """Per reason, a description of its latest record (for the log)."""
        self.clamped = 0
        """Key-window rates clamped to `max_surge` x the reference total so far."""
        self.scaled = 0
        """Key-window rates cut down to fit their window's total ceiling so far."""
        self.limits: deque[WindowLimit] = deque(maxlen=64)
        """The latest limited windows, oldest first (bounded: a caller that never reads them)."""

    # ------------------------------------------------------------------------------- views
    @property
    def tracked_keys(self) -> int:
        """Keys with a smoothed rate."""
        return len(self._keys)

    @property
    def pending_windows(self) -> tuple[int, ...]:
        """Starts of windows holding records that are not folded yet."""
        return tuple(sorted(self._pending))

    @property
    def folded_windows(self) -> int:
        """Windows folded into the averages so far."""
        return self._folded

    @property
    def newest_end_ms(self) -> int:
        """End of the newest folded window (0 when none)."""
        return self._newest_end

    # ------------------------------------------------------------------------------ input
    def add(
        self, rate: KeyRate, partition: int, arrived_ms: int, record_ms: int | None = None
    ) -> AddResult:
        """Take one KeyRate record from `partition`; the latest per (key, window) wins.

        `arrived_ms` is the planner's clock when the record was read, `record_ms` the record's
        Kafka timestamp (<= 0: unknown, so the planner clock alone). A window may end at most
        `max_ahead_ms` after the earlier of the two (see the module docstring). None skips that
        bound: for callers that replay records without clocks (the service always passes one)."""
        reason = self._check(rate, partition, arrived_ms, record_ms)
        if reason is not None:
            return "invalid"
        start = rate.window_start_ms
        self._progress[partition] = max(self._progress[partition], start)
        if start <= self._last_folded:
            return "late"
        window = self._pending.get(start)
        if window is None:
            window = _Window(start, rate.window_end_ms, arrived_ms, arrived_ms)
            self._pending[start] = window
        window.last_ms = max(window.last_ms, arrived_ms)
        replaced = rate.key in window.records
        window.records[rate.key] = (
            rate.rate,
            rate.count,
            rate.prefix_tokens_sum,
            rate.prompt_tokens_sum,
            rate.cached_tokens_sum,
        )
        return "replaced" if replaced else "accepted"

    def _check(
        self, rate: KeyRate, partition: int, arrived_ms: int, record_ms: int | None
    ) -> Rejection | None:
        """Why `rate` must not be folded (counted, with an example), or None."""
        p = self.params
        reason: Rejection | None = None
        detail = ""
        if (
            not rate.key
            or not math.isfinite(rate.rate)
            or rate.rate < 0
            or rate.count < 0
            or rate.prefix_tokens_sum < 0
            or rate.prompt_tokens_sum < 0
            or rate.cached_tokens_sum < 0
            or rate.window_end_ms <= rate.window_start_ms
            or not 0 <= partition < self._partitions
        ):
            reason, detail = "malformed", "impossible values"
        else:
            if record_ms is None:  # a replay without clocks: nothing to bound by
                ahead = 0
            else:
                now = arrived_ms if record_ms <= 0 else min(arrived_ms, record_ms)
                ahead = rate.window_end_ms - now
            width_s = (rate.window_end_ms - rate.window_start_ms) / 1000
            if ahead > p.max_ahead_ms:
                reason = "future"
                detail = f"window ends {ahead / 1000:.3g} s after the record's timestamp"
            elif rate.rate > p.max_key_rate or rate.count > p.max_key_rate * width_s:
                reason = "implausible"
                detail = (
                    f"rate {rate.rate:.3g}/s or count {rate.count} in {width_s:g} s is above "
                    f"the ceiling of {p.max_key_rate:g} requests/s"
                )
            elif (
                most := max(rate.prompt_tokens_sum, rate.prefix_tokens_sum, rate.cached_tokens_sum)
            ) > p.max_prompt_tokens * max(rate.count, 1):
                reason = "implausible"
                detail = (
                    f"{most} prompt tokens in "
                    f"{rate.count} requests is above the ceiling of {p.max_prompt_tokens} a request"
                )
        if reason is None:
            return None
        self.rejections[reason] += 1
        self.last_rejection[reason] = (
            f"key {rate.key[:64]!r} window {rate.window_start_ms} from partition {partition}: "
            f"{detail}"
        )
        return reason

    def advance(self, now_ms: int) -> list[int]:
        """Fold every complete window (oldest first); return the starts of the folded windows."""
        folded: list[int] = []
        while self._pending:
            start = min(self._pending)
            window = self._pending[start]
            if not self._complete(window, now_ms):
                break
            del self._pending[start]
            self._fold(window)
            folded.append(start)
        return folded

    def _complete(self, window: _Window, now_ms: int) -> bool:
        if all(p > window.start for p in self._progress):
            return True
        quiet = now_ms - window.last_ms >= self.params.settle_ms
        if quiet and all(p >= window.start for p in self._progress):
            return True
        return now_ms - window.first_ms >= self.params.max_wait_ms

    def _fold(self, window: _Window) -> None:
        alpha = self.params.alpha
        n_old = len(self._keys)
        for key in window.records:
            if key not in self._index:
                self._index[key] = len(self._keys)
                self._keys.append(key)
        n = len(self._keys)
        grow = n - n_old
        smoothed = np.concatenate([self._smoothed, np.zeros(grow)]) if grow else self._smoothed
        idle = np.concatenate([self._idle, np.zeros(grow, np.int64)]) if grow else self._idle
        tokens = np.concatenate([self._tokens, np.zeros(grow)]) if grow else self._tokens
        prompts = np.concatenate([self._prompts, np.zeros(grow)]) if grow else self._prompts
        cached = np.concatenate([self._cached, np.zeros(grow)]) if grow else self._cached
        idx = np.fromiter(
            map(self._index.__getitem__, window.records), np.int64, len(window.records)
        )
        values = list(window.records.values())
        observed = np.zeros(n, dtype=np.float64)
        observed[idx] = np.fromiter((v[0] for v in values), np.float64, len(values))
        self._limit(window.start, observed, idx, smoothed)
        smoothed = (1.0 - alpha) * smoothed + alpha * observed
        smoothed[n_old:] = observed[n_old:]  # first sighting: start at the observed rate
        present = np.zeros(n, dtype=np.bool_)
        present[idx] = True
        idle = np.where(present, 0, idle + 1)
        counts = np.fromiter((v[1] for v in values), np.float64, len(values))
        sums = np.fromiter((v[2] for v in values), np.float64, len(values))
        has = counts > 0
        tokens[idx[has]] = sums[has] / counts[has]
        prompt_sums = np.fromiter((v[3] for v in values), np.float64, len(values))
        prompts[idx[has]] = prompt_sums[has] / counts[has]
        cached_sums = np.fromiter((v[4] for v in values), np.float64, len(values))
        cached[idx[has]] = cached_sums[has] / counts[has]
        self._smoothed, self._idle, self._tokens, self._prompts = smoothed, idle, tokens, prompts
        self._cached = cached
        self._last_folded = window.start
        self._folded += 1
        self._newest_end = max(self._newest_end, window.end)
        self._forget()

    def _limit(self, start: int, observed: FloatArray, idx: IntArray, smoothed: FloatArray) -> None:
        """Cut `observed` (in place) to plausible rates: the per-key clamp, then the total ceiling.

        `idx` are the window's keys, `smoothed` the averages before this window (0 for new keys).
        See the module docstring for why each bound exists.
        """
        p = self.params
        previous = float(self._smoothed.sum())
        first = not previous > 0
        if first:  # no total to trust yet: the median cannot be moved by a few made-up keys
            median = float(np.median(observed[idx])) if len(idx) else 0.0
            reference = len(idx) * median
            base = np.minimum(observed, median)
        else:
            reference = previous
            base = np.minimum(observed, smoothed)
        reported = float(observed.sum())
        before = observed.copy()
        ceiling = p.max_surge * max(reference, p.max_key_rate / 1000)
        over = observed > ceiling
        clamped = int(over.sum())
        if clamped:
            observed[over] = ceiling
        cap = p.max_total_growth * max(reference, p.total_floor)
        scaled = 0
        total = float(observed.sum())
        if total > cap:
            grown = observed > base
            level = _water_level(base[grown], observed[grown], cap - float(observed[~grown].sum()))
            cut = grown & (observed > level)
            observed[cut] = np.maximum(level, base[cut])
            scaled = int(cut.sum())
        if not (clamped or scaled):
            return
        self.clamped += clamped
        self.scaled += scaled
        worst = int(np.argmax(before - observed))
        self.limits.append(
            WindowLimit(
                window_start_ms=start,
                first=first,
                reference=reference,
                reported=reported,
                folded=float(observed.sum()),
                clamped=clamped,
                scaled=scaled,
                largest=f"{self._keys[worst][:64]!r} at {before[worst]:.4g}/s",
            )
        )

    def _forget(self) -> None:
        keep = self._idle < self.params.forget_after_windows
        if bool(keep.all()):
            return
        self._keys = [k for k, kept in zip(self._keys, keep.tolist(), strict=True) if kept]
        self._index = {k: i for i, k in enumerate(self._keys)}
        self._smoothed = self._smoothed[keep]
        self._idle = self._idle[keep]
        self._tokens = self._tokens[keep]
        self._prompts = self._prompts[keep]
        self._cached = self._cached[keep]

    # ----------------------------------------------------------------------------- output
    def snapshot(self) -> RatesSnapshot:
        """Copies of the smoothed rates (safe to hand to the planner while records keep coming)."""
        return RatesSnapshot(
            keys=tuple(self._keys),
            rates=self._smoothed.copy(),
            prefix_tokens=self._tokens.copy(),
            prompt_tokens=self._prompts.copy(),
            windows=self._folded,
            newest_end_ms=self._newest_end,
            cached_tokens=self._cached.copy(),
        )


def _water_level(lo: FloatArray, hi: FloatArray, target: float) -> float:
    """The level c at which sum(clip(c, lo, hi)) == target (lo < hi elementwise).

    Cutting every rate above c down to c (never below its trusted base `lo`) takes the excess
    from the largest rates first: a few made-up keys lose theirs, real keys below c keep every
    request. A common scale factor instead would cut every key that grew in proportion, so one
    made-up key could crush the real keys' growth with it. Exact, not a bisection: the sum is
    piecewise linear in c with breaks at the `lo` and `hi` values, so it is evaluated at every
    break (sorted prefix sums) and solved on the one segment that crosses `target`.
    When target <= sum(lo) (cannot happen with the callers' bounds, but rounding) c is min(lo).
    """
    n = len(lo)
    lo_sorted, hi_sorted = np.sort(lo), np.sort(hi)
    lo_cum = np.concatenate(([0.0], np.cumsum(lo_sorted)))
    hi_cum = np.concatenate(([0.0], np.cumsum(hi_sorted)))
    points = np.unique(np.concatenate((lo, hi)))
    # at c: keys with hi <= c give hi, keys with lo >= c give lo, the others give c
    at_or_below = np.searchsorted(hi_sorted, points, side="right")
    below = np.searchsorted(lo_sorted, points, side="left")  # keys with lo < c
    sums = hi_cum[at_or_below] + (lo_cum[n] - lo_cum[below]) + points * (below - at_or_below)
    j = int(np.searchsorted(sums, target, side="left"))
    if j == 0:
        return float(points[0])
    if j >= len(points):
        return float(points[-1])
    c0, c1, s0, s1 = float(points[j - 1]), float(points[j]), float(sums[j - 1]), float(sums[j])
    return c0 + (target - s0) / (s1 - s0) * (c1 - c0)
