"""Peer loads (`Router.set_peer_loads`): other gateways' in-flight load counted on top of one's own."""

from __future__ import annotations

import random

import pytest

from cacheroute.dispatcher.errors import DispatchError
from cacheroute.dispatcher.routing import Router, build_table

NAMES = ["a", "b", "c"]


def test_peer_loads_add_to_the_counters_and_replace_the_previous_report() -> None:
    r = Router(NAMES)
    r.acquire(0, 2)  # this gateway: 2 units, 1 request at a
    r.set_peer_loads([1, 5, 0], 3)
    assert r.inflight == [3, 5, 0]
    assert (r.total_inflight, r.total_requests) == (8, 4)
    assert r.own_loads() == ([2, 0, 0], 1)
    r.set_peer_loads([0, 1, 0], 1)  # a newer report replaces the last one, it does not add
    assert r.inflight == [2, 1, 0]
    assert (r.total_inflight, r.total_requests) == (3, 2)
    r.release(0, 2)
    assert r.inflight == [0, 1, 0]
    assert r.own_loads() == ([0, 0, 0], 0)
    r.set_peer_loads([0, 0, 0], 0)  # the peers drained: back to nothing at all
    assert (r.inflight, r.total_inflight, r.total_requests) == ([0, 0, 0], 0, 0)


def test_bad_peer_figures_count_as_zero_and_a_wrong_length_is_refused() -> None:
    r = Router(NAMES)
    r.set_peer_loads([-4, "x", 2], -1)
    assert r.inflight == [0, 0, 2]
    assert (r.total_inflight, r.total_requests) == (2, 0)
    with pytest.raises(DispatchError, match="2 destinations"):
        r.set_peer_loads([1, 1], 0)
    assert r.inflight == [0, 0, 2]  # unchanged


def test_a_replicated_key_avoids_the_member_its_peers_keep_busy() -> None:
    """Equal own loads: without peers the tie is broken at random; with peers saying `a` holds
    four requests, every request of the key goes to `b`, the other member."""
    table = build_table(1, 0, [("hot", ["a", "b"])], NAMES, NAMES)
    r = Router(NAMES, rng=random.Random(0))
    r.install(table)
    alone = {r.route_index("hot") for _ in range(40)}
    assert alone == {0, 1}
    r.set_peer_loads([4, 0, 0], 4)
    assert {r.route_index("hot") for _ in range(40)} == {1}


def test_the_cold_bound_counts_the_peers() -> None:
    """A cold key stays where it went while that destination is under ceil(1.25 x (all in
    flight + 1) / live): 1 with nothing in flight, and with peers holding 6 units at its
    destination and none elsewhere, ceil(1.25 x 7 / 3) = 3, so 6 is over it and the key moves."""
    r = Router(NAMES, rng=random.Random(0))
    first = r.route_index("cold-key")
    assert r.route_index("cold-key") == first
    peers = [0, 0, 0]
    peers[first] = 6
    r.set_peer_loads(peers, 6)
    assert r.route_index("cold-key") != first
