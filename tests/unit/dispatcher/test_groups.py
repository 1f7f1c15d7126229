"""Sibling groups of a routing table (`routing._groups`) against a plain reference.

The gateway rebuilds the groups for every plan version, so they are computed with C-level passes
and one `np.unique`; the reference below is the obvious per-key loop (split each key at its last
separator, union its known destinations into its group's set). Both must agree on every input:
keys without the separator, keys whose group is empty text ("/x"), multi-character and
non-ASCII separators and keys, destinations unknown here (-1), keys with no destination at all,
and slices of any size. Both ways of finding keys' groups are checked: the compiled pass
(`group_codes`, with numba) and the Python one (`KeyGroups`, the base install's).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cacheroute.dispatcher import routing
from cacheroute.dispatcher.dispatcher import Dispatcher
from cacheroute.dispatcher.group_codes import group_codes, group_pairs
from cacheroute.dispatcher.routing import KeyGroups, _groups, build_table
from tests.unit.dispatcher.fakes import fake_plan

PATHS = pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "python"])


@contextmanager
def _path(compiled: bool) -> Iterator[None]:
    """The compiled pass as installed, or the Python path as without numba."""
    if compiled:
        assert routing.compiled_groups() is not None  # the dev install has numba
        yield
    else:
        with mock.patch.object(routing, "compiled_groups", return_value=None):
            yield


def reference(keys: list[str], dests: list[list[int]], sep: str) -> dict[str, tuple[int, ...]]:
    members: dict[str, set[int]] = {}
    for key, ds in zip(keys, dests, strict=True):
        group, found, _ = key.rpartition(sep)
        if found:
            members.setdefault(group, set()).update(d for d in ds if d >= 0)
    return {g: tuple(sorted(d)) for g, d in members.items() if d}


_parts = st.text(alphabet="ab/:é", max_size=4)
_case = st.lists(st.tuples(_parts, st.lists(st.integers(-1, 6), max_size=3)), max_size=60)


@PATHS
@settings(max_examples=300, deadline=None)
@given(case=_case, sep=st.sampled_from(["/", ":", "é", "//"]), step=st.integers(0, 9))
def test_groups_match_the_per_key_reference(
    compiled: bool, case: list[tuple[str, list[int]]], sep: str, step: int
) -> None:
    keys = [k for k, _ in case]
    dests = [d for _, d in case]
    offsets = np.concatenate(([0], np.cumsum([len(d) for d in dests]))).astype(np.int64)
    targets = np.array([t for d in dests for t in d], dtype=np.int64)
    pauses: list[int] = []
    with _path(compiled):
        got = _groups(keys, offsets, targets, sep, step=step, pause=lambda: pauses.append(1))
    want = reference(keys, dests, sep)
    assert got == want
    assert list(got) == list(want)  # groups in order of first appearance, too
    if step and keys:
        assert len(pauses) >= -(-len(keys) // step)  # at least once per slice of keys


@PATHS
def test_hand_derived_groups(compiled: bool) -> None:
    keys = ["t1/a", "t2/x", "plain", "t1/b", "/root", "t3/only-unknown", "a/b/c"]
    offsets = np.array([0, 1, 2, 3, 5, 6, 7, 8], dtype=np.int64)
    targets = np.array([4, 7, 1, 0, 4, 2, -1, 3], dtype=np.int64)
    with _path(compiled):
        got = _groups(keys, offsets, targets, "/")
    assert got == {
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


@settings(max_examples=150, deadline=None)
@given(st.lists(_case, min_size=1, max_size=5), st.sampled_from(["/", "é"]), st.integers(0, 7))
def test_a_cache_kept_across_versions_gives_the_reference_groups(
    versions: list[list[tuple[str, list[int]]]], sep: str, step: int
) -> None:
    cache = KeyGroups(sep, slack=3)  # small: the cache is dropped and refilled along the way
    for case in versions:
        keys = [k for k, _ in case]
        dests = [d for _, d in case]
        offsets = np.concatenate(([0], np.cumsum([len(d) for d in dests]))).astype(np.int64)
        targets = np.array([t for d in dests for t in d], dtype=np.int64)
        with _path(False):
            got = _groups(keys, offsets, targets, sep, step=step, cache=cache)
        assert got == reference(keys, dests, sep)
        assert len(cache) <= 2 * len(keys) + 3 + len(set(keys))


def test_the_cache_splits_only_keys_it_has_not_seen() -> None:
    cache = KeyGroups("/")
    assert cache.codes(["t1/a", "t2/b", "plain", "t1/c"]).tolist() == [0, 1, -1, 0]
    assert cache.names == ["t1", "t2"]
    assert cache.split == 4
    # the ids stay stable across versions; only the two new keys are split
    assert cache.codes(["t3/x", "t1/a", "t2/b", "t1/d"]).tolist() == [2, 0, 1, 0]
    assert cache.split == 6
    assert cache.names == ["t1", "t2", "t3"]
    assert cache.codes(["t1/a", "t3/x"]).tolist() == [0, 2]
    assert cache.split == 6


@PATHS
def test_a_dispatcher_routes_new_keys_by_group(compiled: bool) -> None:
    names = [f"d{i}" for i in range(4)]
    d = Dispatcher(names)
    plan = fake_plan(1, [("t1/a", [0]), ("t1/b", [2]), ("t2/x", [3])], names)
    with _path(compiled):
        assert d.apply_plan(plan)
        assert d.table is not None
        assert dict(d.table.groups) == {"t1": (0, 2), "t2": (3,)}
        assert d.apply_plan(fake_plan(2, [("t1/a", [1]), ("t2/x", [3]), ("t2/y", [0])], names))
    assert dict(d.table.groups) == {"t1": (1,), "t2": (0, 3)}
    assert d._key_groups is not None
    # the Python path remembers the keys it split (the compiled one needs no memory)
    assert len(d._key_groups) == (0 if compiled else 4)


def test_the_compiled_pass_declines_keys_it_cannot_join() -> None:
    none = lambda: None  # noqa: E731
    assert group_codes(["t/a", "t/b\x00c"], "/", step=0, pause=none) is None  # NUL: two keys
    assert group_codes(["t/a", "t/\ud800"], "/", step=0, pause=none) is None  # lone surrogate
    codes, names = group_codes(["t/a", "x", "t/b", "é/é/c", ""], "é", step=2, pause=none) or (
        np.zeros(0),
        [],
    )
    assert codes.tolist() == [-1, -1, -1, 0, -1]
    assert names == ["é/"]
    with _path(True):  # and _groups then takes the Python path, with the same answer
        keys = ["t/a", "t/b\x00c"]
        got = _groups(keys, np.array([0, 1, 2]), np.array([1, 2]), "/")
    assert got == reference(keys, [[1], [2]], "/")


@settings(max_examples=300, deadline=None)
@given(
    data=st.data(),
    groups=st.one_of(st.integers(1, 40), st.integers(10**5, 10**7)),
    width=st.one_of(st.integers(1, 8), st.integers(1000, 5000)),
)
def test_group_pairs_are_the_distinct_sorted_codes(
    data: st.DataObject, groups: int, width: int
) -> None:
    """Both ways `group_pairs` finds the pairs (a presence table when groups x width cells are
    few, else a sort: the wide universes here take that path) give what np.unique gives."""
    per_key = data.draw(
        st.lists(
            st.tuples(
                st.integers(-1, groups - 1), st.lists(st.integers(-1, width - 1), max_size=4)
            ),
            max_size=50,
        )
    )
    codes = np.array([g for g, _ in per_key], dtype=np.int64)
    offsets = np.concatenate(([0], np.cumsum([len(t) for _, t in per_key]))).astype(np.int64)
    targets = np.array([t for _, ts in per_key for t in ts], dtype=np.int64)
    want = sorted({g * width + t for g, ts in per_key if g >= 0 for t in ts if t >= 0})
    assert group_pairs(codes, offsets, targets, width).tolist() == want


def test_group_pairs_hand_derived() -> None:
    # key 0: group 1 -> d2, d0; key 1: no group; key 2: group 1 -> d2 again, d-1 unknown;
    # key 3: group 0 -> d1. Width 3: codes 1*3+0, 1*3+2, 0*3+1 -> 1, 3, 5.
    codes = np.array([1, -1, 1, 0], dtype=np.int64)
    offsets = np.array([0, 2, 3, 5, 6], dtype=np.int64)
    targets = np.array([2, 0, 1, 2, -1, 1], dtype=np.int64)
    assert group_pairs(codes, offsets, targets, 3).tolist() == [1, 3, 5]
    empty = np.zeros(0, dtype=np.int64)
    assert group_pairs(empty, np.zeros(1, dtype=np.int64), empty, 1).tolist() == []
