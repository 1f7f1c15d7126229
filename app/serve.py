"""Running an aiohttp service (the gateway, the engine stand-in) until SIGTERM or Ctrl-C.

Both use aiohttp for the server and, in the gateway, the client: one event loop, keep-alive
connection pools, SSE written chunk by chunk, and `handler_cancellation` so a client that goes away
cancels its handler (and with it the request the gateway made upstream). uvloop is used when it is
installed (`pip install uvloop`): it is optional, the asyncio loop works the same, only slower.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import importlib
import logging
import signal
from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

__all__ = ["GC_THRESHOLDS", "loop_factory", "serve", "tune_gc"]

GC_THRESHOLDS = (20_000, 20, 100)
"""The cyclic collector's thresholds while serving (CPython's default: 700, 10, 10)."""

log = logging.getLogger(__name__)


class _ShortProtocolErrors(logging.Filter):
    """A malformed HTTP request is the client's mistake: one warning line, not an ERROR with a
    traceback that quotes the request (aiohttp answers it with a 4xx and closes the connection)."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            record.exc_info = None
            record.exc_text = None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
            record.msg = "malformed HTTP request answered with %s: %s"
            record.args = (exc.code, " ".join(str(exc.message).split())[:120])
        return True


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's loop factory when uvloop is importable, else None (asyncio's default loop)."""
    try:
        uvloop = importlib.import_module("uvloop")
    except ImportError:
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


async def _serve(
    app: web.Application, host: str, port: int, on_started: Callable[[], Awaitable[None]] | None
) -> None:
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    try:
        site = web.TCPSite(runner, host, port, backlog=1024, reuse_address=True)
        try:
            await site.start()
        except OSError as exc:
            raise OSError(
                exc.errno,
                f"cannot listen on {host}:{port} ({exc.strerror}); pick another --port or stop "
                "the process that holds it",
            ) from exc
        if on_started is not None:
            await on_started()
        await stop.wait()
        log.warning("stopping: signal received")
    finally:
        await runner.cleanup()


def tune_gc() -> None:
    """Freeze what exists at start-up and collect young objects less often.

    Every request allocates a few hundred tracked objects (the request, headers, futures of the
    upstream call); with CPython's default the collector runs a young pass every 700 net
    allocations and, every 100 of those, a full pass over everything alive - imports, the
    app, the connection pools - with the event loop stopped. `gc.freeze()` moves the objects of
    start-up out of the collector's reach and the thresholds above make passes rarer (a young
    pass still only walks what is young; garbage cycles live a few more allocations). Measured
    with `cacheroute bench gateway --json`, 2-core machine, alternating runs: added p99 at half
    load median 6.4 ms (2.3-12.4, six runs) against 10.3 ms (3.5-27.9) without; saturation
    median ~2,640 against ~2,290 req/s; noisy, but lower in most pairs.
    """
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def serve(
    app: web.Application,
    host: str,
    port: int,
    *,
    on_started: Callable[[], Awaitable[None]] | None = None,
) -> None:
    """Serve `app` on host:port until SIGTERM/SIGINT, then run its cleanup hooks and return."""
    server_log = logging.getLogger("aiohttp.server")
    if not any(isinstance(f, _ShortProtocolErrors) for f in server_log.filters):
        server_log.addFilter(_ShortProtocolErrors())
    tune_gc()
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        runner.run(_serve(app, host, port, on_started))
