"""The gateway's own endpoints: /health, /ready, /metrics and the merged /v1/models.

- /health: 200 while the process serves (liveness).
- /ready: 200 when at least one backend is up, else 503; the body reports every backend (up, in
  flight) and the plan (following or not, live version, age, stale), so a load balancer's
  readiness probe and a person read the same thing.
- /metrics: the gateway's registry, then the dispatcher's, the plan follower's and the emitter's.
- /v1/models: the union of the models of the backends that are up, by id (first seen wins).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from typing import Any

import aiohttp
import orjson
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from cacheroute.dispatcher.dispatcher import Dispatcher
from cacheroute.gateway.config import Backend, GatewayConfig
from cacheroute.gateway.proxy import Proxy
from cacheroute.openai_api import MODELS_PATH

__all__ = ["Status", "merge_models"]

_JSON = "application/json"


def merge_models(lists: Sequence[object]) -> list[dict[str, Any]]:
    """The union by `id` of several /v1/models answers (malformed answers are skipped)."""
    seen: dict[str, dict[str, Any]] = {}
    for answer in lists:
        data = answer.get("data") if isinstance(answer, dict) else None
        if not isinstance(data, list):
            continue
        for model in data:
            if isinstance(model, dict) and isinstance(model.get("id"), str):
                seen.setdefault(model["id"], model)
    return list(seen.values())


class Status:
    """Handlers of the gateway's own endpoints."""

    def __init__(
        self,
        config: GatewayConfig,
        dispatcher: Dispatcher,
        proxy: Proxy,
        registries: Sequence[CollectorRegistry],
    ) -> None:
        self.config = config
        self.dispatcher = dispatcher
        self.proxy = proxy
        self.registries = list(registries)

    async def health(self, request: web.Request) -> web.Response:
        del request
        return web.Response(body=b'{"status":"ok"}', content_type=_JSON)

    def readiness(self) -> dict[str, Any]:
        """What /ready reports."""
        router = self.dispatcher.router
        age = self.dispatcher.plan_age_s()
        own, _ = router.own_loads()
        backends = {
            name: {
                "up": router.up[i],
                "inflight": own[i],
                "peer_inflight": router.inflight[i] - own[i],
                "url": b.url,
            }
            for i, (name, b) in enumerate(zip(router.names, self.config.backends, strict=True))
        }
        return {
            "ready": bool(router.live),
            "gateway_id": self.config.gateway_id,
            "backends": backends,
            "plan": {
                "following": self.config.kafka,
                "version": self.dispatcher.version,
                "age_s": None if age is None or not math.isfinite(age) else round(age, 3),
                "stale": router.stale,
            },
        }

    async def ready(self, request: web.Request) -> web.Response:
        del request
        report = self.readiness()
        return web.Response(
            status=200 if report["ready"] else 503, body=orjson.dumps(report), content_type=_JSON
        )

    async def metrics(self, request: web.Request) -> web.Response:
        del request
        body = b"".join(generate_latest(r) for r in self.registries)
        resp = web.Response(body=body)
        resp.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return resp

    async def models(self, request: web.Request) -> web.Response:
        """GET /v1/models: merged from the backends that are up."""
        del request
        up = [b for b in self.config.backends if self.dispatcher.router.is_up(b.name)]
        answers = await asyncio.gather(*(self._models_of(b) for b in up))
        got = [a for a in answers if a is not None]
        if not got:
            return self.proxy.fail(
                MODELS_PATH, "no_backend", "no backend answered GET /v1/models; retry later"
            )
        body = orjson.dumps({"object": "list", "data": merge_models(got)})
        return web.Response(body=body, content_type=_JSON)

    async def _models_of(self, backend: Backend) -> object | None:
        session = self.proxy.session
        assert session is not None
        headers = {"Authorization": f"Bearer {backend.api_key}"} if backend.api_key else {}
        try:
            async with session.get(
                backend.url + MODELS_PATH,
                headers=headers,
                ssl=backend.ssl_context,
                timeout=aiohttp.ClientTimeout(total=self.config.health_timeout_s),
            ) as resp:
                if resp.status != 200:
                    return None
                answer: object = orjson.loads(await resp.read())
                return answer
        except (aiohttp.ClientError, TimeoutError, OSError, orjson.JSONDecodeError):
            return None
