"""A planned key's replicas share its conversations (`session`), not its requests one by one.

Keys coarser than a conversation (a tenant header, a system-prompt hash) put many conversations on
one key with k_b replicas; a request that names its conversation goes to the first member of T(b),
in the session's rendezvous order, below a CHWBL bound, so every turn of one conversation meets its
cached history while the key's conversations still spread over T(b).
"""

from __future__ import annotations

import random
from collections import Counter

import pytest

from cacheroute.dispatcher.routing import RouteKind, Router, build_table

NAMES = ["d0", "d1", "d2", "d3", "d4"]
MEMBERS = ["d1", "d2", "d4"]


def gateway(seed: int) -> Router:
    r = Router(NAMES, rng=random.Random(seed))
    r.table = build_table(3, 0, [("tenant", MEMBERS)], NAMES, NAMES)
    return r


def test_a_session_goes_to_the_same_member_on_every_gateway_and_every_turn() -> None:
    gateways = [gateway(seed) for seed in range(8)]  # independent RNGs, no shared state
    for s in range(200):
        session = f"conv-{s}"
        picks = {g.route("tenant", session) for g in gateways for _ in range(3)}
        assert len(picks) == 1, session
        assert picks <= set(MEMBERS)


def test_sessions_of_one_key_spread_over_its_replicas() -> None:
    r = gateway(0)
    picks = Counter(r.route("tenant", f"conv-{s}") for s in range(3000))
    assert set(picks) == set(MEMBERS)
    for name in MEMBERS:  # rendezvous hashing: each member is first for ~1/3 of the sessions
        assert picks[name] == pytest.approx(1000, rel=0.1)
    assert r.counts[RouteKind.PLAN] == 3000


def _home(session: str) -> int:
    """Where `session` goes while nothing is in flight."""
    return gateway(0).route_index("tenant", session)


def test_a_member_at_the_bound_passes_the_session_to_the_next() -> None:
    # bound = ceil(1.25 x (units in flight on T(b) + 1) / 3 live members); the home takes the
    # session only below it. Hand-derived: 10 units -> 5, 4 -> 3, 1 -> 1, 0 -> 1.
    r = gateway(0)
    home = _home("conv-7")
    for held in (10, 4, 1):
        r.acquire(home, held)
        d = r.route_index("tenant", "conv-7")
        assert d != home, held
        assert r.names[d] in MEMBERS
        r.release(home, held)
    assert r.route_index("tenant", "conv-7") == home  # idle again: back home


def test_the_sessions_cached_history_buys_it_slack_at_its_home() -> None:
    r = gateway(0)
    home = _home("conv-7")
    units = r.work_units("tenant", home, 20 * 512, "conv-7")  # turn 1: 20 blocks, none cached
    assert units == 21
    r.acquire(home, 10)
    # 10 in flight is past the bound of 5, but recomputing 20 blocks elsewhere costs 20 units
    assert r.route_index("tenant", "conv-7") == home
    # the next turn at home finds turn 1's prompt cached: only its new tokens weigh
    assert r.work_units("tenant", home, 22 * 512, "conv-7") == 3
    # another conversation of the same key has no context there: full weight, and no slack
    assert r.work_units("tenant", home, 22 * 512, "conv-8") == 23


def test_without_a_session_the_key_is_balanced_request_by_request() -> None:
    r = gateway(5)
    picks = Counter(r.route("tenant") for _ in range(3000))
    assert set(picks) == set(MEMBERS)  # uniform ties among idle members, as before
    same = Counter(r.route("tenant", "tenant") for _ in range(3000))  # session == key: the same
    assert set(same) == set(MEMBERS)


def test_a_down_member_hands_its_sessions_to_the_others_only() -> None:
    before = {s: _home(f"conv-{s}") for s in range(300)}
    r = gateway(0)
    lost = r.index["d2"]
    r.mark_down("d2")
    for s, home in before.items():
        d = r.route_index("tenant", f"conv-{s}")
        assert d != lost
        if home != lost:
            assert d == home  # the others' sessions do not move


def sole_gateway() -> Router:
    r = Router(NAMES, rng=random.Random(0), prefix_blocks=8, cold_cost=True)
    r.table = build_table(3, 0, [("tenant", MEMBERS)], NAMES, NAMES)
    return r


