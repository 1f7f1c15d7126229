"""Work units, prefill settling and context slack: hand-derived cases of `Router`.

Setting: 4 destinations, CHWBL's c = 1.25, 512 prompt tokens per unit. The cold bound with L units
in flight is ceil(1.25 * (L + 1) / 4); the spill rule fires when load * 4 >= 2 * (L + 1) and
load * requests >= 4 * L.
"""

from __future__ import annotations

import random

from cacheroute.dispatcher.dispatcher import Dispatcher, DispatcherConfig
from cacheroute.dispatcher.routing import RouteKind, Router, build_table

NAMES = ["a", "b", "c", "d"]


def _router(**kw: object) -> Router:
    return Router(NAMES, rng=random.Random(7), **kw)  # type: ignore[arg-type]


def test_work_units_charge_only_what_the_cache_does_not_hold() -> None:
    r = _router()
    assert r.work_units("t/1", 0, 4096) == 1 + 4096 // 512  # first turn: all of it (9)
    assert r.work_units("t/1", 0, 5000) == 1 + (5000 - 4096) // 512  # next turn, same place: 2
    assert r.work_units("t/1", 1, 6000) == 1 + 6000 // 512  # elsewhere: nothing cached (12)
    assert r.work_units("t/1", 1, 100) == 1  # shorter than what is cached there: decode only
    assert r.work_units("t/2", 1, 511) == 1


def test_settle_keeps_the_request_in_flight_with_its_last_unit() -> None:
    r = _router()
    r.acquire(2, 9)
    r.acquire(3, 1)
    r.settle(2, 8)
    assert (r.inflight, r.total_inflight, r.total_requests) == ([0, 0, 1, 1], 2, 2)
    r.release(2, 1)
    r.release(3, 1)
    assert (r.inflight, r.total_inflight, r.total_requests) == ([0, 0, 0, 0], 0, 0)


def _cold_key_at(r: Router, key: str, prompt: int) -> int:
    d = r.route_index(key)  # no plan: the cold path places the key and remembers it
    r.work_units(key, d, prompt)
    return d


def test_a_cold_key_stays_on_its_cache_while_the_excess_is_below_its_recompute() -> None:
    # 10 units at the key's destination, 0 elsewhere: bound ceil(1.25 * 11 / 4) = 4, and a
    # 4096-token context is worth 8 units: 10 < 4 + 8, so it stays
    r = _router()
    d = _cold_key_at(r, "t/long", 4096)
    r.acquire(d, 10)
    assert r.route_index("t/long") == d
    # the same key with a 2048-token context (4 units) leaves: 10 >= 4 + 4
    r2 = _router()
    d2 = _cold_key_at(r2, "t/long", 2048)
    r2.acquire(d2, 10)
    assert r2.route_index("t/long") != d2
    # without context slack the plain bound applies: 10 >= 4, it leaves
    r3 = _router(context_slack=False)
    d3 = _cold_key_at(r3, "t/long", 4096)
    r3.acquire(d3, 10)
    assert r3.route_index("t/long") != d3


def _planned(**kw: object) -> Router:
    r = _router(**kw)
    r.table = build_table(1, 0, [("t/hot", ["a"])], NAMES, NAMES)
    for _ in range(5):  # 5 requests of 2 units at a: 10 * 4 >= 2 * 11 and 10 * 5 >= 4 * 10
        r.acquire(0, 2)
    return r


def test_a_planned_key_spills_unless_its_context_is_worth_the_wait() -> None:
    r = _planned()
    assert r.route_index("t/hot") != 0
    assert r.counts[RouteKind.SPILLED] == 1
    # with a 4096-token context at a (8 units) its load counts as 10 - 8 = 2: 8 < 22, no spill
    r2 = _planned()
    r2.work_units("t/hot", 0, 4096)
    assert r2.route_index("t/hot") == 0
    assert r2.counts[RouteKind.PLAN] == 1
    # a context at another destination buys nothing at a
    r3 = _planned()
    r3.work_units("t/hot", 1, 4096)
    assert r3.route_index("t/hot") != 0


