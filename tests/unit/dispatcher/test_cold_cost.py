"""`Router.cold_cost`: cold keys placed by missing blocks plus cache churn (hand-derived cases)."""

from __future__ import annotations

import random

import pytest

from cacheroute.dispatcher import Dispatcher, DispatcherConfig
from cacheroute.dispatcher.errors import DispatchError
from cacheroute.dispatcher.prefixes import PrefixIndex
from cacheroute.dispatcher.routing import CHURN_WEIGHT, RouteKind, Router, build_table
from cacheroute.replay.evaluate import EvalConfig
from cacheroute.replay.fleet import FleetConfig

NAMES = ["d0", "d1", "d2", "d3"]


def _router(blocks: int = 100) -> Router:
    """Cold cost on; half-life 0.2 x 4 destinations x `blocks` blocks (80 for 100)."""
    r = Router(NAMES, rng=random.Random(5), prefix_blocks=blocks, cold_cost=True)
    r.table = build_table(1, 0, [("solo", ["d1"])], NAMES, NAMES)
    return r


def test_insert_counts_the_blocks_new_to_a_destination() -> None:
    idx = PrefixIndex(2, capacity_blocks=3)
    assert idx.insert(0, [1, 2]) == 2
    assert idx.insert(0, [1, 2, 3]) == 1  # 1 and 2 are held: only 3 is new
    assert idx.insert(1, [1]) == 1  # per destination: d1 never got block 1
    assert idx.insert(0, [4, 5, 6]) == 3  # three new blocks push 1, 2, 3 out of a 3-block d0
    assert idx.insert(0, [1]) == 1  # so block 1 is new to d0 again


def test_churn_halves_over_its_half_life() -> None:
    r = _router(blocks=10)  # half-life 0.2 x 4 x 10 = 8 blocks
    r.remember(0, [1, 2, 3, 4])
    assert r.churn(0) == pytest.approx(4.0)
    r.remember(1, list(range(10, 18)))  # 8 blocks new to d1: one half-life for d0
    assert r.churn(0) == pytest.approx(2.0)
    assert r.churn(1) == pytest.approx(8.0)
    r.remember(1, list(range(10, 18)))  # all held already: no churn, no time passes
    assert r.churn(0) == pytest.approx(2.0)
    assert r.churn(2) == 0.0


def test_a_new_key_with_no_prefix_home_goes_where_churn_is_least() -> None:
    r = _router()
    r.remember(0, list(range(100, 110)))
    r.remember(1, list(range(200, 205)))
    r.remember(3, list(range(300, 303)))
    # nothing of its prompt is anywhere: every destination misses all 4 blocks, d2 churned least
    assert r.route_index("fresh-one", None, [1, 2, 3, 4]) == 2  # its ring says d3
    assert r.counts[RouteKind.COST] == 1
    assert r.counts[RouteKind.COLD] == 1
    assert r.counts[RouteKind.PREFIX] == 0


def test_missing_blocks_outweigh_churn_until_churn_grows() -> None:
    r = _router()  # half-life 80 blocks
    r.remember(3, list(range(100, 120)))  # churn(d3) = 20 at clock 20
    r.remember(3, [1])  # block 1 new to d3: its churn as of now (20, stamped now) + 1
    churn3 = 21.0
    assert r.churn(3) == pytest.approx(churn3)
    prompt = [1, 50, 51, 52, 53, 54, 55, 56]
    # d3 holds 1 of its 8 blocks: not more than a quarter, so no prefix home; by cost d3 misses
    # 7 blocks + 0.03 x 21 = 7.63, every other destination misses 8 with no churn
    assert 7 + CHURN_WEIGHT * churn3 < 8
    assert r.route_index("a", None, prompt) == 3
    # 40 more blocks through d3 (d3 still holds block 1): churn 21 + 40 = 61
    r.remember(3, list(range(400, 440)))
    assert r.churn(3) == pytest.approx(61.0)
    assert 7 + CHURN_WEIGHT * r.churn(3) > 8
    # now d0, d1 and d2 tie at 8 missing blocks and no churn: the first live one
    assert r.route_index("b", None, prompt) == 0


