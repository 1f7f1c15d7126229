"""Routing rules: plan members by in-flight load, the cold path for the rest, failure fallbacks."""

from __future__ import annotations

import bisect
import gc
import random
import sys
import threading
from collections import Counter

import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from cacheroute.dispatcher.errors import DispatchError
from cacheroute.dispatcher.routing import (
    RING_VNODES,
    RouteKind,
    Router,
    _ring,
    build_table,
    ring_hash,
    ring_start,
)

NAMES = ["d0", "d1", "d2", "d3"]


def router(seed: int = 0, *, cold_affinity: bool = True) -> Router:
    r = Router(NAMES, rng=random.Random(seed), cold_affinity=cold_affinity)
    r.table = build_table(
        7,
        1000,
        [("hot", ["d2", "d0"]), ("solo", ["d1"]), ("gone", ["d9"])],
        ["d0", "d1", "d2", "d9"],
        NAMES,
    )
    return r


def test_admitted_key_goes_to_least_loaded_member() -> None:
    r = router()
    r.acquire(2)
    assert r.route("hot") == "d0"
    r.acquire(0)
    r.acquire(0)
    assert r.route("hot") == "d2"
    r.release(2)
    assert r.route("hot") == "d2"
    assert r.counts[RouteKind.PLAN] == 3


def test_ties_among_members_are_shared_evenly() -> None:
    # Nothing in flight (a gateway among many): the two replicas must still share the key's
    # traffic as planned, not all go to the first member.
    r = router(seed=5)
    picks = Counter(r.route("hot") for _ in range(4000))
    assert set(picks) == {"d0", "d2"}
    assert picks["d0"] == pytest.approx(2000, rel=0.08)
    three = Router(NAMES, rng=random.Random(6))
    three.table = build_table(1, 0, [("k", ["d3", "d1", "d0"])], NAMES, NAMES)
    three.acquire(1)  # d1 is busier: the tie is between d3 and d0 only
    picks = Counter(three.route("k") for _ in range(3000))
    assert set(picks) == {"d3", "d0"}
    assert picks["d3"] == pytest.approx(1500, rel=0.1)


def test_admitted_keys_never_leave_their_replica_set_while_any_member_lives() -> None:
    r = router()
    for _ in range(200):
        d = r.route_index("hot")
        assert r.names[d] in ("d2", "d0")
        r.acquire(d)


def test_without_cold_affinity_cold_keys_use_two_distinct_choices() -> None:
    r = router(seed=3, cold_affinity=False)
    r.inflight[:] = [5, 0, 5, 5]
    picks = Counter(r.route(f"cold-{i}") for i in range(3000))
    # d1 wins every draw it is part of: P(d1 drawn) = 1 - (3/4 * 2/3) = 1/2
    assert picks["d1"] == pytest.approx(1500, rel=0.1)
    assert r.counts[RouteKind.COLD] == 3000


def test_mark_down_excludes_at_once_and_whole_set_down_falls_back() -> None:
    r = router()
    r.mark_down("d2")
    assert r.route("hot") == "d0"
    r.mark_down("d0")
    for _ in range(100):
        assert r.route("hot") in ("d1", "d3")
    assert r.counts[RouteKind.PLAN_DOWN] == 100
    r.mark_up("d2")
    assert r.route("hot") == "d2"
    assert not r.mark_down("nope")


def test_every_destination_down_still_routes() -> None:
    r = router()
    for d in NAMES:
        r.mark_down(d)
    assert {r.route(f"k{i}") for i in range(50)} <= set(NAMES)
    assert r.counts[RouteKind.ALL_DOWN] == 50


def _ring_order(key: str, names: list[str]) -> list[str]:
    """Brute force: destinations in the order a clockwise walk from the key's point meets them."""
    points = sorted((ring_hash(f"{n}#{j}"), n) for n in names for j in range(RING_VNODES))
    h = ring_hash(key)
    after = [n for p, n in points if p >= h] + [n for p, n in points if p < h]
    return list(dict.fromkeys(after))


