"""The gateway and the engine stand-in as real processes over real sockets, on the real broker.

Gateways (`python -m cacheroute gateway`) in front of engines (`python -m cacheroute engine`),
all on 127.0.0.1: plans published to the broker move keys between engines, a killed engine costs
no client request, streams pass through byte for byte and chunk by chunk, bad requests get 4xx,
a client that leaves cancels the engine's work, and events reach the `requests` topic with the
cached tokens the engine reported.
"""

from __future__ import annotations

import http.client
import re
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import orjson
import pytest

from cacheroute.benchmarks.gateway import GatewayBench, run_gateway_bench
from cacheroute.kafkaio import read_partition
from cacheroute.loopback import free_port
from cacheroute.planner import Plan, PlannerParams, build_plan
from cacheroute.schemas import RequestBatch, RequestEvent, decode_any
from cacheroute.settings import Settings
from cacheroute.topics import ensure_topics
from tests.integration.gateway_support import (
    MODEL,
    Service,
    chat_body,
    engine,
    gateway,
    get,
    post_chat,
    request,
    started,
    wait_until,
)
from tests.integration.planservice_support import started_publisher

pytestmark = pytest.mark.kafka

_CREATED = re.compile(rb'"created":\d+')


def _plan(keys: list[str], names: list[str], version: int) -> Plan:
    """A plan admitting every key with one replica each (q_cap far above every rate)."""
    params = PlannerParams(q_cap=1000.0, warm_slots=len(keys), control_interval_s=60.0)
    rates = np.linspace(1.0, 2.0, len(keys))
    return build_plan(
        keys, rates, names, params, version=version, created_ms=int(time.time() * 1000)
    )


def _usage(reply_body: bytes) -> dict[str, object]:
    """The usage of a whole response, or of the last usage chunk of an SSE stream."""
    if reply_body.startswith(b"data:"):
        found = [
            orjson.loads(e[6:])
            for e in reply_body.split(b"\n\n")
            if e.startswith(b"data: {") and b'"usage"' in e
        ]
        usage: dict[str, object] = found[-1]["usage"]
        return usage
    whole: dict[str, object] = orjson.loads(reply_body)["usage"]
    return whole


# --------------------------------------------------------------------------- plans over Kafka
def test_plans_reach_the_gateways_and_move_keys(settings: Settings, tmp_path: Path) -> None:
    ensure_topics(settings)
    keys = [f"tenant-{i % 3}/conv-{i}" for i in range(16)]
    served: Counter[str] = Counter()
    with ExitStack() as stack:
        e0 = stack.enter_context(engine("d0", tmp_path, "--zero-delay"))
        e1 = stack.enter_context(engine("d1", tmp_path, "--zero-delay"))
        backends = {"d0": e0.port, "d1": e1.port}
        gateways = [
            stack.enter_context(gateway(f"gw-{i}", tmp_path, backends, settings=settings))
            for i in range(2)
        ]
        homes: list[dict[str, str]] = []
        with started_publisher(settings, "test-gateway-plans") as publisher:
            for version, names in ((1, ["d0", "d1"]), (2, ["d1", "d0"])):
                plan = _plan(keys, names, version)
                publisher.publish(plan)
                expected = {
                    k: plan.destination_names[ts[0]] for k, ts in plan.assignments().items()
                }
                assert all(len(ts) == 1 for ts in plan.assignments().values())
                assert sorted(expected) == sorted(keys)
                for gw in gateways:
                    wait_until(
                        lambda gw=gw, v=version: _plan_version(gw) == v,
                        f"{gw.name} applying plan v{version}",
                    )
                    for key in keys:
                        reply = post_chat(gw.port, chat_body(f"about {key}"), key)
                        assert reply.status == 200, reply.body
                        assert reply.backend == expected[key], (gw.name, version, key)
                        served[expected[key]] += 1
                homes.append(expected)
        assert all(homes[0][k] != homes[1][k] for k in keys)  # v2 moved every key
        assert set(homes[0].values()) == {"d0", "d1"}
        for name, svc in (("d0", e0), ("d1", e1)):  # the engines' own count agrees
            assert svc.metrics("vllm:request_success_total") == {
                "vllm:request_success_total": float(served[name])
            }
        ready = get(gateways[0].port, "/ready").json()
        assert ready["plan"] == {
            "following": True,
            "version": 2,
            "age_s": ready["plan"]["age_s"],
            "stale": False,
        }