def test_a_destination_past_the_cold_bound_is_skipped() -> None:
    r = _router()
    r.remember(0, list(range(100, 110)))
    r.remember(1, list(range(200, 205)))
    r.acquire(2, 10)  # d2 churned least but holds 10 of 10 units: bound ceil(1.25 x 11 / 4) = 4
    r.remember(3, list(range(300, 303)))
    assert r.route_index("new", None, [1, 2]) == 3  # the next least churned under the bound


def test_a_known_key_whose_context_is_gone_is_placed_by_cost() -> None:
    r = _router(blocks=3)  # each destination remembers its last three blocks; half-life 2.4
    r.remember(3, [1, 2, 3])
    assert r.route_index("k", None, [1, 2, 3]) == 3  # new: follows its blocks (a prefix home)
    r.remember(3, [1, 2, 3])
    r.remember(3, [7, 8, 9])  # pushes its blocks out of d3: d3 churned 6 blocks
    r.remember(0, [20])  # d0 churned 1 block, d1 and d2 none
    # staying at d3 saves nothing; by cost: 4 missing blocks everywhere, least churn at d1/d2
    assert r.route_index("k", None, [1, 2, 3, 4]) == 1
    assert r.counts[RouteKind.COST] == 1
    r.remember(1, [1, 2, 3, 4])
    assert r.route_index("k", None, [1, 2, 3, 4, 5]) == 1  # then it stays where it went


def test_cold_cost_needs_the_prefix_index_and_the_dispatcher_passes_it_on() -> None:
    with pytest.raises(DispatchError, match="prefix_blocks"):
        Router(NAMES, cold_cost=True)
    d = Dispatcher(NAMES, DispatcherConfig(prefix_blocks=8, cold_cost=True))
    try:
        assert d.router.cold_cost
    finally:
        d.close()


@pytest.mark.parametrize(
    ("gateways", "cold_cost", "prefix_affinity", "expected"),
    [
        (1, None, None, True),  # auto: on at a sole gateway
        (4, None, None, False),  # auto: off behind a balancer
        (4, True, True, True),  # as set
        (1, True, False, False),  # never without the prefix index it reads
    ],
)
def test_the_evaluator_resolves_cold_cost_like_the_other_sole_gateway_rules(
    gateways: int, cold_cost: bool | None, prefix_affinity: bool | None, expected: bool
) -> None:
    cfg = EvalConfig(
        cold_cost=cold_cost,
        prefix_affinity=prefix_affinity,
        fleet=FleetConfig(gateways=gateways),
    )
    assert cfg.resolved_cold_cost is expected


def test_with_cold_cost_a_first_spill_home_is_the_least_churned_destination() -> None:
    r = Router(
        NAMES,
        rng=random.Random(1),
        spill_min_inflight=4,
        spill_home=True,
        prefix_blocks=100,
        cold_cost=True,
    )
    r.table = build_table(1, 0, [("solo", ["d1"])], NAMES, NAMES)
    # churn: d0 6, d1 0 (its planned key hits its cache), d2 4, d3 2
    r.remember(0, list(range(100, 106)))
    r.remember(2, list(range(200, 204)))
    r.remember(3, [300, 301])
    for _ in range(4):  # 4 on d1 of 4 in flight: past both spill bounds (as in test_routing)
        r.acquire(1)
    # d1 churned least but is past the cold bound ceil(1.25 x 5 / 4) = 2: the next least, d3
    # (without cold_cost: d2, the less used of its ring candidates d2 and d0)
    assert r.route("solo") == "d3"
    assert r.counts[RouteKind.SPILLED] == 1
    # a sole gateway routes a single-replica key by `Router._conversation`, not the spill-home
    # rule: the spilled turn left the conversation's context on d3, which is below the cold
    # bound, so the next turn stays there (a conversation kept where its context is, not a spill)
    assert r.route("solo") == "d3"
    assert r.counts[RouteKind.SPILLED] == 1
    assert r.counts[RouteKind.SPILL_HOME] == 0