def test_cold_key_goes_to_its_ring_home_on_every_gateway() -> None:
    # Two gateways with other random streams and another order of the same destinations.
    a = Router(NAMES, rng=random.Random(1))
    b = Router(list(reversed(NAMES)), rng=random.Random(2))
    for i in range(300):
        key = f"tenant-3/conv-{i}"
        home = _ring_order(key, NAMES)[0]
        assert a.route(key) == home
        assert b.route(key) == home
    assert a.counts[RouteKind.NO_PLAN] == 300


def test_cold_key_skips_a_home_at_the_load_bound() -> None:
    r = router()
    key = "new-conversation"
    order = _ring_order(key, NAMES)
    home, second = r.index[order[0]], r.index[order[1]]
    for _ in range(3):
        r.acquire(home)
    # 3 in flight: bound = ceil(1.25 x 4 / 4) = 2, the home holds 3 -> next on the ring
    assert r.route(key) == order[1]
    for _ in range(2):
        r.acquire(second)
    # 5 in flight: bound = ceil(1.25 x 6 / 4) = 2; home 3, second 2 -> the third
    assert r.route(key) == order[2]
    assert r.counts[RouteKind.COLD] == 2


def test_a_down_destination_moves_only_its_own_cold_keys() -> None:
    r = router()
    keys = [f"k{i}" for i in range(400)]
    before = {k: r.route(k) for k in keys}
    r.mark_down("d1")
    after = {k: r.route(k) for k in keys}
    moved = {k for k in keys if before[k] != after[k]}
    assert moved == {k for k in keys if before[k] == "d1"}
    assert all(after[k] == _ring_order(k, ["d0", "d2", "d3"])[0] for k in moved)


def test_bad_cold_load_factor_is_refused() -> None:
    with pytest.raises(DispatchError, match="cold_load_factor"):
        Router(NAMES, cold_load_factor=0.9)


def test_no_plan_and_stale_plan_use_the_cold_path() -> None:
    r = Router(NAMES, rng=random.Random(1))
    r.route("hot")
    assert r.counts[RouteKind.NO_PLAN] == 1
    r = router()
    r.stale = True
    r.route("hot")
    assert r.counts[RouteKind.STALE] == 1


def test_unknown_and_unplanned_destinations_are_reported() -> None:
    r = router()
    assert r.table is not None
    assert r.table.unknown_destinations == frozenset({"d9"})
    assert r.table.unplanned_destinations == frozenset({"d3"})
    assert "gone" not in r.table  # its only destination is unknown here: cold key


def test_release_never_goes_negative_and_counts_stay_exact_across_threads() -> None:
    r = router()
    r.release(1)
    assert r.inflight[1] == 0

    def work() -> None:
        for _ in range(20_000):
            d = r.route_index("solo")
            r.acquire(d)
            r.release(d)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert r.inflight == [0, 0, 0, 0]
    assert r.total_inflight == 0


def test_same_seed_same_decisions() -> None:
    a, b = router(seed=9), router(seed=9)
    assert [a.route(f"c{i}") for i in range(100)] == [b.route(f"c{i}") for i in range(100)]


def test_bad_configuration_is_refused() -> None:
    with pytest.raises(DispatchError):
        Router([])
    with pytest.raises(DispatchError):
        Router(["a", "a"])


