"""Peer load reports (`cacheroute.dispatcher.peers`): wire form, validation, expiry, sums."""

from __future__ import annotations

import pytest

from cacheroute.dispatcher.dispatcher import Dispatcher
from cacheroute.dispatcher.errors import DispatchError
from cacheroute.dispatcher.peers import (
    MAX_REPORT_DESTINATIONS,
    LoadReport,
    PeerLoads,
    parse_load_report,
)

NAMES = ["d0", "d1", "d2"]


def test_a_report_survives_its_wire_form() -> None:
    report = LoadReport("gw-1", {"d0": 3, "d2": 0}, 2)
    assert parse_load_report(report.to_json()) == report


@pytest.mark.parametrize(
    ("obj", "says"),
    [
        ([1, 2], "JSON object"),
        ({"units": {}, "requests": 0}, "gateway"),
        ({"gateway": "", "units": {}, "requests": 0}, "gateway"),
        ({"gateway": "g", "units": [1], "requests": 0}, "`units` must be an object"),
        ({"gateway": "g", "units": {"d0": -1}, "requests": 0}, "units of 'd0'"),
        ({"gateway": "g", "units": {"d0": 1.5}, "requests": 0}, "units of 'd0'"),
        ({"gateway": "g", "units": {"d0": True}, "requests": 0}, "units of 'd0'"),
        ({"gateway": "g", "units": {"d0": 1 << 41}, "requests": 0}, "units of 'd0'"),
        ({"gateway": "g", "units": {}, "requests": "3"}, "`requests`"),
        ({"gateway": "g", "units": {}}, "`requests`"),
        (
            {
                "gateway": "g",
                "units": {f"d{i}": 0 for i in range(MAX_REPORT_DESTINATIONS + 1)},
                "requests": 0,
            },
            "destinations",
        ),
    ],
)
def test_malformed_reports_are_refused_saying_why(obj: object, says: str) -> None:
    with pytest.raises(DispatchError, match=says):
        parse_load_report(obj)


def test_live_peers_are_summed_by_destination_name_and_own_reports_ignored() -> None:
    peers = PeerLoads(NAMES, "me", expiry_s=3.0)
    assert peers.update(LoadReport("a", {"d0": 2, "d1": 1}, 2), now=10.0)
    assert peers.update(LoadReport("b", {"d1": 4, "elsewhere": 9}, 3), now=10.5)
    assert not peers.update(LoadReport("me", {"d0": 100}, 100), now=10.5)
    assert peers.totals(now=11.0) == ([2, 5, 0], 5)  # "elsewhere" is not one of ours
    # a newer report of `a` replaces its older one
    peers.update(LoadReport("a", {"d2": 1}, 1), now=11.0)
    assert peers.totals(now=11.0) == ([0, 4, 1], 4)


def test_a_silent_peer_is_dropped_after_the_expiry_by_the_receivers_clock() -> None:
    peers = PeerLoads(NAMES, "me", expiry_s=3.0)
    peers.update(LoadReport("a", {"d0": 2}, 1), now=10.0)
    peers.update(LoadReport("b", {"d0": 5}, 2), now=12.0)
    assert peers.live(now=13.0) == ["a", "b"]
    assert peers.totals(now=13.5) == ([5, 0, 0], 2)  # a: last heard 3.5 s ago
    assert peers.live(now=13.5) == ["b"]
    assert peers.totals(now=20.0) == ([0, 0, 0], 0)


def test_expiry_must_be_positive() -> None:
    with pytest.raises(DispatchError, match="expiry_s"):
        PeerLoads(NAMES, "me", expiry_s=0.0)


def test_a_dispatcher_reports_its_own_load_and_routes_on_its_peers_too() -> None:
    d = Dispatcher(NAMES)
    held = d.request("k", units=4)
    i = d.router.names.index(held.destination)
    peers = PeerLoads(NAMES, "me", expiry_s=3.0)
    peers.update(LoadReport("other", {"d0": 1, "d1": 1, "d2": 1}, 3), now=1.0)
    d.apply_peer_loads(peers, now=1.0)
    want = [1, 1, 1]
    want[i] += 4
    assert d.router.inflight == want
    report = d.load_report("me")  # its own only, never what it counts of its peers
    assert report.units == {n: (4 if n == held.destination else 0) for n in NAMES}
    assert report.requests == 1
    held.release()
    d.apply_peer_loads(peers, now=10.0)  # the peer went silent: nothing of it is left
    assert d.router.inflight == [0, 0, 0]
    assert d.load_report("me") == LoadReport("me", dict.fromkeys(NAMES, 0), 0)
