"""Routing rules: plan members by in-flight load, P2C for the rest, failure and staleness fallbacks."""

from __future__ import annotations

import random
import threading
from collections import Counter

import pytest

from cacheroute.dispatcher.errors import DispatchError
from cacheroute.dispatcher.routing import RouteKind, Router, build_table

NAMES = ["d0", "d1", "d2", "d3"]


def router(seed: int = 0) -> Router:
    r = Router(NAMES, rng=random.Random(seed))
    r.table = build_table(
        7,
        1000,
        [("hot", ["d2", "d0"]), ("solo", ["d1"]), ("gone", ["d9"])],
        ["d0", "d1", "d2", "d9"],
        NAMES,
    )
    return r


def test_admitted_key_goes_to_least_loaded_member_ties_in_plan_order() -> None:
    r = router()
    assert r.route("hot") == "d2"  # tie: the plan's first choice
    r.acquire(2)
    assert r.route("hot") == "d0"
    r.acquire(0)
    r.acquire(0)
    assert r.route("hot") == "d2"
    r.release(2)
    assert r.route("hot") == "d2"
    assert r.counts[RouteKind.PLAN] == 4


def test_admitted_keys_never_leave_their_replica_set_while_any_member_lives() -> None:
    r = router()
    for _ in range(200):
        d = r.route_index("hot")
        assert r.names[d] in ("d2", "d0")
        r.acquire(d)


def test_cold_keys_use_two_distinct_choices_and_prefer_the_less_loaded() -> None:
    r = router(seed=3)
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


def test_no_plan_and_stale_plan_use_p2c() -> None:
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


def test_overloaded_member_spills_to_p2c_only_past_both_bounds() -> None:
    r = Router(NAMES, rng=random.Random(1), spill_min_inflight=4)  # spill_factor 2 by default
    r.table = build_table(1, 0, [("solo", ["d1"]), ("hot", ["d2", "d0"])], NAMES, NAMES)
    for _ in range(3):
        r.acquire(1)
    # 3 in flight, all on d1: 3 x 4 >= 2 x (3 + 1), but below the floor of 4 -> still planned.
    assert r.route("solo") == "d1"
    r.acquire(1)
    # 4 on d1 (>= floor) and 4 x 4 >= 2 x (4 + 1): overloaded -> P2C among the others' lighter loads
    picks = Counter(r.route("solo") for _ in range(200))
    assert picks["d1"] == 0
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