def test_overloaded_member_spills_to_the_cold_path_only_past_both_bounds() -> None:
    r = Router(NAMES, rng=random.Random(1), spill_min_inflight=4)  # spill_factor 2 by default
    r.table = build_table(1, 0, [("solo", ["d1"]), ("hot", ["d2", "d0"])], NAMES, NAMES)
    for _ in range(3):
        r.acquire(1)
    # 3 in flight, all on d1: 3 x 4 >= 2 x (3 + 1), but below the floor of 4 -> still planned.
    assert r.route("solo") == "d1"
    r.acquire(1)
    # 4 on d1 (>= floor) and 4 x 4 >= 2 x (4 + 1): overloaded -> the key's first ring
    # destination other than d1 (ring bound ceil(1.25 x 5 / 4) = 2 excludes d1), every time
    expected = next(d for d in _ring_order("solo", NAMES) if d != "d1")
    picks = Counter(r.route("solo") for _ in range(200))
    assert picks == {expected: 200}
    assert r.counts[RouteKind.SPILLED] == 200
    for d in (0, 2, 3):  # spread the load: d1 now holds 4 of 16, below 2 x the mean
        for _ in range(4):
            r.acquire(d)
    assert r.route("solo") == "d1"

    # Multi-replica keys: the least-loaded member is checked the same way.
    eight = [f"d{i}" for i in range(8)]
    m = Router(eight, rng=random.Random(2), spill_min_inflight=4)
    m.table = build_table(1, 0, [("hot", ["d2", "d0"])], eight, eight)
    for _ in range(20):  # 40 in flight, mean 5: both members hold 4x the mean
        m.acquire(2)
        m.acquire(0)
    assert m.route("hot") not in ("d0", "d2")
    assert m.counts[RouteKind.SPILLED] == 1


def test_the_spill_floor_counts_requests_whatever_they_weigh() -> None:
    r = Router(NAMES, rng=random.Random(1), spill_min_inflight=4)
    r.table = build_table(1, 0, [("solo", ["d1"])], NAMES, NAMES)
    for _ in range(3):  # three long prompts of 30 units each, all on d1
        r.acquire(1, 30)
    # 90 units: 90 x 4 >= 2 x (90 + 1), but 3 requests are below the floor of 4 requests
    # (a floor in units, 4, would have spilled after the first one)
    assert r.route("solo") == "d1"
    r.acquire(1, 30)
    assert r.route("solo") != "d1"  # 4 requests' worth: past both bounds
    assert r.counts[RouteKind.SPILLED] == 1
    for _ in range(4):
        r.release(1, 30)
    assert (r.total_inflight, r.total_requests) == (0, 0)


def test_spill_can_be_turned_off() -> None:
    r = Router(NAMES, rng=random.Random(1), spill_factor=None)
    r.table = build_table(1, 0, [("solo", ["d1"])], NAMES, NAMES)
    for _ in range(100):
        r.acquire(1)
    assert r.route("solo") == "d1"
    assert r.counts[RouteKind.SPILLED] == 0


@pytest.mark.parametrize(("factor", "floor"), [(0.5, 16), (float("nan"), 16), (2.0, 0)])
def test_bad_spill_settings_are_refused(factor: float, floor: int) -> None:
    with pytest.raises(DispatchError, match="spill"):
        Router(NAMES, spill_factor=factor, spill_min_inflight=floor)


def grouped(seed: int = 0, names: list[str] | None = None) -> Router:
    names = names or [f"d{i}" for i in range(8)]
    r = Router(names, rng=random.Random(seed))
    r.table = build_table(
        3,
        0,
        [("t1/a", ["d0"]), ("t1/b", ["d2", "d5"]), ("t2/x", ["d7"])],
        sorted(names),
        names,
        group_separator="/",
    )
    return r


def test_new_keys_of_a_known_group_go_to_the_groups_destinations() -> None:
    r = grouped()
    assert r.table is not None
    assert dict(r.table.groups) == {"t1": (0, 2, 5), "t2": (7,)}
    picks = Counter(r.route(f"t1/new-{i}") for i in range(900))
    # rendezvous hashing over {d0, d2, d5}: every new key lands there, about evenly
    assert set(picks) == {"d0", "d2", "d5"}
    assert min(picks.values()) > 200
    assert Counter(r.route(f"t2/new-{i}") for i in range(50)) == {"d7": 50}


def test_every_gateway_picks_the_same_group_member_for_a_key() -> None:
    names = [f"d{i}" for i in range(8)]
    a = grouped(seed=1, names=names)
    b = grouped(seed=2, names=list(reversed(names)))
    keys = [f"t1/conv-{i}" for i in range(300)]
    assert [a.route(k) for k in keys] == [b.route(k) for k in keys]