def _plan_version(gw: Service) -> int | None:
    version: int | None = get(gw.port, "/ready").json()["plan"]["version"]
    return version


# ------------------------------------------------------------------------ a dead engine
def test_a_killed_engine_is_marked_down_and_its_keys_move_without_failures(tmp_path: Path) -> None:
    keys = [f"conv-{i}" for i in range(24)]
    restart_port = free_port()
    with ExitStack() as stack:
        e0 = stack.enter_context(engine("d0", tmp_path, "--zero-delay"))
        e1 = stack.enter_context(
            started(
                "d1",
                ["engine", "--port", str(restart_port), "--name", "d1", "--zero-delay"],
                tmp_path,
                port=restart_port,
            )
        )
        gw = stack.enter_context(
            gateway("gw-kill", tmp_path, {"d0": e0.port, "d1": e1.port}, "--health-interval", "0.3")
        )
        before = {k: post_chat(gw.port, chat_body(k), k) for k in keys}
        assert {r.status for r in before.values()} == {200}
        assert {r.backend for r in before.values()} == {"d0", "d1"}
        e1.proc.kill()  # SIGKILL by pid: no goodbye, pooled connections just break
        e1.proc.wait(10)
        after = {k: post_chat(gw.port, chat_body(k), k) for k in keys}
        assert {r.status for r in after.values()} == {200}  # no failed client request
        assert {r.backend for r in after.values()} == {"d0"}
        m = gw.metrics("cacheroute_gateway_errors_total", "cacheroute_gateway_requests_total")
        assert m.get("cacheroute_gateway_errors_total", 0.0) == 0.0
        assert m["cacheroute_gateway_requests_total"] == 2 * len(keys)
        ready = get(gw.port, "/ready").json()
        assert ready["ready"] is True
        assert ready["backends"]["d1"]["up"] is False
        with started(
            "d1-again",
            ["engine", "--port", str(restart_port), "--name", "d1", "--zero-delay"],
            tmp_path,
            port=restart_port,
        ):
            wait_until(
                lambda: get(gw.port, "/ready").json()["backends"]["d1"]["up"],
                "the health check marking d1 up again",
            )


# ---------------------------------------------------------------- one engine, one gateway
@pytest.fixture(scope="module")
def pair(
    tmp_path_factory: pytest.TempPathFactory, kafka_settings: Settings
) -> Iterator[tuple[Service, Service]]:
    """A slow-decoding engine (40 ms per token) behind a gateway with a 2000-byte body limit."""
    del kafka_settings  # the module is marked kafka; this pair itself runs without Kafka
    logs = tmp_path_factory.mktemp("pair")
    with (
        engine("d0", logs, "--decode-ms", "40") as eng,
        gateway("gw-pair", logs, {"d0": eng.port}, "--max-body-bytes", "2000") as gw,
    ):
        yield eng, gw


def test_streams_pass_through_unchanged_and_as_they_come(pair: tuple[Service, Service]) -> None:
    eng, gw = pair
    body = chat_body(
        "stream me", stream=True, max_tokens=12, stream_options={"include_usage": True}
    )
    post_chat(eng.port, body)  # warms the engine's cache: the next answers report the same hit
    direct = post_chat(eng.port, body)
    conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=30)
    t0 = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", body=body, headers={"x-session-id": "s-1"})
    resp = conn.getresponse()
    first_line = resp.readline()
    first_s = time.perf_counter() - t0
    rest = resp.read()
    total_s = time.perf_counter() - t0
    conn.close()
    via = first_line + rest
    assert resp.status == 200
    assert resp.getheader("x-cacheroute-backend") == "d0"
    assert resp.getheader("Content-Type", "").startswith("text/event-stream")
    assert via.endswith(b"data: [DONE]\n\n")
    # the same bytes as straight from the engine (the clock's `created` second aside)
    assert _CREATED.sub(b"", via) == _CREATED.sub(b"", direct.body)
    assert via.count(b"data: ") == 1 + 12 + 1 + 1 + 1  # role, tokens, finish, usage, [DONE]
    # relayed as produced: the first event long before the 11 decode steps (440 ms) are over
    assert total_s >= 0.4
    assert first_s < total_s / 2, (first_s, total_s)
    whole = post_chat(gw.port, chat_body("stream me", max_tokens=2))
    assert whole.status == 200
    assert whole.json()["choices"][0]["message"]["content"] == " t0 t1"