def test_a_sole_gateway_starts_a_conversation_on_the_least_loaded_member() -> None:
    # Hand-derived: conv-7's rendezvous home and one other member hold 1 unit each, the third
    # none; bound ceil(1.25 x (2 + 1) / 3) = 2. A gateway among several keeps the rendezvous
    # home (1 < 2); a sole gateway (`cold_cost`), with no context for conv-7, starts it on the
    # idle member.
    home = _home("conv-7")
    others = [NAMES.index(m) for m in MEMBERS if NAMES.index(m) != home]
    for shared, expected in ((gateway(0), home), (sole_gateway(), others[1])):
        shared.acquire(home, 1)
        shared.acquire(others[0], 1)
        assert shared.route_index("tenant", "conv-7") == expected


def test_a_sole_gateway_keeps_a_conversation_where_its_context_is() -> None:
    # A sole gateway's bound is the cold path's, over all 5 live destinations:
    # ceil(1.25 x (units in flight + 1) / 5).
    r = sole_gateway()
    home = _home("conv-7")
    other = next(NAMES.index(m) for m in MEMBERS if NAMES.index(m) != home)
    assert r.work_units("tenant", other, 20 * 512, "conv-7") == 21  # turn 1 went to `other`
    r.acquire(other, 4)  # bound ceil(1.25 x 5 / 5) = 2
    # past the bound, but 20 cached blocks buy 20 units of slack (2 + 20 > 4) and no prompt
    # blocks were remembered, so no destination has churned: it stays
    assert r.route_index("tenant", "conv-7") == other
    r.acquire(other, 30)  # 34 in flight: bound ceil(1.25 x 35 / 5) = 9, + 20 = 29 <= 34: it
    # moves, to the least loaded member (no prompt blocks to place it by)
    d = r.route_index("tenant", "conv-7")
    assert d != other
    assert r.names[d] in MEMBERS


def test_a_sole_gateway_keeps_turns_together_without_prompt_tokens() -> None:
    # No `work_units` call (a library user who passes no prompt tokens): the member a turn went
    # to holds the conversation's context, so later turns follow it while it is below the bound
    # (ceil(1.25 x (units + 1) / 5)) instead of taking whichever member is least loaded.
    r = sole_gateway()
    first = r.route_index("tenant", "conv-9")
    r.acquire(first, 1)  # bound ceil(1.25 x 2 / 5) = 1: 1 < 1 is false, no slack: it moves
    moved = r.route_index("tenant", "conv-9")
    assert moved != first
    assert r.names[moved] in MEMBERS
    r.release(first, 1)
    # idle everywhere: least loaded would pick any of three; it stays where it went, every time
    assert {r.route_index("tenant", "conv-9") for _ in range(20)} == {moved}


def test_a_sole_gateways_spilled_turn_moves_the_conversations_context() -> None:
    # Hand-derived, no prompt tokens (no `work_units`): "solo" is planned on d1 alone. 40
    # one-unit requests on d1: cold bound ceil(1.25 x 41 / 5) = 11 <= 40 and no slack, so the
    # conversation leaves its context; d1 is T(b)'s only member, and the spill test holds
    # (40 x 5 >= 2 x 41; 40 x 40 >= 4 x 40): the turn spills to the cold path, off d1. Once d1
    # is idle again the next turn follows the context to where the spilled turn went, not back
    # to d1, where the conversation's history is not.
    r = Router(NAMES, rng=random.Random(0), prefix_blocks=8, cold_cost=True)
    r.table = build_table(3, 0, [("solo", ["d1"])], NAMES, NAMES)
    assert r.route_index("solo", "conv-1") == 1
    for _ in range(40):
        r.acquire(1, 1)
    spilled = r.route_index("solo", "conv-1")
    assert spilled != 1
    assert r.counts[RouteKind.SPILLED] == 1
    for _ in range(40):
        r.release(1, 1)
    assert r.route_index("solo", "conv-1") == spilled


def test_a_sole_gateway_starts_a_conversation_where_its_prompt_costs_least() -> None:
    r = sole_gateway()
    r.remember(2, [1, 2])  # the tenant's system prompt went to d2 (2 blocks of churn there)
    # conv-7's prompt [1, 2, 50, 51]: d2 misses 2 blocks (cost 2 + 0.03 x 2), the others all 4
    assert r.route_index("tenant", "conv-7", [1, 2, 50, 51]) == 2
    r.acquire(2, 2)  # bound ceil(1.25 x 3 / 5) = 1: d2 is past it
    # conv-8: every other destination misses all 4 blocks and none has churned: the first live
    # one, d0, although T(b) is d1, d2, d4 (a sole gateway need agree with no one on T(b))
    assert r.route_index("tenant", "conv-8", [1, 2, 60, 61]) == 0
    # a gateway among several keeps conv-8 on T(b): its rendezvous order, under T(b)'s bound
    shared = gateway(0)
    shared.acquire(2, 2)
    assert shared.names[shared.route_index("tenant", "conv-8", [1, 2, 60, 61])] in MEMBERS