def test_keys_of_unknown_groups_and_overloaded_members_use_the_ring() -> None:
    names = [f"d{i}" for i in range(8)]
    r = grouped(names=names)
    assert r.route("t9/conv-1") == _ring_order("t9/conv-1", names)[0]
    member = r.index[r.route("t2/conv-1")]  # d7, the group's only destination
    for _ in range(4):
        r.acquire(member)
    # 4 in flight on d7: bound ceil(1.25 x 5 / 8) = 1 -> the ring, skipping d7
    fresh = "t2/conv-2"
    expected = next(d for d in _ring_order(fresh, names) if d != "d7")
    assert r.route(fresh) == expected


def test_a_new_key_takes_the_less_loaded_of_its_two_ring_candidates_then_stays() -> None:
    names = [f"d{i}" for i in range(8)]
    r = Router(names, rng=random.Random(0))
    key = "conv-77"
    first, second = (r.index[n] for n in _ring_order(key, names)[:2])
    for d in range(8):  # 16 in flight, 2 each: bound ceil(1.25 x 17 / 8) = 3
        r.acquire(d)
        r.acquire(d)
    r.release(second)  # the second candidate is now the less loaded: 1 against 2
    assert r.route(key) == names[second]
    r.acquire(second)
    r.acquire(second)  # 3 there now, at the bound: the key is no longer held there
    r.release(first)
    # seen before, its last destination is at the bound: the first candidate (under it)
    assert r.route(key) == names[first]
    one = Router(names, rng=random.Random(0), cold_choices=1)
    for d in range(8):
        one.acquire(d)
    one.release(second)
    assert one.route(key) == names[first]  # one choice: the ring home while under the bound
    with pytest.raises(DispatchError, match="cold_choices"):
        Router(names, cold_choices=3)


class _BrokenHash(str):
    """A str whose hash raises: what a careless caller's key type might do."""

    def __hash__(self) -> int:
        raise RuntimeError("no hash")


@pytest.mark.parametrize(
    "key", [["a", "list"], {"a": "dict"}, None, 42, b"bytes", 1.5, _BrokenHash("hot")]
)
def test_route_never_raises_whatever_the_key(key: object) -> None:
    """Unhashable and non-string keys go by power-of-two-choices and are counted `bad_key`."""
    for stale in (False, True):
        r = router()
        r.stale = stale
        d0 = r.route_index(key)
        name = r.route(key)
        assert 0 <= d0 < len(NAMES)
        assert name in NAMES
        assert r.counts[RouteKind.BAD_KEY] == 2
        assert RouteKind.NAMES[RouteKind.BAD_KEY] == "bad_key"
    # with no plan at all, too
    r = Router(NAMES, rng=random.Random(1))
    assert r.route(["x"]) in NAMES
    assert r.counts[RouteKind.BAD_KEY] == 1
    # a good key right after still routes by the plan
    r = router()
    r.route({"k": 1})
    assert r.route("solo") == "d1"
    assert r.counts[RouteKind.PLAN] == 1