def test_bad_requests_get_openai_style_4xx(pair: tuple[Service, Service]) -> None:
    _, gw = pair
    cases = [
        (b"{not json", 400, "invalid_json"),
        (b"[1, 2]", 400, "invalid_body"),
        (orjson.dumps({"messages": [{"role": "user", "content": "hi"}]}), 400, "model_required"),
        (orjson.dumps({"model": "", "messages": []}), 400, "model_required"),
        (b"{" + b" " * 3000 + b"}", 413, "request_too_large"),
    ]
    for body, status, code in cases:
        reply = request(gw.port, "POST", "/v1/chat/completions", body=body)
        assert reply.status == status, (body[:40], reply.body)
        assert reply.json()["error"]["code"] == code
        assert reply.headers["content-type"].startswith("application/json")
    # no Content-Length: the limit holds while the body streams in
    chunked = request(gw.port, "POST", "/v1/completions", body=b"x" * 5000, chunked=True)
    assert chunked.status == 413
    small = orjson.dumps({"prompt": "p" * 1500})
    reply = request(gw.port, "POST", "/v1/completions", body=small, chunked=True)
    assert reply.json()["error"]["code"] == "model_required"  # read whole, then judged
    # malformed HTTP: answered 400 by the server, logged in one line, nothing else happens
    with socket.create_connection(("127.0.0.1", gw.port), timeout=10) as raw:
        raw.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
            b"Transfer-Encoding: chunked\r\n\r\nzz\r\n"
        )
        assert raw.recv(100).split(b" ", 2)[1] == b"400"
    assert request(gw.port, "GET", "/v1/chat/completions").status == 405
    assert request(gw.port, "GET", "/nowhere").json()["error"]["code"] == "unknown_url"
    # a backend's own 4xx passes through unchanged
    unknown = post_chat(gw.port, orjson.dumps({"model": "no-such-model", "messages": []}))
    assert unknown.status == 404
    assert unknown.json()["error"]["code"] == "model_not_found"
    assert unknown.backend == "d0"
    # so does the engine's refusal of a body a real backend refuses (messages not a list)
    shapeless = post_chat(gw.port, orjson.dumps({"model": MODEL, "messages": "hi"}))
    assert shapeless.status == 400
    assert shapeless.json()["error"]["code"] == "invalid_messages"
    # never crashed: a good request still works, and the errors are counted by reason
    assert post_chat(gw.port, chat_body("still there?")).status == 200
    text = gw.log.read_text()
    assert "Traceback" not in text
    errors = _labelled(gw.port, "cacheroute_gateway_errors_total")
    assert errors['reason="bad_json"'] == 1
    assert errors['reason="bad_body"'] == 1
    assert errors['reason="missing_model"'] == 3
    assert errors['reason="too_large"'] == 2
    assert errors['reason="method"'] == 1
    assert errors['reason="not_found"'] == 1


def test_a_client_that_leaves_cancels_the_engine_request(pair: tuple[Service, Service]) -> None:
    eng, gw = pair
    body = chat_body("a long answer", stream=True, max_tokens=200)  # 200 x 40 ms = 8 s
    conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=30)
    conn.request("POST", "/v1/chat/completions", body=body, headers={"x-session-id": "leaver"})
    resp = conn.getresponse()
    assert resp.readline().startswith(b"data: ")
    assert eng.metrics("vllm:num_requests_running")["vllm:num_requests_running"] == 1
    conn.close()  # the client goes away mid-stream
    t0 = time.monotonic()
    wait_until(
        lambda: (
            eng.metrics("cacheroute_engine_requests_cancelled_total").get(
                "cacheroute_engine_requests_cancelled_total"
            )
            == 1
        ),
        "the engine's request being cancelled",
        timeout=5,
    )
    assert time.monotonic() - t0 < 4  # long before the 8 s the answer would take
    assert eng.metrics("vllm:num_requests_running")["vllm:num_requests_running"] == 0
    m = gw.metrics("cacheroute_gateway_client_disconnects_total", "cacheroute_dispatcher_inflight")
    assert m["cacheroute_gateway_client_disconnects_total"] == 1
    assert m["cacheroute_dispatcher_inflight"] == 0  # released at the end of the last byte