def test_dispatcher_request_weighs_uncached_tokens_until_the_first_token() -> None:
    disp = Dispatcher(NAMES, DispatcherConfig(), rng=random.Random(1))
    held = disp.request("t/9", prompt_tokens=3000)  # 1 + 3000 // 512 = 6 units
    i = held.index
    assert disp.router.inflight[i] == 6
    held.first_token()
    assert disp.router.inflight[i] == 1
    held.first_token()  # once only
    assert disp.router.inflight[i] == 1
    held.release()
    assert disp.router.inflight == [0, 0, 0, 0]
    assert disp.router.total_requests == 0
    # the next turn on the same destination weighs its new tokens only: 1 + 1000 // 512 = 2
    with disp.request("t/9", prompt_tokens=4000) as name:
        assert name == NAMES[i]
        assert disp.router.inflight[i] == 2
    assert disp.router.inflight == [0, 0, 0, 0]


def test_a_one_unit_request_shares_its_object_and_first_token_changes_nothing() -> None:
    disp = Dispatcher(NAMES, DispatcherConfig(), rng=random.Random(1))
    a = disp.request("k", prompt_tokens=10)
    a.first_token()
    assert a.units == 1
    a.release()
    b = disp.request("k", prompt_tokens=10)  # same key, nothing in flight: same destination
    assert a is b  # the shared per-destination object of the common path
    b.release()
    assert disp.router.inflight == [0, 0, 0, 0]


def test_with_cache_tokens_a_context_is_cached_only_while_it_still_fits() -> None:
    """An LRU cache of 1,000 tokens at destination a, 100 tokens a unit. Hand-derived:

    t/1 sends 600 tokens (all inserted: 600). t/2 sends 300 (inserted: 900). t/1's next turn of
    700: 300 tokens came after its 600, 1,000 - 300 = 700 >= 600 still fit, so 600 are cached
    and 100 inserted (1,000): 1 + 100 // 100 = 2 units. t/3 sends 500 (1,500). t/1 again with
    800: 500 came after its 700, only 1,000 - 500 = 500 of them are left: 1 + 300 // 100 = 4
    units, and its slack there is 500 // 100 = 5. Without cache_tokens the same turn finds all
    700 cached: 2 units, slack 7.
    """
    aware = _router(unit_tokens=100, cache_tokens=1000)
    plain = _router(unit_tokens=100)
    for r in (aware, plain):
        assert r.work_units("t/1", 0, 600) == 7
        assert r.work_units("t/2", 0, 300) == 4
        assert r.work_units("t/1", 0, 700) == 2
        assert r.work_units("t/3", 0, 500) == 6
    assert aware._slack("t/1", 0) == 5
    assert plain._slack("t/1", 0) == 7
    assert aware.work_units("t/1", 0, 800) == 4
    assert plain.work_units("t/1", 0, 800) == 2
    # once more than the whole cache came after it, nothing of it is left
    fresh = _router(unit_tokens=100, cache_tokens=1000)
    fresh.work_units("t/1", 0, 600)
    fresh.work_units("t/2", 0, 1200)
    assert fresh.work_units("t/1", 0, 700) == 8
    # another destination's traffic does not push it out
    other = _router(unit_tokens=100, cache_tokens=1000)
    other.work_units("t/1", 0, 600)
    other.work_units("t/2", 1, 5000)
    assert other.work_units("t/1", 0, 700) == 2


def test_cache_tokens_must_be_positive() -> None:
    import pytest  # noqa: PLC0415

    from cacheroute.dispatcher.errors import DispatchError  # noqa: PLC0415

    with pytest.raises(DispatchError, match="cache_tokens"):
        _router(cache_tokens=0)
    d = Dispatcher(NAMES, DispatcherConfig(cache_tokens=4096))
    assert d.router.cache_tokens == 4096
