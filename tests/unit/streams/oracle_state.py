"""TEST ORACLE: the per-event `PartitionState` the agent ran before its state became columnar.

Kept verbatim (only this paragraph added) so that tests/unit/streams/test_columnar_oracle.py can
check the columnar state against it: the same `KeyRate` records, the same counts of accepted,
late, replayed and bad events, on random input. Not used by the product. Its own docstring:

The windowed per-key state of one `requests` partition — pure, no Kafka, no clock.

The Faust agent (streams/app.py) owns one `PartitionState` per assigned partition. It applies each
decoded batch with its source offset, and every flush turns the state into (a) `KeyRate` records of
windows that closed and (b) table writes for the Faust changelog.

Table layout, and why: one table entry per (partition, window, bucket), value = every key of that
bucket with its aggregate plus the highest source offset the entry includes. A per-key entry would
make changelog *messages* scale with distinct keys per flush (100k+ at scale, far more than Faust's
per-message producer path sustains); a bucket entry makes messages scale with buckets and bytes
with distinct keys. The offset stored in each entry makes recovery exact: after a crash Faust
restores the entries and re-delivers messages after the last committed offset, and a message is
applied to a bucket only if its offset is newer than the bucket's — nothing is counted twice or lost.

Clocks, and why each is bounded: the watermark (newest gateway time seen) decides which windows
close and which events are late, so a single record dated ahead would make every later punctual
event late. Each record is therefore judged against a clock the caller trusts for it (`clock_ms`:
its Kafka timestamp, see streams/app.py): a `created_ms` or an event time more than
`max_clock_ahead_ms` ahead of it is *future-dated* — the event is dead-lettered (`BadEvent` with
`ahead_ms`), the header is ignored, and neither moves the watermark. A watermark restored from the
changelog is checked the same way (`restore(now_ms=...)`), so a partition poisoned before this
check existed heals on restart. Clocks *behind* are harmless to others: their events are late,
counted, and reported with their indices (`ApplyResult.late_index`) so the caller can name the
gateway and keep the events.
"""

from __future__ import annotations

import bisect
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from cacheroute.errors import CacheRouteError
from cacheroute.schemas import KeyRate, RequestBatch, RequestSummary
from cacheroute.schemas.codec import dump_json, load_json
from cacheroute.streams.config import StreamConfig
from cacheroute.streams.keyagg import KeyAgg

IntArray = NDArray[np.int64]
BoolArray = NDArray[np.bool_]

__all__ = [
    "ApplyResult",
    "BadEvent",
    "BatchError",
    "ClockError",
    "FlushResult",
    "PartitionState",
    "table_prefix",
]


class BatchError(CacheRouteError, ValueError):
    """The whole batch is malformed (e.g. columns of different lengths): dead-letter all of it."""


class ClockError(BatchError):
    """A record with nothing to count whose `created_ms` is future-dated: dead-letter all of it.

    Only empty records (heartbeats) get here: their one datum is the clock, and it is wrong. A
    record with events is re-anchored instead (see `PartitionState.apply_batch`).
    """

    def __init__(self, reason: str, gateway_id: str, ahead_ms: int) -> None:
        super().__init__(reason)
        self.gateway_id = gateway_id
        self.ahead_ms = ahead_ms


@dataclass(frozen=True, slots=True)
class BadEvent:
    """One malformed event inside an otherwise good batch."""

    index: int
    reason: str
    ahead_ms: int = 0
    """> 0: dead-lettered because its time is this far ahead of the record's trusted clock."""


@dataclass(slots=True)
class ApplyResult:
    """What applying one batch did."""

    accepted: int = 0
    late: int = 0
    replayed: int = 0
    bad: list[BadEvent] = field(default_factory=list)
    future: int = 0
    """Events (for a summary: requests) dead-lettered as future-dated; their `bad` entries have
    `ahead_ms` > 0."""
    header_ahead_ms: int = 0
    """> 0: the record's `created_ms` was this far ahead of its trusted clock and was ignored."""
    late_index: list[int] = field(default_factory=list)
    """Indices of the late events (for a summary: entries), so the caller can dead-letter them."""
    late_behind_ms: int = 0
    """How far the oldest late event is behind the watermark."""