def test_spill_home_takes_a_spilled_key_to_the_less_loaded_of_its_two_homes() -> None:
    r = Router(NAMES, rng=random.Random(1), spill_min_inflight=4, spill_home=True)
    r.table = build_table(1, 0, [("solo", ["d1"]), ("other", ["d3"])], NAMES, NAMES)
    # Never spilled: the plan's destination, however the others are loaded.
    r.acquire(0, 5)
    assert r.route("solo") == "d1"
    r.release(0, 5)
    assert r.counts[RouteKind.SPILL_HOME] == 0
    # 4 on d1 of 4 in flight: past both spill bounds -> the ring's first destination other
    # than d1 (the ring bound ceil(1.25 x 5 / 4) = 2 excludes d1): the key's spill home.
    for _ in range(4):
        r.acquire(1)
    home = next(d for d in _ring_order("solo", NAMES) if d != "d1")
    assert r.route("solo") == home
    assert r.counts[RouteKind.SPILLED] == 1
    h = r.index[home]
    # Now d1 (4) against the home (0): the home, counted as spill_home, not as a spill.
    assert r.route("solo") == home
    assert (r.counts[RouteKind.SPILL_HOME], r.counts[RouteKind.SPILLED]) == (1, 1)
    # The home at 5 against d1's 4: back to the plan's destination (it is below the spill
    # bound: 4 x 4 < 2 x (9 + 1)).
    for _ in range(5):
        r.acquire(h)
    assert r.route("solo") == "d1"
    assert r.counts[RouteKind.PLAN] == 2
    # A key that never spilled has no home: "other" stays on d3 while d3 is busier.
    r.acquire(3, 3)
    assert r.route("other") == "d3"
    # Context slack counts on both sides: the key's last 2048-token prompt went to d1, so d1
    # weighs 4 - 2048 // 512 = 0 against the home's 5 - 0.
    r.work_units("solo", 1, 2048)
    assert r.route("solo") == "d1"
    r.work_units("solo", h, 4096)  # now its context (8 units of slack) is at the home
    assert r.route("solo") == home


def test_spill_homes_spread_over_each_keys_two_ring_candidates() -> None:
    """Two planned keys on d0 whose rings start at the same destination: the first key spilled
    takes it as its home, the second takes its own second candidate, the less used one."""
    names = [f"d{i}" for i in range(8)]
    by_first: dict[str, list[str]] = {}
    for i in range(2000):
        order = _ring_order(f"k{i}", names)
        if order[0] != "d0" and order[1] != "d0":
            by_first.setdefault(order[0], []).append(f"k{i}")
    a, b = next(ks[:2] for ks in by_first.values() if len(ks) >= 2)
    second_b = _ring_order(b, names)[1]
    r = Router(names, rng=random.Random(1), spill_min_inflight=4, spill_home=True)
    r.table = build_table(1, 0, [(a, ["d0"]), (b, ["d0"])], names, names)
    for _ in range(4):  # d0 past both spill bounds; everything else idle
        r.acquire(0)
    first = _ring_order(a, names)[0]
    assert r.route(a) == first  # a's first candidate: no homes anywhere yet
    assert r.route(b) == second_b  # b's first candidate is a's home: its second instead
    assert r.counts[RouteKind.SPILLED] == 2
    # both remembered as homes: with d0 idle again each key goes to the less loaded of its two
    r.release(0, 4)
    r.acquire(r.index[first], 2)
    assert r.route(a) == "d0"
    r.acquire(0, 3)
    assert r.route(b) == second_b
    assert r.counts[RouteKind.SPILL_HOME] == 1


def test_without_spill_home_a_spilled_key_returns_to_its_plan() -> None:
    r = Router(NAMES, rng=random.Random(1), spill_min_inflight=4)
    r.table = build_table(1, 0, [("solo", ["d1"])], NAMES, NAMES)
    for _ in range(4):
        r.acquire(1)
    assert r.route("solo") != "d1"  # spilled
    assert r.route("solo") != "d1"  # still past both bounds: spilled again, never a home
    assert r.counts[RouteKind.SPILL_HOME] == 0
    assert r.counts[RouteKind.SPILLED] == 2


def test_context_home_keeps_a_newly_admitted_conversation_where_its_history_is() -> None:
    r = Router(NAMES, rng=random.Random(1), context_home=True)
    r.install(build_table(1, 0, [("other", ["d0"])], NAMES, NAMES))
    # "conv" is not admitted: the cold path sends it to its ring's first destination (all idle),
    # and its 4096-token prompt is its context there: 4096 // 512 = 8 units of slack.
    cold = r.route("conv")
    assert cold == _ring_order("conv", NAMES)[0]
    c = r.index[cold]
    r.work_units("conv", c, 4096)
    planned = next(d for d in NAMES if d != cold)
    p = r.index[planned]
    r.install(build_table(2, 0, [("other", ["d0"]), ("conv", [planned])], NAMES, NAMES))
    assert r.previous_table is not None
    assert r.previous_table.version == 1
    # Newly admitted: its context home at 7 units less 8 of slack (-1) beats the plan's 0.
    r.acquire(c, 7)
    assert r.route("conv") == cold
    assert r.counts[RouteKind.CONTEXT_HOME] == 1
    # At 8 units (8 - 8 = 0, not below 0) the plan's destination takes it.
    r.acquire(c, 1)
    assert r.route("conv") == planned
    assert r.counts[RouteKind.PLAN] == 1
    # The next plan keeps it: no longer new, so the plan's destination even while the context
    # home would be cheaper.
    r.release(c, 8)
    r.acquire(p, 3)
    r.install(build_table(3, 0, [("other", ["d0"]), ("conv", [planned])], NAMES, NAMES))
    assert r.route("conv") == planned
    assert r.counts[RouteKind.CONTEXT_HOME] == 1


