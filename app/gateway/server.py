"""One gateway process: the dispatcher, the emitter, the health checker and the HTTP app.

`Gateway(config, settings)` builds the parts that need no event loop (the dispatcher following
the plans topic, the emitter; both may raise a CacheRouteError that says what to do), `app()` the
aiohttp application whose startup hook opens the pooled client session and starts the health
checks, and `close()` flushes the emitter and stops the plan follower.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry

from cacheroute.dispatcher.dispatcher import Dispatcher, DispatcherConfig
from cacheroute.dispatcher.emitter.emitter import Emitter
from cacheroute.gateway.config import GatewayConfig
from cacheroute.gateway.health import BackendHealth
from cacheroute.gateway.metrics import GatewayMetrics
from cacheroute.gateway.peers import PEER_LOADS_PATH, PeerLoadsSync
from cacheroute.gateway.proxy import PREFIX_BLOCK_TOKENS, PREFIX_INDEX_BLOCKS, Proxy
from cacheroute.gateway.status import Status
from cacheroute.openai_api import CHAT_PATH, COMPLETIONS_PATH, MODELS_PATH
from cacheroute.settings import Settings

__all__ = ["Gateway"]

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Gateway:
    """Everything one `cacheroute gateway` process runs."""

    def __init__(self, config: GatewayConfig, settings: Settings) -> None:
        self.config = config
        self.metrics = GatewayMetrics()
        self.dispatcher = Dispatcher(
            [b.name for b in config.backends],
            DispatcherConfig(
                spill_home=config.sole_gateway,
                context_home=config.sole_gateway,
                cache_tokens=(config.cache_tokens or None) if config.sole_gateway else None,
                prefix_blocks=_prefix_blocks(config),
                cold_cost=config.sole_gateway,
            ),
        )
        self.emitter: Emitter | None = None
        try:
            if config.kafka:
                self.emitter = Emitter(settings, config.gateway_id)
                self.dispatcher.follow(settings, client_id=f"cacheroute-{config.gateway_id}")
            else:
                self.dispatcher.start()
        except BaseException:
            self.close()
            raise
        self.health = BackendHealth(
            config.backends,
            self.dispatcher,
            self.metrics,
            interval_s=config.health_interval_s,
            timeout_s=config.health_timeout_s,
        )
        self.proxy = Proxy(config, self.dispatcher, self.emitter, self.health, self.metrics)
        registries = [self.metrics.registry, self.dispatcher.registry]
        follower_metrics = getattr(self.dispatcher.subscription, "metrics", None)
        follower_registry = getattr(follower_metrics, "registry", None)
        if isinstance(follower_registry, CollectorRegistry):
            registries.append(follower_registry)
        if self.emitter is not None:
            registries.append(self.emitter.registry)
        self.peer_sync = PeerLoadsSync(
            self.dispatcher,
            config.gateway_id,
            config.peers,
            config.peer_loads_s,
            self.metrics.registry,
        )
        self.status = Status(config, self.dispatcher, self.proxy, registries)

    def app(self) -> web.Application:
        """The aiohttp application (routes, error middleware, session and health lifecycle)."""
        app = web.Application(
            middlewares=[self._errors], client_max_size=self.config.max_body_bytes
        )
        for path in (CHAT_PATH, COMPLETIONS_PATH):
            app.router.add_post(path, self.proxy.completion, expect_handler=self.proxy.expect)
        app.router.add_get(MODELS_PATH, self.status.models)
        app.router.add_get("/health", self.status.health)
        app.router.add_get("/ready", self.status.ready)
        app.router.add_get("/metrics", self.status.metrics)
        app.router.add_get(PEER_LOADS_PATH, self.peer_sync.serve)
        app.cleanup_ctx.append(self._session)
        return app

    async def _session(self, app: web.Application) -> AsyncIterator[None]:
        """Open the pooled client session, the health checks and the peer reads; close them at
        shutdown."""
        del app
        cfg = self.config
        session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(
                limit=cfg.max_connections, limit_per_host=0, keepalive_timeout=30
            ),
            timeout=aiohttp.ClientTimeout(
                total=None, connect=cfg.connect_timeout_s, sock_read=cfg.read_timeout_s
            ),
        )
        self.proxy.session = session
        tasks = [asyncio.create_task(self.health.run(session), name="cacheroute-health")]
        if cfg.peers:
            tasks.append(asyncio.create_task(self.peer_sync.run(session), name="cacheroute-peers"))
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            await session.close()

    @web.middleware
    async def _errors(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Unknown URLs and methods get OpenAI-style errors; a bug answers 500, never a crash."""
        try:
            return await handler(request)
        except web.HTTPNotFound:
            return self.proxy.fail(request.path, "not_found", f"no route for {request.path}")
        except web.HTTPMethodNotAllowed:
            return self.proxy.fail(
                request.path, "method", f"{request.method} is not allowed on {request.path}"
            )
        except web.HTTPRequestEntityTooLarge:
            return self.proxy.fail(
                request.path,
                "too_large",
                f"request body is larger than {self.config.max_body_bytes} bytes",
            )
        except web.HTTPException:
            raise
        except Exception:
            log.exception("request %s %s failed inside the gateway", request.method, request.path)
            return self.proxy.fail(
                request.path, "internal", "the gateway failed on this request (see its log)"
            )

    def close(self) -> None:
        """Flush the emitter (events of finished requests) and stop the plan follower."""
        if self.emitter is not None:
            self.emitter.close(timeout=10)
        self.dispatcher.close()


def _prefix_blocks(config: GatewayConfig) -> int:
    """A sole gateway remembers a backend's cache worth of prompt blocks (`Router.prefix_blocks`),
    else `PREFIX_INDEX_BLOCKS`; gateways behind a balancer do not (0)."""
    if not config.sole_gateway:
        return 0
    block = config.hash_block_tokens or PREFIX_BLOCK_TOKENS
    return max(1, config.cache_tokens // block) if config.cache_tokens else PREFIX_INDEX_BLOCKS
