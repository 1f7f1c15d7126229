"""The proxy: POST /v1/chat/completions and /v1/completions, routed by the dispatcher.

Per request: read the body (bounded), check it is a JSON object naming a model, compute its
routing key and estimate its prompt tokens, route it, and forward the client's bytes unchanged to
the chosen backend over a pooled keep-alive connection. The request counts in flight on its
backend from the send until the last byte of the answer reached the client (`acquire`/`release`
around the whole exchange, streaming included), which is the load the dispatcher balances: until
the backend's first byte it weighs 1 + the prompt's tokens not expected in that backend's cache
// 512 (`Router.work_units`: a conversation's next turn on the backend of its last turn weighs
only its new message), afterwards 1 (the prefill is done; the decode goes on).

Streams are relayed chunk by chunk as they arrive (`iter_any`): nothing is buffered, and the
response is started only when the backend's first chunk is there, so a backend that fails before
sending anything (connection refused or reset, a 5xx, a broken stream) can still be replaced:
it is marked down and the request is retried once on the backend the dispatcher picks next. Once
bytes have reached the client a failure cannot be hidden: the stream ends with an SSE error event.
A client that disconnects cancels its handler (aiohttp `handler_cancellation`), which closes the
upstream connection, so the backend stops working on it.

Every request a backend accepted (status < 500) is emitted once with its key, destination, the
prompt tokens from the backend's `usage` (else the estimate) and the cached tokens it reported.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import aiohttp
import orjson
from aiohttp import web

from cacheroute.dispatcher.dispatcher import Dispatcher, InFlight
from cacheroute.dispatcher.emitter.emitter import Emitter
from cacheroute.gateway.config import Backend, GatewayConfig
from cacheroute.gateway.errors import error_payload
from cacheroute.gateway.health import BackendHealth
from cacheroute.gateway.keys import routing_key, session_hint
from cacheroute.gateway.metrics import GatewayMetrics
from cacheroute.gateway.usage import SseUsageScanner, Usage, usage_from_body
from cacheroute.openai_api import (
    CHAT_PATH,
    COMPLETIONS_PATH,
    MODELS_PATH,
    error_body,
    estimate_tokens,
    prefix_block_hashes,
    prompt_text,
)

__all__ = ["BACKEND_HEADER", "Proxy", "json_error"]

log = logging.getLogger(__name__)

BACKEND_HEADER = "x-cacheroute-backend"
PREFIX_BLOCK_TOKENS = 512
"""A sole gateway's prefix affinity hashes prompts in blocks of this many tokens (4 characters a
token; what the trace readers use) unless --hash-blocks sets another size."""
PREFIX_ROUTING_BLOCKS = 64
"""... and routes by at most this many leading blocks: a new conversation's shared part (system
prompt, tenant prompt) comes first, and hashing all of an 85k-token prompt per request would
cost ~0.2 ms."""
PREFIX_INDEX_BLOCKS = 4096
"""Blocks remembered per backend when --cache-tokens does not say how many fit in its cache."""
"""Response header naming the backend that served the request."""
_FORWARDED = ("Accept", "X-Request-Id", "Idempotency-Key")
_RETURNED = ("X-Request-Id",)
_ENDPOINTS = frozenset({CHAT_PATH, COMPLETIONS_PATH, MODELS_PATH})
_UPSTREAM_ERRORS = (aiohttp.ClientError, TimeoutError, OSError)


def json_error(reason: str, message: str) -> web.Response:
    """An OpenAI-style JSON error response for one of the gateway's failure reasons."""
    status, body = error_payload(reason, message)
    return web.Response(status=status, body=body, content_type="application/json")


class _UpstreamFailedError(Exception):
    """The backend failed before any byte reached the client: the request may go elsewhere."""


class _ClientGoneError(Exception):
    """Writing to the client failed: it disconnected."""


