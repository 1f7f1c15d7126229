"""Backend liveness: mark a backend down the moment it fails, and up again once it answers.

The proxy marks a backend down on a connection error or a 5xx (`BackendHealth.failed`); every
`health_interval_s` this checker GETs each backend's health path (`/health`, or e.g.
`/v1/models`) and marks it up on a 2xx, down otherwise. A backend is therefore out of rotation
from its first failure until its next good health check. While any backend is down the checks
come sooner, from `FIRST_RECHECK_S` doubling up to the interval, so a transient error (or an engine
that was still starting when the gateway was) costs a fraction of a second, not a whole interval;
a dead backend costs one cheap GET per interval. Transitions are logged once, with what to do.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

import aiohttp

from cacheroute.dispatcher.dispatcher import Dispatcher
from cacheroute.gateway.config import Backend
from cacheroute.gateway.metrics import GatewayMetrics

__all__ = ["FIRST_RECHECK_S", "BackendHealth", "grow_backoff"]

FIRST_RECHECK_S = 0.1
"""Delay before the first re-check of a backend that is down (doubling up to the interval)."""

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
        self._failed = asyncio.Event()  # a request failed: re-check soon, not at the interval

    def is_up(self, name: str) -> bool:
        return self.dispatcher.router.is_up(name)

    def any_up(self) -> bool:
        return bool(self.dispatcher.router.live)

    def failed(self, backend: Backend, why: str) -> None:
        """A request to `backend` failed (connection error, 5xx): take it out of rotation now."""
        if self.is_up(backend.name):
            log.warning(
                "backend %s (%s) failed a request: %s; marked down, its keys go to the other "
                "backends until its health check (%s, re-checked from %g s up to every %g s) passes",
                backend.name,
                backend.url,
                why,
                backend.health_path,
                FIRST_RECHECK_S,
                self.interval_s,
            )
            self.dispatcher.mark_down(backend.name)
            self._failed.set()

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
        """Check every `interval_s` until cancelled; sooner while a backend is down or after a
        request failed, backing off (`grow_backoff`) so a backend that passes its health check but
        keeps failing requests is not re-admitted ten times a second."""
        backoff = 0.0  # 0 while everything has stayed up for a whole interval
        while True:
            all_up = False
            try:
                all_up = all(await self.check_all(session))
                none_up = not self.any_up()
                if none_up and not self._none_up_logged:
                    log.error(
                        "no backend is up: every request gets 503 until one passes its health "
                        "check; check the engines and the --backend URLs"
                    )
                self._none_up_logged = none_up
            except Exception:  # a bug here must not stop the checks
                log.exception("health check round failed; retrying next interval")
                all_up = True  # wait the interval, not a tight loop
            if not all_up:
                backoff = grow_backoff(backoff, self.interval_s)
            self._failed.clear()
            try:
                await asyncio.wait_for(self._failed.wait(), self.interval_s if all_up else backoff)
            except TimeoutError:
                if all_up:
                    backoff = 0.0  # a whole interval without a failure
                continue
            backoff = grow_backoff(backoff, self.interval_s)  # a request failed: re-check soon
            await asyncio.sleep(backoff)


def grow_backoff(backoff: float, interval_s: float) -> float:
    """The next re-check delay: `FIRST_RECHECK_S` after a clean spell, else double, capped at
    the interval."""
    return min(FIRST_RECHECK_S if backoff <= 0 else 2 * backoff, interval_s)


def _auth(backend: Backend) -> dict[str, str]:
    return {"Authorization": f"Bearer {backend.api_key}"} if backend.api_key else {}
