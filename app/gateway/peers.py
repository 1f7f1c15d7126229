"""The gateway's peer loads: serve its own in-flight load, read its peers', route on the sum.

`GET /peer/loads` answers this gateway's own load (`Dispatcher.load_report`: units and requests
in flight per backend, without what it counts of its peers). With `--peer URL` the gateway reads
every peer's answer each `peer_loads_s`, concurrently, keeps the latest of each
(`cacheroute.dispatcher.peers.PeerLoads`; a peer silent for three periods is dropped) and folds
their sum into its dispatcher (`Dispatcher.apply_peer_loads`). A peer that is down, slow or
answers something malformed costs one failed read, counted by result in
`cacheroute_gateway_peer_reads_total`; routing goes on with what is known.
"""

from __future__ import annotations

import asyncio
import logging
import time

import aiohttp
import orjson
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge

from cacheroute.dispatcher.dispatcher import Dispatcher
from cacheroute.dispatcher.errors import DispatchError
from cacheroute.dispatcher.peers import LoadReport, PeerLoads, parse_load_report

__all__ = ["PEER_LOADS_PATH", "PeerLoadsSync"]

log = logging.getLogger(__name__)

PEER_LOADS_PATH = "/peer/loads"

_EXPIRY_PERIODS = 3.0
"""A peer not heard from for this many periods is dropped (its load no longer counted)."""

_MAX_REPORT_BYTES = 1 << 20

_START_GRACE_S = 10.0
"""Peers unreachable in this long after start are counted but not logged (starting together)."""


class PeerLoadsSync:
    """Serves this gateway's load report and keeps its dispatcher on its peers' latest ones."""

    def __init__(
        self,
        dispatcher: Dispatcher,
        gateway_id: str,
        peers: tuple[str, ...],
        period_s: float,
        registry: CollectorRegistry,
    ) -> None:
        self.dispatcher = dispatcher
        self.gateway_id = gateway_id
        self.peers = peers
        self.period_s = period_s
        self.table = PeerLoads(dispatcher.router.names, gateway_id, _EXPIRY_PERIODS * period_s)
        self.reads = Counter(
            "cacheroute_gateway_peer_reads",
            "Reads of the peer gateways' loads, by result (ok, unreachable, bad: malformed).",
            ["result"],
            registry=registry,
        )
        self.live = Gauge(
            "cacheroute_gateway_peers_live",
            "Peer gateways whose latest load report is recent enough to count.",
            registry=registry,
        )
        self._warned: set[str] = set()
        self._quiet_until = 0.0
        """No warning before this (monotonic): peers started together come up one by one."""

    async def serve(self, request: web.Request) -> web.Response:
        """GET /peer/loads: this gateway's own in-flight load."""
        del request
        report = self.dispatcher.load_report(self.gateway_id)
        return web.Response(body=orjson.dumps(report.to_json()), content_type="application/json")

    async def run(self, session: aiohttp.ClientSession) -> None:
        """Read every peer each period, forever (cancel to stop)."""
        self._quiet_until = time.monotonic() + _START_GRACE_S
        while True:
            started = time.monotonic()
            await self.read_once(session)
            await asyncio.sleep(max(0.0, self.period_s - (time.monotonic() - started)))

    async def read_once(self, session: aiohttp.ClientSession) -> None:
        """One round: read every peer concurrently, then apply the live peers' sum."""
        reports = await asyncio.gather(*(self._read(session, url) for url in self.peers))
        now = time.monotonic()
        for report in reports:
            if report is not None:
                self.table.update(report, now)
        self.live.set(len(self.table.live(now)))
        self.dispatcher.apply_peer_loads(self.table, now)

    async def _read(self, session: aiohttp.ClientSession, url: str) -> LoadReport | None:
        try:
            async with session.get(
                url + PEER_LOADS_PATH,
                timeout=aiohttp.ClientTimeout(total=max(0.1, self.period_s)),
            ) as resp:
                if resp.status != 200:
                    raise aiohttp.ClientResponseError(
                        resp.request_info, (), status=resp.status, message="not 200"
                    )
                body = await resp.content.read(_MAX_REPORT_BYTES + 1)
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            self.reads.labels("unreachable").inc()
            self._warn(url, f"peer {url} did not answer its load ({exc!r}); counting it out")
            return None
        try:
            if len(body) > _MAX_REPORT_BYTES:
                raise DispatchError(f"a load report over {_MAX_REPORT_BYTES} bytes")
            report = parse_load_report(orjson.loads(body))
        except (orjson.JSONDecodeError, DispatchError) as exc:
            self.reads.labels("bad").inc()
            self._warn(url, f"peer {url} answered a malformed load report: {exc}")
            return None
        self.reads.labels("ok").inc()
        if url in self._warned:
            self._warned.discard(url)
            log.warning("peer %s answers its load again", url)
        return report

    def _warn(self, url: str, message: str) -> None:
        """Log a peer's failure once until it recovers (a dead peer must not flood the log);
        not in the first `_START_GRACE_S` (the failure is counted all the same)."""
        if url not in self._warned and time.monotonic() >= self._quiet_until:
            self._warned.add(url)
            log.warning("%s; check that it runs and that --peer names its base URL", message)