def test_without_context_home_a_newly_admitted_key_follows_its_plan() -> None:
    r = Router(NAMES, rng=random.Random(1))
    r.install(build_table(1, 0, [("other", ["d0"])], NAMES, NAMES))
    cold = r.route("conv")
    r.work_units("conv", r.index[cold], 4096)
    planned = next(d for d in NAMES if d != cold)
    r.install(build_table(2, 0, [("conv", [planned])], NAMES, NAMES))
    assert r.previous_table is None  # no reference kept to the table it replaced
    r.acquire(r.index[planned], 3)
    assert r.route("conv") == planned
    assert r.counts[RouteKind.CONTEXT_HOME] == 0


def _prefix_router(blocks: int = 100) -> Router:
    r = Router(NAMES, rng=random.Random(3), prefix_blocks=blocks)
    r.table = build_table(1, 0, [("solo", ["d1"])], NAMES, NAMES)
    return r


def _not_ring_first(names: list[str], avoid: str) -> str:
    """A key whose cold path, with nothing in flight, does not start at `avoid`."""
    return next(f"c{i}" for i in range(1000) if _ring_order(f"c{i}", names)[0] != avoid)


def test_a_new_cold_key_goes_where_its_prompts_leading_blocks_went() -> None:
    r = _prefix_router()
    r.remember(2, [11, 12, 13, 14])  # a system prompt of four blocks went to d2
    key = _not_ring_first(NAMES, "d2")
    # 2 of 5 leading blocks match at d2 (> a quarter): it follows them, not its ring
    assert r.route_index(key, None, [11, 12, 99, 98, 97]) == 2
    assert r.counts[RouteKind.PREFIX] == 1
    assert r.counts[RouteKind.COLD] == 1  # a prefix route is a cold route too
    r.remember(2, [11, 12, 99, 98, 97])
    # and then stays there like any cold key (its last destination, under the bound, still holds
    # its blocks)
    assert r.route_index(key, None, [11, 12, 99, 98, 97, 96]) == 2
    assert r.counts[RouteKind.PREFIX] == 1


def test_a_short_or_overloaded_match_and_planned_keys_keep_their_rules() -> None:
    r = _prefix_router()
    r.remember(2, [11, 12, 13, 14])
    key = _not_ring_first(NAMES, "d2")
    ring = NAMES.index(_ring_order(key, NAMES)[0])
    # 1 of 4 blocks is exactly a quarter, not more: the ring decides
    assert r.route_index(key, None, [11, 90, 91, 92]) == ring
    other = next(k for k in (f"x{i}" for i in range(1000)) if _ring_order(k, NAMES)[0] != "d2")
    for _ in range(3):  # d2 at the cold bound: ceil(1.25 x 4 / 4) = 2 <= 3 in flight
        r.acquire(2)
    assert r.route_index(other, None, [11, 12, 13]) != 2
    # a planned key follows its plan whatever its blocks say
    assert r.route_index("solo", None, [11, 12, 13, 14]) == 1
    assert r.counts[RouteKind.PREFIX] == 0


