"""Backend liveness: mark a backend down the moment it fails, and up again once it answers.

The proxy marks a backend down on a connection error or a 5xx (`BackendHealth.failed`); every
`health_interval_s` this checker GETs each backend's health path (`/health`, or e.g.
`/v1/models`) and marks it up on a 2xx, down otherwise. A backend is therefore out of rotation
from its first failure until its next good health check: at most one interval for a transient
error, as long as needed for a dead one. Transitions are logged once, with what to do.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

import aiohttp

from cacheroute.dispatcher.dispatcher import Dispatcher
from cacheroute.gateway.config import Backend
from cacheroute.gateway.metrics import GatewayMetrics

__all__ = ["BackendHealth"]

log = logging.getLogger(__name__)


class BackendHealth:
    """Liveness of the gateway's backends, kept in the dispatcher's router."""

    def __init__(
        self,
        backends: Sequence[Backend],
        dispatcher: Dispatcher,
        metrics: GatewayMetrics,
        *,
        interval_s: float,
        timeout_s: float,
    ) -> None:
        self.backends = list(backends)
        self.dispatcher = dispatcher
        self.metrics = metrics
        self.interval_s = interval_s
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._none_up_logged = False

    def is_up(self, name: str) -> bool:
        return self.dispatcher.router.is_up(name)

    def any_up(self) -> bool:
        return bool(self.dispatcher.router.live)

    def failed(self, backend: Backend, why: str) -> None:
        """A request to `backend` failed (connection error, 5xx): take it out of rotation now."""
        if self.is_up(backend.name):
            log.warning(
                "backend %s (%s) failed a request: %s; marked down, its keys go to the other "
                "backends until its health check (%s every %g s) passes again",
                backend.name,
                backend.url,
                why,
                backend.health_path,
                self.interval_s,
            )
            self.dispatcher.mark_down(backend.name)

    async def check(self, session: aiohttp.ClientSession, backend: Backend) -> bool:
        """One health check of `backend`; updates its state and returns whether it passed."""
        why = ""
        try:
            async with session.get(
                backend.url + backend.health_path,
                timeout=self.timeout,
                headers=_auth(backend),
                ssl=backend.ssl_context,
            ) as resp:
                await resp.read()
                ok = 200 <= resp.status < 300
                why = f"HTTP {resp.status}"
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            ok = False
            why = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        self.metrics.health_checks.labels(backend.name, "ok" if ok else "fail").inc()
        was = self.is_up(backend.name)
        if ok and not was:
            log.warning(
                "backend %s (%s) passed its health check: marked up", backend.name, backend.url
            )
            self.dispatcher.mark_up(backend.name)
        elif not ok and was:
            log.warning(
                "backend %s (%s) failed its health check (GET %s: %s): marked down; check that "
                "the engine runs and answers there",
                backend.name,
                backend.url,
                backend.health_path,
                why,
            )
            self.dispatcher.mark_down(backend.name)
        return ok

    async def check_all(self, session: aiohttp.ClientSession) -> list[bool]:
        """Check every backend concurrently."""
        return list(await asyncio.gather(*(self.check(session, b) for b in self.backends)))

    async def run(self, session: aiohttp.ClientSession) -> None:
        """Check every `interval_s` until cancelled."""
        while True:
            try:
                await self.check_all(session)
                none_up = not self.any_up()
                if none_up and not self._none_up_logged:
                    log.error(
                        "no backend is up: every request gets 503 until one passes its health "
                        "check; check the engines and the --backend URLs"
                    )
                self._none_up_logged = none_up
            except Exception:  # a bug here must not stop the checks
                log.exception("health check round failed; retrying next interval")
            await asyncio.sleep(self.interval_s)


def _auth(backend: Backend) -> dict[str, str]:
    return {"Authorization": f"Bearer {backend.api_key}"} if backend.api_key else {}
