"""Helpers for the gateway/engine tests over real sockets: processes, HTTP calls, metrics.

Every process is `python -m cacheroute ...` bound to 127.0.0.1 on a free port, started with its
output in a log file, waited for until its /health answers, and stopped by pid (SIGTERM, then
SIGKILL) when the `with` block ends, whatever happened.
"""

from __future__ import annotations

import http.client
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from cacheroute.loopback import free_port, scrape_metrics
from cacheroute.settings import Settings

REPO = Path(__file__).resolve().parents[2]
MODEL = "cacheroute-sim"


@dataclass
class Service:
    """One started process and its port."""

    name: str
    proc: subprocess.Popen[bytes]
    port: int
    log: Path

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def metrics(self, *names: str) -> dict[str, float]:
        return scrape_metrics(self.port, names or None)

    def stop(self) -> None:
        stop(self.proc)


def stop(proc: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    """SIGTERM this process (by pid), SIGKILL it if it does not exit in time."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout)


@contextmanager
def started(
    name: str,
    args: Sequence[str],
    log_dir: Path,
    *,
    port: int,
    settings: Settings | None = None,
    timeout: float = 30.0,
) -> Iterator[Service]:
    """Run `python -m cacheroute [--bootstrap --topic-prefix] ARGS`; yields once /health is 200."""
    log = log_dir / f"{name}.log"
    argv = [sys.executable, "-m", "cacheroute"]
    if settings is not None:
        argv += ["--bootstrap", settings.bootstrap, "--topic-prefix", settings.topic_prefix]
    argv += list(args)
    env = {**os.environ, "COLUMNS": "200", "PYTHONUNBUFFERED": "1"}
    with log.open("wb") as out:
        proc = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, cwd=REPO
        )
    service = Service(name, proc, port, log)
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise AssertionError(f"{name} exited with {proc.returncode}:\n{service.tail()}")
            try:
                if get(port, "/health").status == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"{name} did not answer /health:\n{service.tail()}")
            time.sleep(0.1)
        yield service
    finally:
        stop(proc)


@contextmanager
def engine(name: str, log_dir: Path, *args: str) -> Iterator[Service]:
    """One `cacheroute engine` on a free port."""
    port = free_port()
    with started(
        name, ["engine", "--port", str(port), "--name", name, *args], log_dir, port=port
    ) as s:
        yield s


@contextmanager
def gateway(
    name: str,
    log_dir: Path,
    backends: Mapping[str, int],
    *args: str,
    settings: Settings | None = None,
    port: int | None = None,
) -> Iterator[Service]:
    """One `cacheroute gateway` in front of `backends` (name -> port); --no-kafka without settings.
    `port`: listen there (known before it starts, e.g. to name it as another's peer)."""
    port = port or free_port()
    argv = ["gateway", "--port", str(port), "--gateway-id", name]
    for backend, backend_port in backends.items():
        argv += ["--backend", f"{backend}=http://127.0.0.1:{backend_port}"]
    if settings is None:
        argv.append("--no-kafka")
    with started(name, [*argv, *args], log_dir, port=port, settings=settings) as s:
        yield s


@dataclass
class Reply:
    """An HTTP answer, read whole."""

    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return orjson.loads(self.body)

    @property
    def backend(self) -> str | None:
        return self.headers.get("x-cacheroute-backend")


def request(
    port: int,
    method: str,
    path: str,
    *,
    body: bytes | None = None,
    headers: Mapping[str, str] | None = None,
    timeout: float = 30.0,
    chunked: bool = False,
) -> Reply:
    """One request on a fresh connection to 127.0.0.1:port (`chunked`: body sent in 1 KiB
    chunks with Transfer-Encoding: chunked, no Content-Length)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        if chunked and body is not None:
            parts = [body[i : i + 1024] for i in range(0, len(body), 1024)]
            conn.request(
                method, path, body=iter(parts), headers=dict(headers or {}), encode_chunked=True
            )
        else:
            conn.request(method, path, body=body, headers=dict(headers or {}))
        resp = conn.getresponse()
        data = resp.read()
        return Reply(resp.status, {k.lower(): v for k, v in resp.getheaders()}, data)
    finally:
        conn.close()


def get(port: int, path: str) -> Reply:
    return request(port, "GET", path, timeout=5.0)


def chat_body(text: str, *, stream: bool = False, max_tokens: int = 4, **extra: Any) -> bytes:
    """A chat request with a system prompt and one user message."""
    body = {
        "model": MODEL,
        "messages": [
            {"role": "system", "content": "You answer questions about caches. " * 4},
            {"role": "user", "content": text},
        ],
        "max_tokens": max_tokens,
        "stream": stream,
        **extra,
    }
    return orjson.dumps(body)


def post_chat(port: int, body: bytes, key: str | None = None) -> Reply:
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["x-session-id"] = key
    return request(port, "POST", "/v1/chat/completions", body=body, headers=headers)


def wait_until(check: Any, what: str, timeout: float = 30.0) -> Any:
    """Poll `check()` until it returns something truthy; fail with `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)