@pytest.mark.parametrize(("busy", "stays"), [(1, False), (3, True)])
def test_a_conversation_gives_up_its_slack_where_churn_is_far_above_the_mean(
    busy: int, stays: bool
) -> None:
    # Churn halves every 0.2 x 5 destinations x 8 blocks = 8 blocks the cluster takes in.
    r = sole_gateway()
    r.remember(1, [1, 2])  # the tenant's prompt at d1: churn 2 (clock 2)
    turn1 = [1, 2, 3, 4]
    assert r.route_index("tenant", "conv-7", turn1) == 1  # misses 2 there, 4 elsewhere
    r.remember(1, turn1)  # 2 new blocks: churn(d1) = 2 + 2 = 4 (clock 4)
    assert r.work_units("tenant", 1, 20 * 512, "conv-7") == 21  # its context: 20 units of slack
    r.remember(busy, list(range(100, 140)))  # 40 blocks of other conversations (clock 44)
    r.acquire(1, 10)  # bound ceil(1.25 x 11 / 5) = 3 <= 10 < 3 + 20: only its slack keeps it
    d = r.route_index("tenant", "conv-7", [*turn1, 5])
    # busy d1: churn 4 + 40 = 44, the mean 44 / 5; (44 - its own 5 blocks) x 5 = 195 > 1.5 x 44:
    # it moves, to the cheapest destination under the bound: all miss 5 blocks, none churned, d0.
    # busy d3: churn(d1) = 4 x 0.5^(40 / 8) = 0.125, below its own 5 blocks: it stays.
    assert d == (1 if stays else 0)


def test_a_conversations_own_blocks_do_not_count_against_it() -> None:
    # Alone on the cluster, a long conversation is the only churn there is; were its own blocks
    # counted it would leave every replica it went to on its next turn past the bound.
    r = sole_gateway()
    prompt = list(range(1, 41))  # 40 blocks, none anywhere: cost 40 everywhere, d0 first
    d = r.route_index("tenant", "conv-7", prompt)
    assert d == 0
    r.remember(d, prompt)  # churn(d0) = 40, all of it its own
    assert r.work_units("tenant", d, 40 * 512, "conv-7") == 41  # 40 units of slack there
    r.acquire(d, 5)  # bound ceil(1.25 x 6 / 5) = 2 <= 5 < 2 + 40
    # (40 - its 41 blocks) x 5 < 0 <= 1.5 x 40: it stays
    assert r.route_index("tenant", "conv-7", [*prompt, 41]) == d


def test_a_sole_gateway_places_the_conversations_of_a_single_replica_key_too() -> None:
    def router(sole: bool) -> Router:
        r = Router(NAMES, rng=random.Random(0), prefix_blocks=8 if sole else 0, cold_cost=sole)
        r.table = build_table(3, 0, [("solo", ["d3"])], NAMES, NAMES)
        r.acquire(3, 1)  # bound ceil(1.25 x 2 / 5) = 1: d3 is at it
        return r

    # among several gateways every conversation of the key goes to its one replica (1 in flight
    # is below the spill floor of 4)
    assert router(False).route_index("solo", "c-1", [7, 8]) == 3
    # a sole gateway places a new one like a cold key: d3 is at the bound; every other
    # destination misses both blocks, none has churned: d0
    assert router(True).route_index("solo", "c-1", [7, 8]) == 0
    # and so the key's own requests when they name no conversation (the key is the
    # conversation): then they stay where the first went while it is below the bound
    r = router(True)
    assert r.route_index("solo", None, [7, 8]) == 0
    r.release(3, 1)  # idle: bound ceil(1.25 x 1 / 5) = 1, d0 at 0 is below it
    assert [r.route_index("solo", None, [7, 8, 9]) for _ in range(3)] == [0, 0, 0]
    r.mark_down("d3")  # its planned replica down: the cold path, counted as `plan_down`
    before = r.counts[RouteKind.PLAN_DOWN]
    r.route_index("solo", None, [7, 8])
    assert r.counts[RouteKind.PLAN_DOWN] == before + 1