def _labelled(port: int, name: str) -> dict[str, float]:
    """label text -> value of one metric's samples."""
    text = get(port, "/metrics").body.decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(name + "{"):
            head, _, value = line.rpartition(" ")
            out[head[len(name) + 1 : -1]] = float(value)
    return out


# -------------------------------------------------------------------------- prefix affinity
def _system_prompt_chat(system: str, text: str) -> bytes:
    body = {
        "model": MODEL,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": text}],
        "max_tokens": 2,
    }
    return orjson.dumps(body)


def test_a_sole_gateway_starts_new_conversations_where_their_prompt_went(tmp_path: Path) -> None:
    """Conversations (x-session-id keys) sharing a long system prompt: a sole gateway sends each
    new one where the prompt's leading blocks went; behind a balancer the keys spread."""
    system = "You are the support assistant of tenant 7. " * 40  # ~1,700 characters
    with ExitStack() as stack:
        engines = {
            n: stack.enter_context(engine(n, tmp_path, "--zero-delay")).port
            for n in ("e0", "e1", "e2", "e3")
        }
        sole = stack.enter_context(
            gateway("gw-sole", tmp_path, engines, "--sole-gateway", "--hash-blocks", "16")
        )
        plain = stack.enter_context(gateway("gw-plain", tmp_path, engines, "--hash-blocks", "16"))
        got: dict[str, set[str | None]] = {"sole": set(), "plain": set()}
        for n in range(12):
            body = _system_prompt_chat(system, f"question {n}")
            for name, gw in (("sole", sole), ("plain", plain)):
                reply = post_chat(gw.port, body, key=f"tenant-7-conv-{n}")
                assert reply.status == 200, reply.body
                got[name].add(reply.backend)
        assert len(got["sole"]) == 1  # every conversation where the first one's prompt went
        assert len(got["plain"]) > 1, plain.tail()  # no prefix affinity: the keys' ring places


# ------------------------------------------------------------------ models, 502 and 503
def test_models_are_merged_from_the_backends(tmp_path: Path) -> None:
    with (
        engine("a", tmp_path, "--model", "model-a", "--zero-delay") as a,
        engine("b", tmp_path, "--model", "model-b", "--zero-delay") as b,
        gateway("gw-models", tmp_path, {"a": a.port, "b": b.port}) as gw,
    ):
        models = get(gw.port, "/v1/models").json()
        assert models["object"] == "list"
        assert sorted(m["id"] for m in models["data"]) == ["model-a", "model-b"]


class _Failing(BaseHTTPRequestHandler):
    """A backend that is healthy but answers every completion with a 500."""

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        body = b'{"error": "out of memory"}'
        self.send_response(500)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        del format, args


def test_a_5xx_backend_is_marked_down_then_502_then_503(tmp_path: Path) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Failing)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        port = server.server_address[1]
        with gateway("gw-5xx", tmp_path, {"sick": int(port)}, "--health-interval", "60") as gw:
            first = post_chat(gw.port, chat_body("hello"))
            assert first.status == 502
            assert first.json()["error"]["code"] == "upstream_failure"
            assert "HTTP 500" in first.json()["error"]["message"]
            # It passes its health check, so it is re-admitted after 0.1, 0.2, 0.4, 0.8, 1.6 s,
            # and fails the next request each time: in 3 s at most 5 more 502s, the rest 503.
            statuses: Counter[int] = Counter()
            end = time.monotonic() + 3.0
            while time.monotonic() < end:
                reply = post_chat(gw.port, chat_body("hello"))
                statuses[reply.status] += 1
                if reply.status == 503:
                    assert reply.json()["error"]["code"] == "no_backend_available"
                time.sleep(0.01)
            assert set(statuses) <= {502, 503}
            assert 1 <= statuses[502] <= 5, statuses
            assert statuses[503] > 10 * statuses[502], statuses
            assert "marked down" in gw.log.read_text()
    finally:
        server.shutdown()
        server.server_close()