def test_only_the_last_prefix_blocks_per_destination_are_remembered() -> None:
    r = _prefix_router(blocks=2)
    r.remember(3, [1, 2])
    r.remember(3, [7, 8])  # d3 remembers two blocks: 1 and 2 are gone
    key = _not_ring_first(NAMES, "d3")
    assert r.route_index(key, None, [1, 2]) != 3
    key2 = next(f"z{i}" for i in range(1000) if _ring_order(f"z{i}", NAMES)[0] != "d3")
    assert r.route_index(key2, None, [7, 8]) == 3


def test_a_down_destination_is_never_chosen_by_prefix() -> None:
    r = _prefix_router()
    r.remember(1, [5, 6, 7])
    r.mark_down("d1")
    assert r.route_index("fresh", None, [5, 6, 7]) != 1


def test_prefix_affinity_off_and_hostile_blocks() -> None:
    off = Router(NAMES, rng=random.Random(3))
    off.remember(2, [11, 12])  # off: a no-op
    key = _not_ring_first(NAMES, "d2")
    assert off.route_index(key, None, [11, 12]) == NAMES.index(_ring_order(key, NAMES)[0])
    on = _prefix_router()
    on.remember(0, ["not", "ints"])  # type: ignore[list-item]  # never raises
    on.remember(0, None)
    with pytest.raises(DispatchError):
        Router(NAMES, prefix_blocks=-1)


def test_a_known_cold_key_whose_blocks_are_gone_is_placed_again() -> None:
    r = _prefix_router(blocks=3)  # each destination remembers its last three blocks
    key = _not_ring_first(NAMES, "d3")
    ring = NAMES.index(_ring_order(key, NAMES)[0])
    r.remember(3, [1, 2, 3])
    assert r.route_index(key, None, [1, 2, 3]) == 3  # new: follows its blocks
    r.remember(3, [1, 2, 3])
    # d3 still got three of its four blocks (more than a quarter): it stays
    assert r.route_index(key, None, [1, 2, 3, 4]) == 3
    r.remember(3, [7, 8, 9])  # other prompts push its blocks out of d3's memory
    # nothing of it left at d3: placed again by the cold path (its ring, nothing in flight)
    assert r.route_index(key, None, [1, 2, 3, 4]) == ring
    assert r.counts[RouteKind.PREFIX] == 1  # the re-placement is a plain cold route
    # without blocks the old rule holds: it stays where it went last
    assert r.route_index(key, None, None) == ring


@pytest.mark.parametrize("count", [1, 2, 3, 30])
def test_ring_top_two_are_the_first_two_distinct_owners_clockwise(count: int) -> None:
    """The O(1) lookup gives what walking the ring point by point gives, from every point
    (including `start == len(points)`, where a hash past the last point wraps to the first)."""
    router = Router([f"d{i}" for i in range(count)])
    owners = router._ring_owners
    n = len(owners)
    assert n == count * RING_VNODES
    for start in range(n + 1):
        first = owners[start % n]
        second = next(
            (owners[j % n] for j in range(start + 1, start + n) if owners[j % n] != first), -1
        )
        assert router._ring_top2(start) == (first, second)


