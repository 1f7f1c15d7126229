"""Keys' sibling groups found by one compiled pass over the keys' UTF-8 bytes (needs numba).

Why: a gateway finds the sibling group of every admitted key for every plan version (the text
before the key's last separator; `routing._groups`). Python code pays at least one dict probe per
key for that (~250 ns for 61k keys here: cache misses), about a quarter of a version's CPU in a
gateway. Here the keys are joined into one NUL-separated UTF-8 buffer (C-level `str.join` and
`str.encode`, a slice at a time), and a compiled pass cuts each key at its last separator and
numbers the distinct group texts in order of first appearance with an open-addressing table; it
runs without the GIL. Only the distinct groups become Python strings.

Exactness: the separator's UTF-8 bytes are found in the key's bytes. UTF-8 is self-synchronising
(a lead byte is never a continuation byte), so a byte match of a whole encoded character sequence
starts at a character boundary and the last byte match is `str.rfind`'s. Group texts are compared
byte for byte on every hash match (a hash collision, chosen keys included, costs a longer probe,
never a wrong group). A key that holds a NUL character would split in two; the caller is told
(None) and uses the Python path.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from cacheroute.schemas.avrojit import njit

__all__ = ["group_codes", "group_pairs", "warm_up"]

_FNV_SEED = np.uint64(0xCBF29CE484222325)
_FNV_PRIME = np.uint64(0x100000001B3)


@njit
def _last_separator(buf: Any, pos: int, end: int, sep: Any) -> Any:
    """Start of the last occurrence of `sep` in buf[pos:end], or -1 (`str.rfind`)."""
    m = sep.shape[0]
    j = end - m
    while j >= pos:
        t = 0
        while t < m and buf[j + t] == sep[t]:
            t += 1
        if t == m:
            return j
        j -= 1
    return -1


@njit
def _group_id(  # noqa: PLR0917 - the pass's state, passed positionally to numba
    buf: Any, lo: int, hi: int, spans: Any, table: Any, groups: int, text: Any, used: int
) -> int:
    """The id of group text buf[lo:hi]: found in `table`, or the next id (`groups`) added, its
    bytes then copied to `text` at `used` (spans are positions in `text`).

    Comparing against that compact copy of the distinct group texts rather than against the
    group's first occurrence in `buf` keeps every comparison in a few kilobytes that stay in the
    cache, where the first occurrence is anywhere in a ~1.4 MB buffer (measured: the pass over a
    61k-key plan 5.6 -> 4.2 ms)."""
    h = _FNV_SEED
    for t in range(lo, hi):
        h = (h ^ np.uint64(buf[t])) * _FNV_PRIME
    mask = table.shape[0] - 1
    slot = np.int64(h & np.uint64(mask))
    length = hi - lo
    while True:
        g = table[slot]
        if g < 0:
            table[slot] = groups
            spans[2 * groups] = used
            spans[2 * groups + 1] = used + length
            for t in range(length):
                text[used + t] = buf[lo + t]
            return groups
        a = spans[2 * g]
        if spans[2 * g + 1] - a == length:
            t = 0
            while t < length and text[a + t] == buf[lo + t]:
                t += 1
            if t == length:
                return int(g)
        slot = (slot + 1) & mask


@njit
def _number_groups(  # noqa: PLR0917 - numba takes its arrays positionally
    buf: Any, sep: Any, codes: Any, spans: Any, table: Any, text: Any
) -> int:
    """Fill `codes` (a group id per key, -1: no separator), `text` (each distinct group's bytes,
    in order of first appearance) and `spans` (start, end of each group's bytes in `text`, by
    id); the number of groups, or -1 when `buf` does not hold exactly `len(codes)` NUL-separated
    keys. `table` (-1 everywhere, a power-of-two size above the key count) is the
    open-addressing table: slot -> group id; `text` needs `len(buf)` bytes at most."""
    n = buf.shape[0]
    keys = codes.shape[0]
    groups = 0
    used = 0
    pos = 0
    one = sep[0] if sep.shape[0] == 1 else -1  # a one-byte separator: found on the way
    for k in range(keys):
        end = pos
        cut = -1
        if one >= 0:
            while end < n and buf[end] != 0:
                if buf[end] == one:
                    cut = end
                end += 1
        else:
            while end < n and buf[end] != 0:
                end += 1
            cut = _last_separator(buf, pos, end, sep)
        if end == n and k != keys - 1:
            return -1
        if cut < 0:
            codes[k] = -1
        else:
            g = _group_id(buf, pos, cut, spans, table, groups, text, used)
            codes[k] = g
            if g == groups:
                groups += 1
                used += cut - pos
        pos = end + 1
    if keys and pos != n + 1:
        return -1
    return groups


@njit
def group_pairs(codes: Any, offsets: Any, targets: Any, width: int) -> Any:
    """Sorted distinct `group * width + destination` codes over every key with a group and each
    of its destinations known here (>= 0): what `np.unique` gives, computed without the GIL
    (an `np.unique` over a 61k-key plan holds it ~1.5 ms, longer than a gateway may stall).

    When the codes span few cells next to their number (a 61k-key plan has ~1k groups over 30
    destinations: 30k cells), a presence table marks each code and one scan of it yields them in
    order: linear, where sorting the 61k codes took ~3-4 ms of a gateway's CPU per version.
    Otherwise (many groups over many destinations) the codes are sorted and deduplicated."""
    out = np.empty(targets.shape[0], np.int64)
    m = 0
    cells = 0
    for k in range(codes.shape[0]):
        g = codes[k]
        if g < 0:
            continue
        for j in range(offsets[k], offsets[k + 1]):
            t = targets[j]
            if t >= 0:
                out[m] = g * width + t
                cells = max(cells, out[m] + 1)
                m += 1
    if cells <= 4 * m + 65536:
        return _distinct_by_table(out[:m], cells)
    return _distinct_by_sort(out[:m])


@njit
def _distinct_by_table(values: Any, cells: int) -> Any:
    """The distinct values (all in [0, cells)) in ascending order, by a presence table."""
    seen = np.zeros(cells, np.bool_)
    distinct = 0
    for v in values:
        if not seen[v]:
            seen[v] = True
            distinct += 1
    found = np.empty(distinct, np.int64)
    i = 0
    for c in range(cells):
        if seen[c]:
            found[i] = c
            i += 1
    return found


@njit
def _distinct_by_sort(values: Any) -> Any:
    """The distinct values in ascending order, by a sort."""
    pairs = np.sort(values)
    keep = 0
    for i in range(pairs.shape[0]):
        if keep == 0 or pairs[i] != pairs[keep - 1]:
            pairs[keep] = pairs[i]
            keep += 1
    return pairs[:keep]


def group_codes(
    keys: Sequence[str], sep: str, *, step: int, pause: Callable[[], None]
) -> tuple[np.ndarray[Any, np.dtype[np.int64]], list[str]] | None:
    """(each key's group id, -1 for none; the group texts by id, in order of first appearance),
    or None when a key holds a NUL character or a lone surrogate (then split them in Python).

    `pause` runs between slices of `step` keys while the keys are joined (the compiled pass
    itself runs without the GIL).
    """
    n = len(keys)
    step = step or n or 1
    parts: list[bytes] = []
    try:
        for lo in range(0, n, step):
            parts.append("\x00".join(keys[lo : lo + step]).encode())
            pause()
    except UnicodeEncodeError:  # a lone surrogate (no key read off the wire has one)
        return None
    raw = b"\x00".join(parts)
    codes = np.empty(n, dtype=np.int64)
    spans = np.empty(2 * n, dtype=np.int64)
    size = 1 << max(4, (2 * n).bit_length())
    table = np.full(size, -1, dtype=np.int64)
    text = np.empty(len(raw), dtype=np.uint8)
    groups = _number_groups(
        np.frombuffer(raw, np.uint8),
        np.frombuffer(sep.encode(), np.uint8),
        codes,
        spans,
        table,
        text,
    )
    if groups < 0:  # a key holds NUL: it split in two, so the keys do not come out even
        return None
    bounds = spans[: 2 * groups].tolist()
    texts = text[: bounds[-1] if groups else 0].tobytes()
    names: list[str] = []
    for g in range(groups):
        names.append(texts[bounds[2 * g] : bounds[2 * g + 1]].decode())
        if (g + 1) % step == 0:
            pause()
    return codes, names


def warm_up() -> None:
    """Compile (or load from numba's disk cache) before the first plan arrives."""
    found = group_codes(["a/b", "c"], "/", step=0, pause=lambda: None)
    assert found is not None
    group_pairs(found[0], np.array([0, 1, 2], np.int64), np.array([0, 1], np.int64), 2)
