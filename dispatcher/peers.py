"""Peer loads: what the other gateways hold in flight, so each one routes on the cluster's load.

Behind an L4 balancer of G gateways each one sends 1/G of the traffic, so its own in-flight
counts hold 1/G of every replica's queue: a replica that fifteen other gateways are filling
looks idle to the sixteenth. Gateways therefore report their own in-flight load per destination
(`LoadReport`, from `Router.own_loads`) every few hundred milliseconds, and each keeps the
latest report of every peer (`PeerLoads`) and counts their sum on top of its own
(`Router.set_peer_loads`). Measured in the replay (`cacheroute evaluate --peer-loads-s 0.25`,
`--quick --seeds 3`): on the Mooncake arXiv trace at 16 gateways, SLO capacity 38.1 -> 47.9
req/s; reports a second old herded spills on whale (411 -> 400), a quarter second old did not
(418).

This module is the pure part: the report's wire form (a JSON object) with its validation, and
the table of peers with expiry. The gateway polls its peers over HTTP (`GET /peer/loads`,
`cacheroute.gateway.peers`).

A peer that stops reporting (crashed, partitioned) is dropped after `expiry_s` of silence by
this gateway's monotonic clock, never by the time the peer wrote into its report: one skewed
clock must not keep a dead peer's load alive or drop a live one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cacheroute.dispatcher.errors import DispatchError

__all__ = ["MAX_REPORT_DESTINATIONS", "LoadReport", "PeerLoads", "parse_load_report"]

MAX_REPORT_DESTINATIONS = 4096
"""A report naming more destinations than this is refused (a hostile or corrupt peer)."""

_MAX_UNITS = 1 << 40
"""Larger per-destination figures are refused: no gateway holds that much in flight."""


@dataclass(frozen=True, slots=True)
class LoadReport:
    """One gateway's own in-flight load: units per destination name, and requests."""

    gateway: str
    units: Mapping[str, int]
    requests: int

    def to_json(self) -> dict[str, Any]:
        """The wire form: {"gateway": id, "units": {destination: units}, "requests": n}."""
        return {"gateway": self.gateway, "units": dict(self.units), "requests": self.requests}


def parse_load_report(obj: object) -> LoadReport:
    """A report from its wire form; DispatchError saying what is wrong with a malformed one."""
    if not isinstance(obj, dict):
        raise DispatchError(f"a load report is a JSON object, got {type(obj).__name__}")
    gateway = obj.get("gateway")
    if not isinstance(gateway, str) or not gateway:
        raise DispatchError("a load report needs a non-empty string `gateway`")
    units = obj.get("units")
    if not isinstance(units, dict):
        raise DispatchError(f"load report of {gateway!r}: `units` must be an object")
    if len(units) > MAX_REPORT_DESTINATIONS:
        raise DispatchError(
            f"load report of {gateway!r} names {len(units)} destinations "
            f"(at most {MAX_REPORT_DESTINATIONS})"
        )
    clean: dict[str, int] = {}
    for name, value in units.items():
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= _MAX_UNITS:
            raise DispatchError(
                f"load report of {gateway!r}: units of {name!r} must be an integer in "
                f"[0, {_MAX_UNITS}], got {value!r}"
            )
        clean[name] = value
    requests = obj.get("requests")
    if (
        not isinstance(requests, int)
        or isinstance(requests, bool)
        or not 0 <= requests <= _MAX_UNITS
    ):
        raise DispatchError(
            f"load report of {gateway!r}: `requests` must be a non-negative integer"
        )
    return LoadReport(gateway, clean, requests)


class PeerLoads:
    """The latest report of every peer gateway, and their sum per local destination.

    Not thread-safe: one task (the gateway's poller) updates it and applies the totals.
    """

    def __init__(self, destinations: Sequence[str], own_id: str, expiry_s: float) -> None:
        if not (math.isfinite(expiry_s) and expiry_s > 0):
            raise DispatchError(f"expiry_s must be > 0, got {expiry_s!r}")
        self.index = {name: i for i, name in enumerate(destinations)}
        self.own_id = own_id
        self.expiry_s = expiry_s
        self._latest: dict[str, tuple[float, LoadReport]] = {}

    def update(self, report: LoadReport, now: float) -> bool:
        """Keep `report` as its gateway's latest (received at `now`, this gateway's monotonic
        clock); False (and ignored) when it is this gateway's own."""
        if report.gateway == self.own_id:
            return False
        self._latest[report.gateway] = (now, report)
        return True

    def live(self, now: float) -> list[str]:
        """The peers heard from within `expiry_s` of `now` (the others are forgotten)."""
        self._expire(now)
        return sorted(self._latest)

    def _expire(self, now: float) -> None:
        cutoff = now - self.expiry_s
        for gateway in [g for g, (t, _) in self._latest.items() if t < cutoff]:
            del self._latest[gateway]

    def totals(self, now: float) -> tuple[list[int], int]:
        """(units per local destination, requests) summed over the live peers. Destinations a
        peer names that this gateway does not have are not counted (another fleet's view)."""
        self._expire(now)
        units = [0] * len(self.index)
        requests = 0
        for _, report in self._latest.values():
            for name, value in report.units.items():
                i = self.index.get(name)
                if i is not None:
                    units[i] += value
            requests += report.requests
        return units, requests