@dataclass(slots=True)
class _Exchange:
    """What one client request went through (updated as it progresses)."""

    backend: Backend | None = None
    """The backend that accepted it (status < 500)."""
    usage: Usage | None = None
    response: web.StreamResponse | None = None
    first_byte: float = 0.0
    settle: Callable[[], None] | None = None
    """Called once at the first byte from the backend: the prompt is prefilled."""

    def reached_first_byte(self) -> None:
        """Stamp the first byte and settle the request's prefill load (once)."""
        self.first_byte = time.perf_counter()
        if self.settle is not None:
            self.settle()
            self.settle = None


class Proxy:
    """Request handlers of the proxied endpoints."""

    def __init__(
        self,
        config: GatewayConfig,
        dispatcher: Dispatcher,
        emitter: Emitter | None,
        health: BackendHealth,
        metrics: GatewayMetrics,
    ) -> None:
        self.config = config
        self.dispatcher = dispatcher
        self.emitter = emitter
        self.health = health
        self.metrics = metrics
        self.backends: Sequence[Backend] = config.backends
        self.session: aiohttp.ClientSession | None = None
        """Set by the app's startup hook (it needs the running loop)."""

    # ---------------------------------------------------------------------------- handlers
    async def completion(self, request: web.Request) -> web.StreamResponse:
        """POST /v1/chat/completions and /v1/completions."""
        t0 = time.perf_counter()
        endpoint = request.path
        chat = endpoint == CHAT_PATH
        raw = await self._read_body(request)
        if raw is None:
            return self.fail(endpoint, "too_large", self._too_large())
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            return self.fail(endpoint, "bad_json", f"request body is not valid JSON: {exc}")
        if not isinstance(body, dict):
            return self.fail(endpoint, "bad_body", "request body must be a JSON object")
        model = body.get("model")
        if not isinstance(model, str) or not model:
            return self.fail(endpoint, "missing_model", "`model` is required (a non-empty string)")
        key, rule = routing_key(self.config.key_rules, request.headers, body, chat=chat)
        session = session_hint(rule, body, chat=chat)
        text = prompt_text(body, chat=chat)
        estimate = estimate_tokens(text)
        bt = self.config.hash_block_tokens
        hashes = prefix_block_hashes(text, bt) if bt > 0 and self.emitter is not None else None
        blocks = None  # the leading blocks a sole gateway routes new conversations by
        if self.dispatcher.config.prefix_blocks > 0:
            blocks = (  # the event's hashes when there are any: the same blocks
                hashes[:PREFIX_ROUTING_BLOCKS]
                if hashes is not None
                else prefix_block_hashes(text, bt or PREFIX_BLOCK_TOKENS, PREFIX_ROUTING_BLOCKS)
            )
        return await self._route(
            request, raw, key, estimate, t0, session=session, hashes=hashes, blocks=blocks
        )

    async def expect(self, request: web.Request) -> web.StreamResponse | None:
        """`Expect: 100-continue`: refuse a body announced too large before the client sends it."""
        length = request.content_length
        if length is not None and length > self.config.max_body_bytes:
            return self.fail(request.path, "too_large", self._too_large())
        if request.headers.get("Expect", "").lower() == "100-continue":
            await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        return None

    def _too_large(self) -> str:
        return (
            f"request body is larger than {self.config.max_body_bytes} bytes "
            "(the gateway's max_body_bytes)"
        )

    def fail(self, endpoint: str, reason: str, message: str) -> web.Response:
        """Answer with the gateway's own error, counted by reason."""
        self.metrics.errors.labels(reason).inc()
        resp = json_error(reason, message)
        label = endpoint if endpoint in _ENDPOINTS else "other"  # no label per garbage URL
        self.metrics.requests.labels(label, f"{resp.status // 100}xx").inc()
        return resp

    # ----------------------------------------------------------------------------- routing
    async def _read_body(self, request: web.Request) -> bytes | None:
        """The request body, or None when it is larger than max_body_bytes."""
        limit = self.config.max_body_bytes
        length = request.content_length
        if length is not None and length > limit:
            return None
        buf = bytearray()
        async for chunk in request.content.iter_any():
            buf += chunk
            if len(buf) > limit:
                return None
        return bytes(buf)

    async def _route(
        self,
        request: web.Request,
        raw: bytes,
        key: str,
        estimate: int,
        t0: float,
        *,
        session: str | None = None,
        hashes: list[int] | None = None,
        blocks: list[int] | None = None,
    ) -> web.StreamResponse:
        """Route, forward, retry once on another backend; always release and emit."""
        router = self.dispatcher.router
        endpoint = request.path
        ex = _Exchange()
        failure = ""
        try:
            for attempt in range(2):
                i = router.route_index(key, session, blocks)
                router.remember(i, blocks)
                if not router.up[i]:  # everything is down: the router fell back to any name
                    break
                backend = self.backends[i]
                # the prompt's tokens not expected in i's cache weigh until the first byte, then
                # only the decode unit (dispatcher.request(key, prompt_tokens=...) does the same)
                units = router.work_units(key, i, estimate, session)
                router.acquire(i, units)
                held = InFlight(router, i, units, backend.name)
                ex.settle = held.first_token
                try:
                    resp = await self._forward(request, backend, raw, ex)
                except _UpstreamFailedError as exc:
                    failure = f"backend {backend.name} failed: {exc}"
                    self.metrics.backend_requests.labels(backend.name, "failed").inc()
                    self.health.failed(backend, str(exc))
                    if attempt == 0 and router.live:
                        self.metrics.retries.inc()
                        continue
                    break
                finally:
                    ex.settle = None
                    held.release()
                self.metrics.requests.labels(endpoint, f"{resp.status // 100}xx").inc()
                return resp
        except _ClientGoneError:
            self.metrics.disconnects.inc()
            assert ex.response is not None  # raised only by writes to a started response
            return ex.response
        except asyncio.CancelledError:  # the client went away while we waited for the backend
            self.metrics.disconnects.inc()
            raise
        finally:
            if ex.backend is not None:
                self._finished(key, estimate, ex, endpoint, t0, hashes=hashes)
        if failure:
            return self.fail(endpoint, "upstream", failure)
        return self.fail(
            endpoint,
            "no_backend",
            "no backend is available: all failed their last request or health check; retry "
            "later (operators: check the engines and the gateway's --backend URLs)",
        )

    def _finished(
        self,
        key: str,
        estimate: int,
        ex: _Exchange,
        endpoint: str,
        t0: float,
        *,
        hashes: list[int] | None = None,
    ) -> None:
        """Account for a request a backend accepted: metrics and its event."""
        usage = ex.usage
        prompt = estimate
        cached: int | None = None
        if usage is not None:
            if usage.prompt_tokens is not None:
                prompt = usage.prompt_tokens
            cached = usage.cached_tokens
        self.metrics.prompt_tokens.inc(prompt)
        if cached:
            self.metrics.cached_tokens.inc(cached)
        now = time.perf_counter()
        self.metrics.latency.labels(endpoint).observe(now - t0)
        if ex.first_byte:
            self.metrics.first_byte.labels(endpoint).observe(ex.first_byte - t0)
        assert ex.backend is not None
        if self.emitter is not None:
            self.emitter.emit(
                key,
                prompt,
                destination=ex.backend.name,
                cached_tokens=cached,
                prefix_block_hashes=hashes,
            )

    # ---------------------------------------------------------------------------- upstream
    def _upstream_headers(self, request: web.Request, backend: Backend) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "Accept-Encoding": "identity"}
        for name in _FORWARDED:
            value = request.headers.get(name)
            if value is not None:
                headers[name] = value
        if backend.api_key:
            headers["Authorization"] = f"Bearer {backend.api_key}"
        return headers

    def _client_headers(self, upstream: aiohttp.ClientResponse, backend: Backend) -> dict[str, str]:
        headers = {
            "Content-Type": upstream.headers.get("Content-Type", "application/json"),
            BACKEND_HEADER: backend.name,
        }
        for name in _RETURNED:
            value = upstream.headers.get(name)
            if value is not None:
                headers[name] = value
        return headers

    async def _forward(
        self, request: web.Request, backend: Backend, raw: bytes, ex: _Exchange
    ) -> web.StreamResponse:
        """One attempt on `backend`. Raises _UpstreamFailedError while nothing reached the
        client, _ClientGoneError when the client left."""
        assert self.session is not None, "the app's startup hook creates the session"
        try:
            async with self.session.post(
                backend.url + request.path,
                data=raw,
                headers=self._upstream_headers(request, backend),
                ssl=backend.ssl_context,
            ) as upstream:
                if upstream.status >= 500:
                    detail = (await upstream.content.read(300)).decode("utf-8", "replace")
                    raise _UpstreamFailedError(f"HTTP {upstream.status} {detail}".strip())
                ctype = upstream.headers.get("Content-Type", "")
                if ctype.startswith("text/event-stream"):
                    return await self._relay(request, upstream, backend, ex)
                body = await upstream.read()
                ex.reached_first_byte()
                ex.backend = backend
                self.metrics.backend_requests.labels(backend.name, "ok").inc()
                if upstream.status < 300:
                    ex.usage = usage_from_body(body)
                return web.Response(
                    status=upstream.status,
                    body=body,
                    headers=self._client_headers(upstream, backend),
                )
        except _UPSTREAM_ERRORS as exc:
            raise _UpstreamFailedError(_describe(exc)) from exc

    async def _relay(
        self,
        request: web.Request,
        upstream: aiohttp.ClientResponse,
        backend: Backend,
        ex: _Exchange,
    ) -> web.StreamResponse:
        """Pass an SSE stream through chunk by chunk, reading its usage on the way."""
        chunks = upstream.content.iter_any()
        try:
            chunk = await chunks.__anext__()
        except StopAsyncIteration:
            chunk = b""
        # upstream errors so far propagate: nothing reached the client, the caller may retry
        ex.reached_first_byte()
        ex.backend = backend
        out = web.StreamResponse(
            status=upstream.status, headers=self._client_headers(upstream, backend)
        )
        out.headers["Cache-Control"] = "no-cache"
        scanner = SseUsageScanner()
        ex.response = out
        try:
            await out.prepare(request)
            tail = b""
            broken = False
            while chunk:
                scanner.feed(chunk)
                await out.write(chunk)
                tail = chunk
                try:
                    chunk = await chunks.__anext__()
                except StopAsyncIteration:
                    break
                except _UPSTREAM_ERRORS as exc:
                    await self._broken(out, backend, tail, exc)
                    broken = True
                    break
            ex.usage = scanner.close()
            await out.write_eof()
        except ConnectionResetError as exc:  # aiohttp's ClientConnectionResetError included
            raise _ClientGoneError(str(exc)) from exc
        if not broken:
            self.metrics.backend_requests.labels(backend.name, "ok").inc()
        return out

    async def _broken(
        self, out: web.StreamResponse, backend: Backend, tail: bytes, exc: BaseException
    ) -> None:
        """The backend failed mid-stream: end the client's stream with an SSE error event."""
        why = _describe(exc)
        self.metrics.backend_requests.labels(backend.name, "broken").inc()
        self.metrics.errors.labels("upstream").inc()
        self.health.failed(backend, f"stream broke after the first bytes ({why})")
        if not tail.endswith(b"\n\n"):
            await out.write(b"\n\n")  # end the half-sent event so the error event parses
        body = error_body(
            f"backend {backend.name} failed mid-stream: {why}", "upstream_error", "upstream_failure"
        )
        await out.write(b"data: " + body + b"\n\n")


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