def test_an_engine_that_starts_after_the_gateway_is_in_rotation_within_seconds(
    tmp_path: Path,
) -> None:
    port = free_port()
    with gateway("gw-early", tmp_path, {"late": port}, "--health-interval", "60") as gw:
        assert get(gw.port, "/ready").status == 503
        time.sleep(1.0)  # the first failed checks back off: 0.1, 0.2, 0.4 s ...
        with started(
            "late",
            ["engine", "--port", str(port), "--name", "late", "--zero-delay"],
            tmp_path,
            port=port,
        ):
            t0 = time.monotonic()
            wait_until(lambda: get(gw.port, "/ready").status == 200, "the late engine", 20.0)
            # not the 60 s interval: the backoff is at most a few seconds by now
            assert time.monotonic() - t0 < 15.0
            assert post_chat(gw.port, chat_body("hello")).status == 200


# ------------------------------------------------------------------------ events on Kafka
def _events(settings: Settings) -> list[RequestEvent]:
    topic = settings.topics["requests"]
    out: list[RequestEvent] = []
    for p in range(settings.requests_partitions):
        for rec in read_partition(settings, topic, p):
            batch = decode_any(
                rec.value, topic=rec.topic, partition=rec.partition, offset=rec.offset
            )
            assert isinstance(batch, RequestBatch)
            out.extend(batch.events())
    return out


def test_events_carry_the_cached_tokens_the_engine_reported(
    settings: Settings, tmp_path: Path
) -> None:
    ensure_topics(settings)
    key, other = "tenant-1/conv-1", "tenant-1/conv-2"
    with engine("d0", tmp_path, "--zero-delay") as eng:
        with gateway("gw-events", tmp_path, {"d0": eng.port}, settings=settings) as gw:
            cold = post_chat(gw.port, chat_body("What is a prefix cache?"), key)
            warm = post_chat(gw.port, chat_body("What is a prefix cache?"), key)
            streamed = post_chat(
                gw.port,
                chat_body(
                    "What is a prefix cache?", stream=True, stream_options={"include_usage": True}
                ),
                key,
            )
            silent = post_chat(gw.port, chat_body("No usage, please", stream=True), other)
            replies = [cold, warm, streamed, silent]
            assert [r.status for r in replies] == [200] * 4
        assert gw.proc.returncode == 0  # SIGTERM: a clean stop that flushed the emitter
    usages = [_usage(r.body) for r in (cold, warm, streamed)]
    cached = [u["prompt_tokens_details"]["cached_tokens"] for u in usages]  # type: ignore[index]
    assert cached[0] == 0
    assert cached[1] > 0
    assert cached[2] == cached[1]
    events = _events(settings)
    mine = [e for e in events if e.key == key]
    assert [(e.prompt_tokens, e.cached_tokens) for e in mine] == [
        (u["prompt_tokens"], c) for u, c in zip(usages, cached, strict=True)
    ]
    assert {e.destination for e in events} == {"d0"}
    assert {e.gateway_id for e in events} == {"gw-events"}
    (no_usage,) = [e for e in events if e.key == other]
    assert no_usage.cached_tokens is None  # the client did not ask for usage: nothing claimed
    # the estimate (4 characters per token) is the engine's own count of the same prompt
    prompt = "system: " + "You answer questions about caches. " * 4 + "\nuser: No usage, please\n"
    assert no_usage.prompt_tokens == -(-len(prompt) // 4)


# ------------------------------------------------------------------------------- benchmark
def test_bench_gateway_reports_every_figure() -> None:
    result = run_gateway_bench(GatewayBench(duration_s=0.5, concurrency=8, keys=50))
    assert result["failed_requests"] == {}
    for name in ("requests_per_s", "direct_requests_per_s", "stream_requests_per_s"):
        assert result[name] > 0, name
    for prefix in ("", "stream_"):
        assert result[f"{prefix}half_load_per_s"] == pytest.approx(
            result[f"{prefix}requests_per_s"] / 2, abs=0.1
        )
        for figure in ("added_p50_ms", "added_p99_ms"):
            gateway_ms = result[f"{prefix}gateway_{figure[6:]}"]
            direct_ms = result[f"{prefix}direct_{figure[6:]}"]
            assert result[prefix + figure] == pytest.approx(gateway_ms - direct_ms, abs=0.002)
