"""Sibling groups of a routing table (`routing._groups`) against a plain reference.

The gateway rebuilds the groups for every plan version, so they are computed with C-level passes
and one `np.unique`; the reference below is the obvious per-key loop (split each key at its last
separator, union its known destinations into its group's set). Both must agree on every input:
keys without the separator, keys whose group is empty text ("/x"), multi-character and
non-ASCII separators and keys, destinations unknown here (-1), keys with no destination at all,
and slices of any size.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from cacheroute.dispatcher.routing import _groups, build_table


def reference(keys: list[str], dests: list[list[int]], sep: str) -> dict[str, tuple[int, ...]]:
    members: dict[str, set[int]] = {}
    for key, ds in zip(keys, dests, strict=True):
        group, found, _ = key.rpartition(sep)
        if found:
            members.setdefault(group, set()).update(d for d in ds if d >= 0)
    return {g: tuple(sorted(d)) for g, d in members.items() if d}


_parts = st.text(alphabet="ab/:é", max_size=4)
_case = st.lists(st.tuples(_parts, st.lists(st.integers(-1, 6), max_size=3)), max_size=60)


@settings(max_examples=300, deadline=None)
@given(_case, st.sampled_from(["/", ":", "é", "//"]), st.integers(0, 9))
def test_groups_match_the_per_key_reference(
    case: list[tuple[str, list[int]]], sep: str, step: int
) -> None:
    keys = [k for k, _ in case]
    dests = [d for _, d in case]
    offsets = np.concatenate(([0], np.cumsum([len(d) for d in dests]))).astype(np.int64)
    targets = np.array([t for d in dests for t in d], dtype=np.int64)
    pauses: list[int] = []
    got = _groups(keys, offsets, targets, sep, step=step, pause=lambda: pauses.append(1))
    want = reference(keys, dests, sep)
    assert got == want
    assert list(got) == list(want)  # groups in order of first appearance, too
    if step and keys:
        assert len(pauses) >= -(-len(keys) // step)  # at least once per slice of keys


def test_hand_derived_groups() -> None:
    keys = ["t1/a", "t2/x", "plain", "t1/b", "/root", "t3/only-unknown", "a/b/c"]
    offsets = np.array([0, 1, 2, 3, 5, 6, 7, 8], dtype=np.int64)
    targets = np.array([4, 7, 1, 0, 4, 2, -1, 3], dtype=np.int64)
    assert _groups(keys, offsets, targets, "/") == {
        "t1": (0, 4),  # d4 from t1/a, d0 and d4 from t1/b: each once, sorted
        "t2": (7,),
        "": (2,),  # "/root": the text before the separator is empty, still a group
        "a/b": (3,),  # the last separator splits
    }  # "plain" has no separator; t3's only key has no destination known here


def test_build_table_groups_from_names() -> None:
    names = [f"d{i}" for i in range(6)]
    table = build_table(
        1,
        0,
        [("t1/a", ["d5", "d1"]), ("t1/b", ["d1"]), ("t2/x", ["gone"]), ("t3/y", ["d0"])],
        [*names, "gone"],
        names,
        group_separator="/",
    )
    assert dict(table.groups) == {"t1": (1, 5), "t3": (0,)}
