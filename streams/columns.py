"""One window's per-key aggregates as numpy columns: the streams agent's state, vectorised per batch.

Why columns: the agent's work is "group a batch of ~2,000 events by key and add them to what each
key holds". Done one event at a time in Python (one `KeyAgg` object per key, one attribute update
per field) it cost 3-5 us an event, several times the fetch and decode; done per batch over row
indices (a key-table probe per event, then one compiled pass adding the batch to its rows) it
costs ~0.1 us an event, and a flush serialises whole buckets from the columns at once.

Semantics are exactly those of `KeyAgg` (keyagg.py, which the tests keep as the oracle): the same
totals, first/last times, and the same reorder buffer - an event older than the newest time a
key's gaps already include (`last_folded`) counts as `gap_late`; the others wait in the pending
buffer until a fold takes, per key and in time order, those up to the fold's limit into the gap
sums. Gap sums are kept as int64 (`KeyAgg` kept floats of the same integers: identical while
below 2**53, i.e. for any window shorter than ~26 hours, since a sum of squared gaps is at most
the window's length squared).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import repeat
from typing import Any

import numpy as np
from numpy.typing import NDArray

from cacheroute.schemas.avrojit import njit
from cacheroute.schemas.batch_scan import ScannedBatch
from cacheroute.schemas.codec import dump_columns
from cacheroute.schemas.rate_columns import RateColumns
from cacheroute.streams.keytable import KeyTable

IntArray = NDArray[np.int64]
FloatArray = NDArray[np.float64]
BoolArray = NDArray[np.bool_]

__all__ = ["COLUMN_FIELDS", "WindowColumns"]

COLUMN_FIELDS = (
    "count",
    "prompt",
    "prefix",
    "cached",
    "first",
    "last",
    "gaps",
    "sum_gap",
    "sum_gap2",
    "last_folded",
    "gap_late",
)
"""The per-key int64 columns, in the order of `KeyAgg.to_list` (its pending list comes after)."""

_FIRST_NONE = np.iinfo(np.int64).max
_LAST_NONE = np.iinfo(np.int64).min


class WindowColumns:
    """The aggregates of every key of one window of one partition.

    Rows are keys in order of first appearance; `bucket[row]` is the key's table bucket. Columns
    grow by doubling. Pending (not yet folded) timestamps are kept as parallel arrays of rows and
    times, appended per batch and compacted at each fold.
    """

    __slots__ = (
        "bucket",
        "cached",
        "count",
        "dirty",
        "first",
        "gap_late",
        "gaps",
        "index",
        "keys",
        "last",
        "last_folded",
        "n",
        "pend_rows",
        "pend_t",
        "prefix",
        "prompt",
        "sum_gap",
        "sum_gap2",
        "table",
    )

    def __init__(self, capacity: int = 256) -> None:
        self.index: dict[str, int] = {}
        self.keys: list[str] = []
        self.n = 0
        self.bucket: IntArray = np.zeros(capacity, np.int64)
        self.dirty: BoolArray = np.zeros(capacity, np.bool_)
        blank = self._blank
        self.count = blank("count", capacity)
        self.prompt = blank("prompt", capacity)
        self.prefix = blank("prefix", capacity)
        self.cached = blank("cached", capacity)
        self.first = blank("first", capacity)
        self.last = blank("last", capacity)
        self.gaps = blank("gaps", capacity)
        self.sum_gap = blank("sum_gap", capacity)
        self.sum_gap2 = blank("sum_gap2", capacity)
        self.last_folded = blank("last_folded", capacity)
        self.gap_late = blank("gap_late", capacity)
        self.pend_rows: list[IntArray] = []
        self.pend_t: list[IntArray] = []
        self.table: KeyTable | None = None
        """The keys by their bytes (keytable.py), built when a scanned batch first needs it."""

    @staticmethod
    def _blank(name: str, size: int) -> IntArray:
        fill = {"first": _FIRST_NONE, "last": _LAST_NONE, "last_folded": -1}.get(name, 0)
        return np.full(size, fill, np.int64)

    def __len__(self) -> int:
        return self.n

    # ------------------------------------------------------------------------------ rows
    def _grow(self, need: int) -> None:
        cap = self.bucket.shape[0]
        if need <= cap:
            return
        new = max(need, 2 * cap)
        for name in ("bucket", "dirty", *COLUMN_FIELDS):
            old = getattr(self, name)
            grown = (
                np.zeros(new, old.dtype) if name in ("bucket", "dirty") else self._blank(name, new)
            )
            grown[:cap] = old
            setattr(self, name, grown)

    def add_key(self, key: str, bucket: int) -> int:
        """The row of a key new to this window."""
        row = self.n
        self._grow(row + 1)
        self.index[key] = row
        self.keys.append(key)
        self.bucket[row] = bucket
        self.n = row + 1
        return row

    def add_keys(self, keys: list[str], buckets: IntArray) -> None:
        """Rows for keys new to this window, in order, with their buckets (one growth step)."""
        first = self.n
        self._grow(first + len(keys))
        self.index.update(zip(keys, range(first, first + len(keys)), strict=True))
        self.keys.extend(keys)
        self.bucket[first : first + len(keys)] = buckets
        self.n = first + len(keys)

    def rows_for(self, keys: Sequence[str], bucket_of: Callable[[str], int]) -> IntArray:
        """Rows of `keys` (one per event), adding keys new to the window in order of appearance."""
        rows = np.fromiter(map(self.index.get, keys, repeat(-1)), np.int64, len(keys))
        missing = np.flatnonzero(rows < 0)
        if missing.size:
            index = self.index
            for i in missing.tolist():
                key = keys[i]
                row = index.get(key)
                if row is None:
                    row = self.add_key(key, bucket_of(key))
                rows[i] = row
        return rows

    def _synced_table(self) -> KeyTable:
        """The byte table, holding every row (keys added by text since are added to it)."""
        table = self.table
        if table is None:
            table = self.table = KeyTable()
        if table.n < self.n:
            table.add([k.encode() for k in self.keys[table.n : self.n]])
        return table

    def rows_for_scanned(self, batch: ScannedBatch, sel: IntArray, buckets: int) -> IntArray:
        """Rows of the scanned batch's keys `sel`, adding keys new to the window (in order of
        appearance, as `rows_for`, each in bucket crc32(key) % `buckets`); only new keys are
        turned into text."""
        table = self._synced_table()
        before = table.n
        rows = table.rows(batch.buf, batch.key_lo, batch.key_hi, batch.key_hash, sel, insert=True)
        if table.n > before:
            self.add_keys(table.new_keys(before), table.new_buckets(before, buckets))
        return rows

    def row(self, key: str, bucket_of: Callable[[str], int]) -> int:
        """The row of one key (added when new)."""
        row = self.index.get(key)
        return self.add_key(key, bucket_of(key)) if row is None else row

    # ------------------------------------------------------------------------------ updates
    def add_events(
        self,
        rows: IntArray,
        times: IntArray,
        prompts: IntArray,
        prefix: IntArray,
        cached: IntArray,
    ) -> None:
        """Add events (aligned arrays; prefix/cached of -1 mean unknown), as `KeyAgg.add` would
        one by one in any order: folds happen only in `fold`, so within a batch the order of
        events does not change what any of them does."""
        late = np.zeros(rows.shape[0], np.bool_)
        if _add_events(
            rows,
            times,
            prompts,
            prefix,
            cached,
            self.count,
            self.prompt,
            self.prefix,
            self.cached,
            self.first,
            self.last,
            self.dirty,
            self.last_folded,
            self.gap_late,
            late,
        ):
            keep = ~late
            rows, times = rows[keep], times[keep]
        self.pend_rows.append(rows)
        self.pend_t.append(times)

    def add_summary(
        self, row: int, count: int, *, first: int, last: int, prompt: int, prefix: int, cached: int
    ) -> None:
        """A pre-aggregated block of `count` events (no timestamps), as `KeyAgg.add_summary`."""
        if count <= 0:
            return
        self.count[row] += count
        self.first[row] = min(int(self.first[row]), first)
        self.last[row] = max(int(self.last[row]), last)
        self.prompt[row] += prompt
        self.prefix[row] += max(prefix, 0)
        self.cached[row] += max(cached, 0)
        self.dirty[row] = True

    def _pending(self) -> tuple[IntArray, IntArray]:
        """All pending (rows, times), compacted into one pair of arrays."""
        if len(self.pend_rows) != 1:
            rows = np.concatenate(self.pend_rows) if self.pend_rows else np.zeros(0, np.int64)
            times = np.concatenate(self.pend_t) if self.pend_t else np.zeros(0, np.int64)
            self.pend_rows, self.pend_t = [rows], [times]
        return self.pend_rows[0], self.pend_t[0]

    def fold(self, upto: int | None, *, rows_over: int = -1, only_dirty: bool = False) -> None:
        """Fold pending times <= `upto` (None: all) into the gap sums, per key in time order.

        Only keys with more than `rows_over` pending times take part (and, with `only_dirty`,
        only keys changed since the last flush): the flush folds busy keys only, as `KeyAgg`'s
        owner did, and the window's close folds everything.
        """
        rows, times = self._pending()
        if not rows.size:
            return
        take = np.ones(rows.shape[0], np.bool_) if upto is None else times <= upto
        if rows_over >= 0 or only_dirty:
            eligible = np.ones(self.n, np.bool_)
            if rows_over >= 0:
                eligible &= np.bincount(rows, minlength=self.n) > rows_over
            if only_dirty:
                eligible &= self.dirty[: self.n]
            take &= eligible[rows]
        if not take.any():
            return
        _fold_pairs(
            rows[take],
            times[take],
            self.n,
            self.gaps,
            self.sum_gap,
            self.sum_gap2,
            self.last_folded,
        )
        keep = ~take
        self.pend_rows, self.pend_t = [rows[keep]], [times[keep]]

    # ------------------------------------------------------------------------------ output
    def rates(self, start: int, end: int) -> RateColumns:
        """Every key's figures for the window [start, end), keys ascending, after folding all
        pending times: `KeyAgg.stats` for each key, with rate = count * 1000 / length (ms)."""
        self.fold(None)
        order = np.asarray(sorted(range(self.n), key=self.keys.__getitem__), np.int64)
        count = self.count[order]
        gaps = self.gaps[order]
        s1 = self.sum_gap[order].astype(np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            mean = (self.last[order] - self.first[order]).astype(np.float64) / (count - 1).astype(
                np.float64
            )
            m = s1 / gaps.astype(np.float64)
            var = np.maximum(self.sum_gap2[order].astype(np.float64) / gaps - m * m, 0.0)
            cv = np.sqrt(var) / m
        has_mean = count >= 2
        has_cv = (gaps >= 2) & (s1 > 0)
        return RateColumns(
            window_start_ms=start,
            window_end_ms=end,
            keys=[self.keys[i] for i in order.tolist()],
            count=count,
            rate=count * 1000.0 / (end - start),
            mean=np.where(has_mean, mean, 0.0),
            has_mean=has_mean,
            cv=np.where(has_cv, cv, 0.0),
            has_cv=has_cv,
            prompt=self.prompt[order],
            prefix=self.prefix[order],
            cached=self.cached[order],
        )

    def dirty_buckets(self) -> list[int]:
        """Buckets holding keys changed since the last `serialise`, ascending."""
        found: list[int] = np.unique(self.bucket[: self.n][self.dirty[: self.n]]).tolist()
        return found

    def serialise(self, buckets: Sequence[int], offset: int) -> list[tuple[int, bytes]]:
        """(bucket, table value) for each of `buckets`: every key of the bucket, columnar.

        Value: `{"o": offset, "c": {"keys": [...], <field>: [...] for COLUMN_FIELDS,
        "pk": [...], "pt": [...]}}` - `pk`/`pt` are the pending times as (position of the key in
        `keys`, time). Clears the dirty marks.
        """
        n = self.n
        bucket = self.bucket[:n]
        order = np.argsort(bucket, kind="stable")  # rows by bucket, first appearance within
        sorted_b = bucket[order]
        pos = np.empty(n, np.int64)
        lo_of = np.searchsorted(sorted_b, sorted_b, side="left")
        pos[order] = np.arange(n, dtype=np.int64) - lo_of
        prow, ptime = self._pending()
        pb = bucket[prow]
        porder = np.argsort(pb, kind="stable")
        pb_sorted = pb[porder]
        out: list[tuple[int, bytes]] = []
        keys = self.keys
        for b in buckets:
            lo, hi = np.searchsorted(sorted_b, [b, b + 1])
            rows = order[lo:hi]
            plo, phi = np.searchsorted(pb_sorted, [b, b + 1])
            psel = porder[plo:phi]
            cols: dict[str, Any] = {"keys": [keys[r] for r in rows.tolist()]}
            for name in COLUMN_FIELDS:
                cols[name] = getattr(self, name)[rows]
            cols["pk"] = pos[prow[psel]]
            cols["pt"] = ptime[psel]
            out.append((b, dump_columns({"o": offset, "c": cols})))
        self.dirty[:n] = False
        return out

    # ------------------------------------------------------------------------------ restore
    def load_bucket(self, bucket: int, value: dict[str, Any]) -> None:
        """Add a bucket's keys from a table value: the columnar form (`"c"`) or the per-key
        `KeyAgg.to_list` form (`"k"`) that workers before the columnar state wrote.

        Raises ValueError (or KeyError/TypeError) for a value in neither form.
        """
        if "c" in value:
            cols = value["c"]
            keys = cols["keys"]
            if not isinstance(keys, list):
                raise ValueError("columnar bucket without a key list")
            data = {name: [int(v) for v in cols[name]] for name in COLUMN_FIELDS}
            pk, pt = [int(v) for v in cols["pk"]], [int(v) for v in cols["pt"]]
        else:
            from cacheroute.streams.keyagg import KeyAgg  # noqa: PLC0415 - old form only

            keys = list(value["k"])
            aggs = [KeyAgg.from_list(v) for v in value["k"].values()]
            data = {name: [] for name in COLUMN_FIELDS}
            pk, pt = [], []
            for i, agg in enumerate(aggs):
                fields = agg.to_list()
                for name, v in zip(COLUMN_FIELDS, fields[:11], strict=True):
                    data[name].append(int(v))  # type: ignore[call-overload]
                pk.extend(repeat(i, len(agg.pending)))
                pt.extend(agg.pending)
        rows = [self.add_key(str(k), bucket) for k in keys]
        if any(len(v) != len(rows) for v in data.values()) or len(pk) != len(pt):
            raise ValueError("bucket columns differ in length")
        at = np.asarray(rows, np.int64)
        for name, values in data.items():
            getattr(self, name)[at] = np.asarray(values, np.int64)
        # a key restored with no events has no first/last (KeyAgg kept 0): leave the sentinels
        empty = self.count[at] == 0
        self.first[at[empty]] = _FIRST_NONE
        self.last[at[empty]] = _LAST_NONE
        if pt:
            self.pend_rows.append(at[np.asarray(pk, np.int64)])
            self.pend_t.append(np.asarray(pt, np.int64))

    def newest_time(self) -> int:
        """The newest event time any key holds (-1: none)."""
        n = self.n
        has = self.count[:n] > 0
        return int(self.last[:n][has].max()) if has.any() else -1


@njit
def _add_events(  # noqa: PLR0917 - the window's columns, passed positionally to numba
    rows: Any,
    times: Any,
    prompts: Any,
    prefix: Any,
    cached: Any,
    count: Any,
    prompt_sum: Any,
    prefix_sum: Any,
    cached_sum: Any,
    first: Any,
    last: Any,
    dirty: Any,
    last_folded: Any,
    gap_late: Any,
    late: Any,
) -> int:
    """`WindowColumns.add_events` in one compiled pass over the events (it was seven `np.add.at`
    and friends, ~10% of the streams worker's CPU): totals, first/last times, the dirty mark,
    and each event older than its key's `last_folded` counted as `gap_late` and marked in
    `late`. Returns how many were late."""
    n_late = 0
    for i in range(rows.shape[0]):
        r = rows[i]
        t = times[i]
        count[r] += 1
        prompt_sum[r] += prompts[i]
        if prefix[i] > 0:
            prefix_sum[r] += prefix[i]
        if cached[i] > 0:
            cached_sum[r] += cached[i]
        first[r] = min(first[r], t)
        last[r] = max(last[r], t)
        dirty[r] = True
        if t < last_folded[r]:
            gap_late[r] += 1
            late[i] = True
            n_late += 1
    return n_late


@njit
def _fold_pairs(  # noqa: PLR0917 - the window's columns, passed positionally to numba
    rows: Any,
    times: Any,
    n: int,
    gaps: Any,
    sum_gap: Any,
    sum_gap2: Any,
    last_folded: Any,
) -> None:
    """Fold (row, time) pairs into the gap sums of rows 0..n-1, per row in time order, starting
    from the row's `last_folded` (-1: none yet; a gap counts only after a time >= 0).

    One compiled pass instead of sorting the pairs: a counting sort by row (rows are dense
    indices), then each row's times, which arrive nearly in time order, sorted only where they
    are not. At a window's close (a million pending times) the sort this replaced, one numpy
    argsort of a combined int64 key, was ~10% of the streams worker's CPU.
    """
    m = rows.shape[0]
    start = np.zeros(n + 1, np.int64)
    for i in range(m):
        start[rows[i] + 1] += 1
    for j in range(n):
        start[j + 1] += start[j]
    fill = start[:n].copy()
    buf = np.empty(m, np.int64)
    for i in range(m):
        r = rows[i]
        buf[fill[r]] = times[i]
        fill[r] += 1
    for r in range(n):
        a, b = start[r], start[r + 1]
        if a == b:
            continue
        seg = buf[a:b]
        for k in range(1, b - a):
            if seg[k] < seg[k - 1]:
                seg.sort()
                break
        prev = last_folded[r]
        for k in range(b - a):
            x = seg[k]
            if prev >= 0:
                g = x - prev
                gaps[r] += 1
                sum_gap[r] += g
                sum_gap2[r] += g * g
            prev = x
        last_folded[r] = prev


def warm_up() -> None:
    """Compile the event pass and the fold now (or load them from numba's disk cache): a worker
    calls this at start, so its first batch does not wait for them."""
    one = np.zeros(1, np.int64)
    _fold_pairs(one, one, 1, one.copy(), one.copy(), one.copy(), np.full(1, -1, np.int64))
    cols = WindowColumns(1)
    cols.add_events(one, one, one, one, one)