@pytest.mark.parametrize("memory", ["_cold_start", "_context"])
def test_a_full_per_key_memory_starts_over_and_the_old_one_is_freed_a_little_per_insert(
    memory: str,
) -> None:
    """A router remembers up to 65,536 keys per memory (cold keys' ring positions via route(),
    contexts via work_units()). A full memory is replaced by an empty one - routing as after a
    clear() - and the full one is freed 4 entries per later insert instead of all at once on
    one request (which held the GIL for milliseconds): after the insert that replaced it,
    n more inserts leave 65,536 - 4n of its entries, and it is dropped at the first insert after
    it is empty, the 16,385th. The new memory has room for 65,536 entries from the start."""
    r = Router(NAMES, rng=random.Random(0))

    def insert(i: int) -> None:
        if memory == "_cold_start":
            r.route(f"k{i}")
        else:
            r.work_units(f"k{i}", i % len(NAMES), 100)

    full = 1 << 16
    for i in range(full):
        insert(i)
    assert len(getattr(r, memory)) == full
    assert r._retiring == []
    insert(full)  # finds it full: a new memory holds this key, the old one is set aside
    assert len(getattr(r, memory)) == 1
    room = sys.getsizeof(getattr(r, memory))  # made with room for a full memory (CPython)
    assert [len(m) for m in r._retiring] == [full]
    assert "k0" not in getattr(r, memory)  # forgotten, as a clear() would have
    for i in range(full + 1, full + 101):
        insert(i)
    assert [len(m) for m in r._retiring] == [full - 4 * 100]
    for i in range(full + 101, full + 1 + full // 4):
        insert(i)
    assert [len(m) for m in r._retiring] == [0]  # emptied by the 16,384th insert after
    insert(2 * full)
    assert r._retiring == []
    assert len(getattr(r, memory)) == full // 4 + 2
    held = full // 4 + 2
    for i in range(2 * full + 1, 2 * full + 1 + full - held):  # fill it up: it never resizes
        insert(i)
    assert len(getattr(r, memory)) == full
    if sys.implementation.name == "cpython":
        assert sys.getsizeof(getattr(r, memory)) == room


def test_the_routers_per_key_memories_are_invisible_to_the_cyclic_collector() -> None:
    """Cold keys' ring positions and keys' contexts are kept as one int per key: a dict of
    str -> int is never tracked by CPython's collector (tuple values were, and every young pass
    visited the fresh ones), and the entries still say where each key went."""
    r = Router(NAMES, rng=random.Random(0))
    went = {f"conv-{i}": r.route(f"conv-{i}") for i in range(500)}
    for key, name in went.items():
        r.work_units(key, r.index[name], 2048)
    if sys.implementation.name == "cpython":
        assert not gc.is_tracked(r._cold_start)
        assert not gc.is_tracked(r._context)
    # a known key stays where it went while under the bound (nothing is in flight)
    assert all(r.route(key) == name for key, name in went.items())
    # and its context is found there: the next turn of 2048 + 512 tokens weighs 1 + 512 // 512
    assert all(r.work_units(key, r.index[name], 2560) == 2 for key, name in went.items())


def test_more_destinations_than_a_memory_entry_can_name_are_refused() -> None:
    too_many = [f"d{i}" for i in range((1 << 24) // RING_VNODES + 1)]
    with pytest.raises(DispatchError, match="at most 104857 destinations"):
        Router(too_many)


@settings(max_examples=300, deadline=None)
@given(
    st.integers(1, 70),
    st.lists(st.integers(0, 2**64 - 1), min_size=1, max_size=20),
)
def test_ring_start_is_bisect_left_over_the_ring_points(n: int, hashes: list[int]) -> None:
    points, _, _, first, shift = _ring(tuple(f"dest-{i}" for i in range(n)))
    # every point itself, its neighbours and the ends, besides random hashes
    probes = [*hashes, 0, 2**64 - 1, points[0], points[-1], points[n // 2] - 1, points[n // 2] + 1]
    for probe in probes:
        h = min(max(probe, 0), 2**64 - 1)
        assert ring_start(points, first, shift, h) == bisect.bisect_left(points, h)


@settings(max_examples=300, deadline=None)
@given(text=st.text(max_size=80))
def test_ring_hash_is_xxh3_64_of_the_utf8_text(text: str) -> None:
    """The ring must be the same in every gateway, whatever its language: XXH3-64, seed 0, of
    the UTF-8 bytes, read from xxHash's canonical (big-endian) digest."""
    assert ring_hash(text) == int.from_bytes(xxhash.xxh3_64_digest(text.encode()), "big")


def test_ring_hash_known_values() -> None:
    # xxHash's published vector for empty input: XXH3_64bits("") = 0x2D06800538D394C2
    assert ring_hash("") == 0x2D06800538D394C2
    # pinned when the ring moved to XXH3: a change here moves every cold key's home
    assert ring_hash("d0#0") == 7301456086062576969
    assert ring_hash("tenant-1/chat-7") == 8664590463409542797
    assert ring_hash("é/ü") == 9178017358750528662