def _span(ms: int) -> str:
    """A duration for a reason text: 2.5 s, 600.0 s, 2.34e+09 s."""
    s = ms / 1000
    return f"{s:.3g} s" if abs(s) >= 1e5 else f"{s:.1f} s"


def ahead_reason(what: str, value_ms: int, clock_ms: int, clock_name: str) -> str:
    """The dead-letter reason of a time ahead of the trusted clock (shared by batches, summaries)."""
    return (
        f"{what} {value_ms} is {_span(value_ms - clock_ms)} ahead of the {clock_name} "
        f"{clock_ms}; gateway clock skew?"
    )


@dataclass(frozen=True, slots=True)
class FlushResult:
    """Rates of closed windows, then table writes (value None = delete), in that order."""

    rates: list[KeyRate]
    writes: list[tuple[bytes, bytes | None]]
    closed_windows: list[int]


_FOLD_AT = 32
"""Fold a key's reorder buffer at flush only once it holds more timestamps than this: folding
later is never less exact (fewer events count as out of order), and most keys then skip it."""


def table_prefix(partition: int) -> bytes:
    """Every table key of a partition starts with this."""
    return b"%d|" % partition


class PartitionState:
    """Open windows of one partition, their per-key aggregates, watermark and applied offsets."""

    def __init__(self, partition: int, config: StreamConfig) -> None:
        self.partition = partition
        self.config = config
        self.windows: dict[int, dict[str, KeyAgg]] = {}
        """window start -> key -> aggregate (flat: one dict lookup per event)."""
        self.members: dict[int, dict[int, list[str]]] = {}
        """window start -> bucket -> its keys (for serialising a bucket)."""
        self.dirty: dict[int, set[str]] = {}
        """window start -> keys changed since the last flush."""
        self.frags: dict[int, dict[str, bytes]] = {}
        """window start -> key -> its cached JSON fragment in the bucket value."""
        self.watermark = -1
        self.last_offset = -1
        self.applied: dict[tuple[int, int], int] = {}
        self.replay_until = -1
        self.written: set[tuple[int, int]] = set()
        self.accepted_total = 0
        self.late_total = 0
        self.bad_total = 0
        self.replayed_total = 0
        self.future_total = 0
        self.restored_offset = -1
        """Newest source offset the restored state already includes: a re-delivered message at or
        below it was applied before the restart, so none of its events may count again."""
        self.handled_upto = -1
        """Newest source offset this object has handled (see `first_delivery`)."""
        self.restore_warning: str | None = None
        """Set by `restore` when it discarded a future-dated watermark (the caller logs it)."""
        self._deletes: list[bytes] = []
        """Table keys to delete at the next flush (windows dropped by `restore`)."""
        self._bucket_of: dict[str, int] = {}

    # ------------------------------------------------------------------------------ applying
    def first_delivery(self, offset: int) -> bool:
        """Whether the message at `offset` is new to this object; it then counts as handled.

        False for a message at or below the newest offset handled: Kafka delivers a partition in
        offset order, so that is the same message delivered again while this object owns the
        partition (the consumer re-read after seeking back to the committed offset, as Faust does
        when it resumes a partition after a rebalance). Its effect is already in this state: the
        caller must skip it whole (no count, no dead letter), or it would count twice, or count
        as late once its window has closed. A re-delivery after a restart or rebalance meets a
        new, restored object instead, and is judged by `restored_offset`.
        """
        if offset <= self.handled_upto:
            return False
        self.handled_upto = offset
        return True

    def _bucket(self, key: str) -> int:
        b = self._bucket_of.get(key)
        if b is None:
            if len(self._bucket_of) > 2_000_000:
                self._bucket_of.clear()
            b = zlib.crc32(key.encode()) % self.config.buckets
            self._bucket_of[key] = b
        return b

    def _agg(self, window: int, key: str, offset: int) -> KeyAgg | None:
        """The aggregate to update, or None when a replayed message is already included.

        Slow path for summaries and replays; the batch path inlines the common case.
        """
        if offset <= self.replay_until:
            applied = self.applied.get((window, self._bucket(key)), -1)
            if applied >= offset:
                return None
            if offset <= self.restored_offset and window not in self.windows:
                return None  # applied before the restart to a window that has closed since
        aggs = self.windows.get(window)
        if aggs is None:
            aggs = self._open(window)
        agg = aggs.get(key)
        if agg is None:
            agg = aggs[key] = KeyAgg()
            self.members[window].setdefault(self._bucket(key), []).append(key)
        self.dirty[window].add(key)
        return agg

    def _open(self, window: int) -> dict[str, KeyAgg]:
        aggs = self.windows[window] = {}
        self.members[window] = {}
        self.dirty[window] = set()
        return aggs

    def apply_batch(
        self,
        batch: RequestBatch,
        offset: int,
        *,
        clock_ms: int | None = None,
        clock_name: str = "broker timestamp",
    ) -> ApplyResult:
        """Add a batch's events; report malformed, future-dated, late and already-applied ones.

        `clock_ms` is the time the caller trusts for this record (its Kafka timestamp; None: no
        bound, as for a record without one). A `created_ms` more than `max_clock_ahead_ms` ahead of
        it is not trusted: an empty batch raises `ClockError` (dead-letter it: its one datum is
        wrong); a batch with events is *re-anchored* — its events are judged against `clock_ms`
        one by one instead of against the header, the future-dated ones are dead-lettered alone,
        the others count, and the header never moves the watermark. Re-anchoring rather than
        dead-lettering the whole batch loses the least good data: the emitter seals
        `created_ms = max(now, newest event time)`, so one event with a bad caller-supplied time
        drags the header ahead with it, and its punctual neighbours must still count.
        """
        keys = batch.keys
        n = len(keys)
        columns = {
            "event_time_ms": batch.event_time_ms,
            "prompt_tokens": batch.prompt_tokens,
            "prefix_tokens": batch.prefix_tokens,
            "cached_tokens": batch.cached_tokens,
            "destinations": batch.destinations,
            "prefix_block_hashes": batch.prefix_block_hashes,
        }
        for name, col in columns.items():
            if col is not None and len(col) != n:
                raise BatchError(f"column {name} has {len(col)} values, keys has {n}")
        result = ApplyResult()
        created = batch.created_ms
        reference = created
        if clock_ms is not None and created > clock_ms + self.config.max_clock_ahead_ms:
            reason = ahead_reason("created_ms", created, clock_ms, clock_name)
            if not n:
                raise ClockError(reason + " (an empty batch)", batch.gateway_id, created - clock_ms)
            result.header_ahead_ms = created - clock_ms
            reference = clock_ms
        if n:
            self._apply_events(
                batch, offset, result, reference=reference, clock_ms=clock_ms, clock_name=clock_name
            )
        if not result.header_ahead_ms:
            self.watermark = max(self.watermark, created)
        self.last_offset = max(self.last_offset, offset)
        self._count(result)
        return result

    def _count(self, result: ApplyResult) -> None:
        self.accepted_total += result.accepted
        self.late_total += result.late
        self.replayed_total += result.replayed
        self.bad_total += len(result.bad)
        self.future_total += result.future

    def _screen(
        self,
        batch: RequestBatch,
        result: ApplyResult,
        *,
        reference: int,
        clock_ms: int | None,
        clock_name: str,
    ) -> tuple[IntArray, IntArray, IntArray, BoolArray]:
        """Columns as arrays plus the mask of malformed events (named in `result.bad`).

        `reference` is the batch's seal time, or the trusted clock when the seal time is not
        trusted. Future-dated comes first, so a skewed clock is what the reason names.
        """
        cfg = self.config
        keys = batch.keys
        n = len(keys)
        times = np.asarray(batch.event_time_ms, dtype=np.int64)
        prompts = np.asarray(batch.prompt_tokens, dtype=np.int64)
        minus = np.full(n, -1, dtype=np.int64)
        prefix = minus if batch.prefix_tokens is None else np.asarray(batch.prefix_tokens, np.int64)
        cached = minus if batch.cached_tokens is None else np.asarray(batch.cached_tokens, np.int64)
        if clock_ms is None:
            ahead = np.zeros(n, dtype=bool)
        else:
            ahead = times > clock_ms + cfg.max_clock_ahead_ms
        reasons: list[tuple[BoolArray, str]] = [
            (prompts < 0, "negative prompt_tokens"),
            (prefix < -1, "prefix_tokens below -1"),
            (cached < -1, "cached_tokens below -1"),
            (prompts > cfg.max_prompt_tokens, "prompt_tokens above max_prompt_tokens"),
            (prefix > cfg.max_prompt_tokens, "prefix_tokens above max_prompt_tokens"),
            (cached > cfg.max_prompt_tokens, "cached_tokens above max_prompt_tokens"),
            (times > reference + cfg.max_future_ms, "event time in the future of its batch"),
            (times < reference - cfg.max_past_ms, "event time too far in the past"),
        ]
        bad_mask = ahead.copy()
        for mask, _ in reasons:
            bad_mask |= mask
        limit = cfg.max_key_bytes
        for i, k in enumerate(keys):
            if not k or (len(k) * 4 > limit and len(k.encode()) > limit):
                bad_mask[i] = True
        for i in np.flatnonzero(bad_mask).tolist():
            k = keys[i]
            if ahead[i] and clock_ms is not None:
                t = int(times[i])
                reason = ahead_reason("event time", t, clock_ms, clock_name)
                result.bad.append(BadEvent(i, reason, ahead_ms=t - clock_ms))
                result.future += 1
                continue
            if not k:
                why = "empty key"
            elif len(k.encode()) > limit:
                why = f"key longer than {limit} bytes"
            else:
                why = next(r for m, r in reasons if m[i])
            result.bad.append(BadEvent(i, why))
        return times, prefix, cached, bad_mask

    def _apply_events(
        self,
        batch: RequestBatch,
        offset: int,
        result: ApplyResult,
        *,
        reference: int,
        clock_ms: int | None,
        clock_name: str,
    ) -> None:
        times, prefix, cached, bad_mask = self._screen(
            batch, result, reference=reference, clock_ms=clock_ms, clock_name=clock_name
        )
        size = self.config.window_ms
        starts = times - times % size
        late_mask = (starts + size + self.config.grace_ms <= self.watermark) & ~bad_mask
        n_late = int(late_mask.sum())
        if n_late and offset <= self.restored_offset:
            result.replayed += n_late  # counted (or found late) before the restart
        elif n_late:
            result.late = n_late
            result.late_index = np.flatnonzero(late_mask).tolist()
            result.late_behind_ms = self.watermark - int(times[late_mask].min())
        good = np.flatnonzero(~(bad_mask | late_mask)).tolist()
        if not good:
            return
        columns = (
            batch.keys,
            times.tolist(),
            batch.prompt_tokens,
            prefix.tolist(),
            cached.tolist(),
        )
        good_starts = starts[good]
        first_start = int(good_starts[0])
        if offset <= self.replay_until or bool((good_starts != first_start).any()):
            # replay after recovery, or a batch spanning windows: the general path
            self._accumulate_checked(good, starts.tolist(), columns, offset, result)
        else:
            self._accumulate_one_window(good, first_start, columns)
            result.accepted = len(good)
        # every good event is at most max_clock_ahead_ms ahead of the trusted clock (screened)
        self.watermark = max(self.watermark, int(times[good].max()))

    def _accumulate_checked(
        self,
        good: list[int],
        window_of: list[int],
        columns: tuple[list[str], list[int], list[int], list[int], list[int]],
        offset: int,
        result: ApplyResult,
    ) -> None:
        keys, t, prompt, prefix, cached = columns
        for i in good:
            agg = self._agg(window_of[i], keys[i], offset)
            if agg is None:
                result.replayed += 1
                continue
            agg.add(t[i], prompt[i], prefix[i], cached[i])
            result.accepted += 1

    def _accumulate_one_window(
        self,
        good: list[int],
        window: int,
        columns: tuple[list[str], list[int], list[int], list[int], list[int]],
    ) -> None:
        """The hot path: every event in one window and no replay check (one dict get per event)."""
        keys, t, prompt, prefix, cached = columns
        aggs = self.windows.get(window)
        if aggs is None:
            aggs = self._open(window)
        members = self.members[window]
        dirty = self.dirty[window]
        insort = bisect.insort
        for i in good:
            key = keys[i]
            agg = aggs.get(key)
            if agg is None:
                agg = aggs[key] = KeyAgg()
                members.setdefault(self._bucket(key), []).append(key)
            dirty.add(key)
            # KeyAgg.add, inlined: this loop runs once per event (~30% faster than the call)
            ti = t[i]
            if agg.count == 0:
                agg.first_ms = agg.last_ms = ti
            elif ti < agg.first_ms:
                agg.first_ms = ti
            elif ti > agg.last_ms:
                agg.last_ms = ti
            agg.count += 1
            agg.prompt_sum += prompt[i]
            if prefix[i] > 0:
                agg.prefix_sum += prefix[i]
            if cached[i] > 0:
                agg.cached_sum += cached[i]
            if ti < agg.last_folded:
                agg.gap_late += 1
                continue
            pending = agg.pending
            if not pending or ti >= pending[-1]:
                pending.append(ti)
            else:
                insort(pending, ti)

    def apply_summary(
        self,
        summary: RequestSummary,
        offset: int,
        *,
        clock_ms: int | None = None,
        clock_name: str = "broker timestamp",
    ) -> ApplyResult:
        """Add a pre-aggregated tick; the tick is assigned to the window of its first event.

        Clocks are bounded as in `apply_batch`: an empty summary dated ahead raises `ClockError`,
        a non-empty one is re-anchored and each entry whose `last_ms` is ahead is dead-lettered
        alone (its requests counted in `future`).
        """
        n = len(summary.keys)
        cols = (
            summary.counts,
            summary.first_ms,
            summary.last_ms,
            summary.prompt_tokens_sum,
            summary.prefix_tokens_sum,
            summary.cached_tokens_sum,
        )
        if any(len(c) != n for c in cols):
            raise BatchError(f"summary columns differ in length from its {n} keys")
        result = ApplyResult()
        size, grace = self.config.window_ms, self.config.grace_ms
        created = summary.created_ms
        if clock_ms is not None and created > clock_ms + self.config.max_clock_ahead_ms:
            reason = ahead_reason("created_ms", created, clock_ms, clock_name)
            if not n:
                raise ClockError(
                    reason + " (an empty summary)", summary.gateway_id, created - clock_ms
                )
            result.header_ahead_ms = created - clock_ms
        replay = offset <= self.restored_offset
        for i, key in enumerate(summary.keys):
            count, first, last = summary.counts[i], summary.first_ms[i], summary.last_ms[i]
            if not key or count <= 0 or last < first or summary.prompt_tokens_sum[i] < 0:
                result.bad.append(BadEvent(i, "malformed summary entry"))
                continue
            if (
                max(
                    summary.prompt_tokens_sum[i],
                    summary.prefix_tokens_sum[i],
                    summary.cached_tokens_sum[i],
                )
                > count * self.config.max_prompt_tokens
            ):
                result.bad.append(BadEvent(i, "token sums above count x max_prompt_tokens"))
                continue
            if clock_ms is not None and last > clock_ms + self.config.max_clock_ahead_ms:
                reason = ahead_reason("last_ms", last, clock_ms, clock_name)
                result.bad.append(BadEvent(i, reason, ahead_ms=last - clock_ms))
                result.future += count
                continue
            window = first - first % size
            if window + size + grace <= self.watermark:
                if replay:
                    result.replayed += count
                else:
                    result.late += count
                    result.late_index.append(i)
                    result.late_behind_ms = max(result.late_behind_ms, self.watermark - first)
                continue
            agg = self._agg(window, key, offset)
            if agg is None:
                result.replayed += count
                continue
            agg.add_summary(
                count,
                first=first,
                last=last,
                prompt=summary.prompt_tokens_sum[i],
                prefix=summary.prefix_tokens_sum[i],
                cached=summary.cached_tokens_sum[i],
            )
            result.accepted += count
        self._count(result)
        if not result.header_ahead_ms:
            self.watermark = max(self.watermark, created)
        self.last_offset = max(self.last_offset, offset)
        return result

    # ------------------------------------------------------------------------------- flushing
    def _key(self, window: int, bucket: int) -> bytes:
        return b"%d|%d|%d" % (self.partition, window, bucket)

    def flush(self) -> FlushResult:
        """Close windows the watermark has passed; serialise dirty buckets; write the meta entry."""
        cfg = self.config
        fold_upto = self.watermark - cfg.reorder_ms
        rates: list[KeyRate] = []
        writes: list[tuple[bytes, bytes | None]] = [(key, None) for key in self._deletes]
        self._deletes.clear()
        closed: list[int] = []
        for window in sorted(self.windows):
            if window + cfg.window_ms + cfg.grace_ms > self.watermark:
                continue
            closed.append(window)
            rates.extend(self._close(window))
            for wb in sorted(wb for wb in self.written if wb[0] == window):
                writes.append((self._key(*wb), None))
                self.written.discard(wb)
                self.applied.pop(wb, None)
        for window in sorted(self.dirty):
            changed = self.dirty[window]
            if changed:
                writes.extend(self._serialise(window, changed, fold_upto))
        meta = {"watermark": self.watermark, "offset": self.last_offset}
        writes.append((table_prefix(self.partition) + b"meta", dump_json(meta)))
        return FlushResult(rates=rates, writes=writes, closed_windows=closed)

    def _serialise(
        self, window: int, changed: set[str], fold_upto: int
    ) -> list[tuple[bytes, bytes | None]]:
        """Table writes for the buckets holding `changed` keys.

        Each key's JSON fragment is cached and rebuilt only when the key changed, so a flush costs
        in proportion to the keys that changed, not to the size of the buckets they share.
        """
        aggs = self.windows[window]
        frags = self.frags.setdefault(window, {})
        buckets = set()
        for key in changed:
            agg = aggs[key]
            if len(agg.pending) > _FOLD_AT:
                agg.fold(fold_upto)
            frags[key] = dump_json(key) + b":" + dump_json(agg.to_list())
            buckets.add(self._bucket(key))
        changed.clear()
        writes: list[tuple[bytes, bytes | None]] = []
        members = self.members[window]
        head = b'{"o":%d,"k":{' % self.last_offset
        for bucket in sorted(buckets):
            parts = []
            for key in members[bucket]:
                frag = frags.get(key)
                if frag is None:  # restored and unchanged since: build once
                    frag = frags[key] = dump_json(key) + b":" + dump_json(aggs[key].to_list())
                parts.append(frag)
            writes.append((self._key(window, bucket), head + b",".join(parts) + b"}}"))
            self.written.add((window, bucket))
            self.applied[(window, bucket)] = self.last_offset
        return writes

    @property
    def has_changes(self) -> bool:
        """Whether any key changed since the last flush."""
        return any(self.dirty.values())

    def _close(self, window: int) -> list[KeyRate]:
        size = self.config.window_ms
        out = []
        self.members.pop(window, None)
        self.dirty.pop(window, None)
        self.frags.pop(window, None)
        for key, agg in self.windows.pop(window).items():
            s = agg.stats()
            out.append(
                KeyRate(
                    key=key,
                    window_start_ms=window,
                    window_end_ms=window + size,
                    count=s.count,
                    rate=s.count * 1000.0 / size,
                    interarrival_mean_ms=s.interarrival_mean_ms,
                    interarrival_cv=s.interarrival_cv,
                    prompt_tokens_sum=s.prompt_tokens_sum,
                    prefix_tokens_sum=s.prefix_tokens_sum,
                    cached_tokens_sum=s.cached_tokens_sum,
                )
            )
        out.sort(key=lambda r: r.key)
        return out

    @property
    def open_windows(self) -> list[int]:
        """Start times of windows that hold state."""
        return sorted(self.windows)

    # ------------------------------------------------------------------------------- recovery
    @classmethod
    def restore(
        cls,
        partition: int,
        config: StreamConfig,
        entries: Iterable[tuple[bytes, bytes]],
        now_ms: int | None = None,
    ) -> PartitionState:
        """Rebuild from the table entries of this partition (as Faust restored them).

        With `now_ms` (the restoring worker's trusted time), a restored watermark more than
        `max_clock_ahead_ms` ahead of it is discarded (see `_discard_future`): it can only come
        from a future-dated record applied before clocks were bounded, and keeping it would make
        every event of the partition late for as long as the skew lasts — years for a 2100 date.
        """
        state = cls(partition, config)
        prefix = table_prefix(partition)
        for raw_key, raw_value in entries:
            if not raw_key.startswith(prefix) or raw_value is None:
                continue
            rest = raw_key[len(prefix) :]
            value = load_json(raw_value)
            if rest == b"meta":
                state.watermark = max(state.watermark, int(value["watermark"]))
                state.last_offset = max(state.last_offset, int(value["offset"]))
                continue
            w_text, b_text = rest.split(b"|")
            window, bucket = int(w_text), int(b_text)
            if window not in state.windows:
                state._open(window)
            aggs = state.windows[window]
            for k, v in value["k"].items():
                aggs[k] = KeyAgg.from_list(v)
            state.members[window][bucket] = list(value["k"])
            offset = int(value["o"])
            state.applied[(window, bucket)] = offset
            state.written.add((window, bucket))
            state.replay_until = max(state.replay_until, offset)
            state.last_offset = max(state.last_offset, offset)
        # a re-delivered message up to the last flushed offset was applied before: never count it
        # again, also not into a window that closed meanwhile (see `_agg`)
        state.restored_offset = state.last_offset
        state.replay_until = max(state.replay_until, state.last_offset)
        if now_ms is not None and state.watermark > now_ms + config.max_clock_ahead_ms:
            state._discard_future(now_ms)
        return state

    def _discard_future(self, now_ms: int) -> None:
        """Drop a future-dated restored watermark, and windows that start after `now_ms` + margin.

        The watermark restarts from the newest event time the remaining windows hold (-1 when
        none): the most that restored state proves. Windows dropped here could only hold
        future-dated events; their table entries are deleted at the next flush. Re-delivered
        messages still cannot count twice (`restored_offset`).
        """
        limit = now_ms + self.config.max_clock_ahead_ms
        poisoned = self.watermark
        dropped = sorted(w for w in self.windows if w > limit)
        for window in dropped:
            self.windows.pop(window)
            self.members.pop(window, None)
            self.dirty.pop(window, None)
            self.frags.pop(window, None)
            for wb in sorted(wb for wb in self.written if wb[0] == window):
                self._deletes.append(self._key(*wb))
                self.written.discard(wb)
                self.applied.pop(wb, None)
        newest = max(
            (a.last_ms for aggs in self.windows.values() for a in aggs.values() if a.count),
            default=-1,
        )
        self.watermark = min(newest, limit)
        self.restore_warning = (
            f"partition {self.partition}: the changelog's watermark {poisoned} is "
            f"{_span(poisoned - now_ms)} ahead of now ({now_ms}): a future-dated record "
            "poisoned it (gateway clock skew). Discarded it and restarted the watermark from the "
            f"newest restored event time ({self.watermark})"
            + (f"; dropped {len(dropped)} window(s) dated in the future" if dropped else "")
        )
