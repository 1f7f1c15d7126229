"""The engine stand-in's HTTP server: OpenAI-compatible endpoints over the simulated replica.

One `Engine` owns the prefix cache and the running slots; a request waits for a slot (queueing,
`vllm:num_requests_waiting`), looks its prompt up in the cache, sleeps its prefill (uncached
tokens only), then produces one output token per decode step, streamed as SSE events as they
are made, or returned whole at the end. A client that disconnects cancels its handler (aiohttp
`handler_cancellation`), which frees the slot at once, as vLLM aborts a request whose client left.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from cacheroute.engine.cache import PrefixCache
from cacheroute.engine.config import EngineConfig
from cacheroute.engine.metrics import EngineMetrics
from cacheroute.engine.responses import DONE, Framer, Usage, output_token
from cacheroute.openai_api import (
    CHAT_PATH,
    COMPLETIONS_PATH,
    MODELS_PATH,
    error_body,
    prompt_text,
)

__all__ = ["Engine", "build_app"]

log = logging.getLogger(__name__)

_JSON = "application/json"


class _BadRequestError(Exception):
    """A request the engine answers with a 4xx."""

    def __init__(self, status: int, message: str, code: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


def _check_prompt(body: dict[str, Any], *, chat: bool) -> None:
    """A chat request needs a non-empty list of messages, each an object with a string `role`;
    a completion a `prompt`: a string, or a non-empty list of strings, of token ids, or of lists
    of token ids. OpenAI's API and vLLM answer anything else with a 400, and so does the stand-in
    (the gateway passes bodies through, so what a real backend refuses must be refused here)."""
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise _BadRequestError(
                400, "`messages` must be a non-empty list of messages", "invalid_messages"
            )
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise _BadRequestError(
                    400,
                    f"`messages[{i}]` must be an object with a string `role`",
                    "invalid_messages",
                )
        return
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt) or all(_token_ids(p) for p in prompt):
            return
        if _token_ids(prompt):
            return
    raise _BadRequestError(
        400,
        "`prompt` must be a string, or a non-empty list of strings, token ids or lists of them",
        "invalid_prompt",
    )


def _token_ids(value: object) -> bool:
    """A non-empty list of non-negative integers (bools are not token ids)."""
    return isinstance(value, list) and bool(value) and all(type(t) is int and t >= 0 for t in value)


@dataclass(frozen=True, slots=True)
class _Job:
    """One valid request's parameters."""

    body: dict[str, Any]
    max_tokens: int
    stream: bool
    include_usage: bool


