"""Emptying a retired routing table (`dispatcher._drain`): every dict ends empty, and the work
comes in slices with a pause between them, so a routing thread waiting for the GIL gets it."""

from __future__ import annotations

from collections.abc import Sized

from cacheroute.dispatcher.dispatcher import _drain
from cacheroute.dispatcher.routing import table_from_plan
from tests.unit.dispatcher.fakes import fake_plan


def test_a_drained_table_is_empty_and_paced_by_slices() -> None:
    names = ["d0", "d1", "d2"]
    single = [(f"t{i % 2}/k{i}", [0]) for i in range(10)]  # 10 one-destination keys
    table = table_from_plan(fake_plan(1, [*single, ("t0/wide", [1, 2])], names), names)
    dicts: list[Sized] = [*table.shards, table.multi, table.groups]
    assert [len(d) for d in dicts] == [10, 1, 2]  # one dict of keys; the wide key; t0 and t1
    pauses: list[int] = []
    _drain(table, lambda: pauses.append(1), 3)
    assert all(len(d) == 0 for d in dicts)
    # per dict of n keys, slices of 3: ceil(n / 3) to collect its keys, 1 after clearing it,
    # ceil(n / 3) to free them: 10 keys -> 4 + 1 + 4, 1 key -> 1 + 1 + 1, 2 groups -> 1 + 1 + 1
    assert len(pauses) == 9 + 3 + 3


def test_keys_held_elsewhere_survive_the_drain() -> None:
    names = ["d0", "d1"]
    keys = [f"conversation-{i}" for i in range(7)]
    table = table_from_plan(fake_plan(1, [(k, [1]) for k in keys], names, sep=None), names)
    _drain(table, lambda: None, 2)
    assert keys == [f"conversation-{i}" for i in range(7)]
    assert all(len(d) == 0 for d in table.shards)