class Engine:
    """The simulated replica: slots, cache and timing (owned by one event loop)."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.cache = PrefixCache(config.cache_tokens, block_tokens=config.block_tokens)
        self._slots = asyncio.Semaphore(config.max_running)
        self.running = 0
        self.waiting = 0
        self.metrics = EngineMetrics(
            config.model,
            running=lambda: self.running,
            waiting=lambda: self.waiting,
            cache_usage=lambda: self.cache.usage,
        )
        self.started = int(time.time())

    async def generate(
        self, text: str, max_tokens: int, usage_out: list[Usage]
    ) -> AsyncGenerator[str, None]:
        """Yield the output tokens of one request, at the simulated times.

        Appends (prompt, completion, cached) tokens to `usage_out` before the first token.
        """
        cfg = self.config
        t0 = time.perf_counter()
        self.waiting += 1
        try:
            await self._slots.acquire()
        finally:
            self.waiting -= 1
        self.running += 1
        done = False
        try:
            hit = self.cache.lookup(text)
            self.metrics.cache_queries.inc(hit.prompt_tokens)
            self.metrics.cache_hits.inc(hit.cached_tokens)
            self.metrics.prompt_tokens.inc(hit.prompt_tokens)
            prefill = cfg.prefill_s(hit.prompt_tokens - hit.cached_tokens)
            if prefill > 0:
                await asyncio.sleep(prefill)
            self.cache.insert(hit.hashes)
            usage_out.append((hit.prompt_tokens, max_tokens, hit.cached_tokens))
            self.metrics.ttft.observe(time.perf_counter() - t0)
            step = cfg.decode_s()
            for i in range(max_tokens):
                if i and step > 0:
                    await asyncio.sleep(step)
                self.metrics.generation_tokens.inc()
                yield output_token(i)
            done = True
            self.metrics.finished("length")
            self.metrics.e2e.observe(time.perf_counter() - t0)
        finally:
            self.running -= 1
            self._slots.release()
            if not done:
                self.metrics.cancelled.inc()

    # ------------------------------------------------------------------------------ requests
    def _parse(self, raw: bytes, *, chat: bool) -> _Job:
        """The request's parameters, or _BadRequestError (the checks OpenAI's API makes)."""
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise _BadRequestError(
                400, f"request body is not valid JSON: {exc}", "invalid_json"
            ) from exc
        if not isinstance(body, dict):
            raise _BadRequestError(400, "request body must be a JSON object", "invalid_body")
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise _BadRequestError(400, "`model` is required", "model_required")
        if model != self.config.model:
            raise _BadRequestError(
                404,
                f"The model `{model}` does not exist (this engine serves `{self.config.model}`).",
                "model_not_found",
            )
        want = body.get("max_tokens", body.get("max_completion_tokens"))
        if want is None:
            want = self.config.default_max_tokens
        if type(want) is not int or want < 1:
            raise _BadRequestError(
                400, "`max_tokens` must be a positive integer", "invalid_max_tokens"
            )
        stream = body.get("stream")
        if stream is not None and not isinstance(stream, bool):
            raise _BadRequestError(400, "`stream` must be a boolean", "invalid_stream")
        _check_prompt(body, chat=chat)
        options = body.get("stream_options")
        return _Job(
            body=body,
            max_tokens=min(want, self.config.max_output_tokens),
            stream=stream is True,
            include_usage=isinstance(options, dict) and options.get("include_usage") is True,
        )

    async def completion(self, request: web.Request) -> web.StreamResponse:
        """POST /v1/chat/completions and /v1/completions."""
        chat = request.path == CHAT_PATH
        raw = await request.read()
        try:
            job = self._parse(raw, chat=chat)
        except _BadRequestError as exc:
            self.metrics.rejected.labels(exc.code).inc()
            kind = "invalid_request_error" if exc.status == 400 else "NotFoundError"
            return web.Response(
                status=exc.status, body=error_body(str(exc), kind, exc.code), content_type=_JSON
            )
        framer = Framer(
            chat=chat,
            digest=hashlib.blake2b(raw, digest_size=12).hexdigest(),
            created=int(time.time()),
            model=self.config.model,
        )
        usage: list[Usage] = []
        text = prompt_text(job.body, chat=chat)
        async with contextlib.aclosing(self.generate(text, job.max_tokens, usage)) as tokens:
            if not job.stream:
                out = "".join([t async for t in tokens])
                return web.Response(body=framer.whole(out, "length", usage[0]), content_type=_JSON)
            resp = web.StreamResponse(
                headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
            )
            async for t in tokens:  # the first token arrives after the prefill
                if not resp.prepared:
                    await resp.prepare(request)
                    opening = framer.opening()
                    if opening is not None:
                        await resp.write(opening)
                await resp.write(framer.token(t))
        if not resp.prepared:
            await resp.prepare(request)
        await resp.write(framer.finish("length"))
        if job.include_usage and usage:
            await resp.write(framer.usage(usage[0]))
        await resp.write(DONE)
        await resp.write_eof()
        return resp

    async def models(self, request: web.Request) -> web.Response:
        """GET /v1/models: the one model this engine serves."""
        del request
        data = {
            "object": "list",
            "data": [
                {
                    "id": self.config.model,
                    "object": "model",
                    "created": self.started,
                    "owned_by": "cacheroute",
                }
            ],
        }
        return web.Response(body=orjson.dumps(data), content_type=_JSON)

    async def health(self, request: web.Request) -> web.Response:
        """GET /health: 200 while the server runs (vLLM answers the same way)."""
        del request
        return web.Response(status=200)

    async def prometheus(self, request: web.Request) -> web.Response:
        """GET /metrics."""
        del request
        resp = web.Response(body=generate_latest(self.metrics.registry))
        resp.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return resp


def build_app(config: EngineConfig) -> tuple[web.Application, Engine]:
    """The aiohttp application of one engine (create it inside the running event loop)."""
    engine = Engine(config)
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post(CHAT_PATH, engine.completion)
    app.router.add_post(COMPLETIONS_PATH, engine.completion)
    app.router.add_get(MODELS_PATH, engine.models)
    app.router.add_get("/health", engine.health)
    app.router.add_get("/metrics", engine.prometheus)
    return app, engine
