"""Gateways that count each other's loads (`--peer`), as real processes over real sockets.

Two `cacheroute gateway` processes in front of one slow `cacheroute engine`, each naming the
other with `--peer`: a streamed answer held open through one of them shows up within a couple of
read periods as the other's peer load on that backend, and is gone once the answer ends. A peer
URL where nothing listens is counted as unreachable, a peer answering a malformed report as bad,
and neither changes anything else (the hostile report's million units never count).
"""

from __future__ import annotations

import http.client
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from cacheroute.loopback import free_port
from tests.integration.gateway_support import Service, chat_body, engine, gateway, get, wait_until


def _backend(gw: Service) -> dict[str, int]:
    """What a gateway's /ready says of backend d0: its own and its peers' units in flight."""
    d0 = get(gw.port, "/ready").json()["backends"]["d0"]
    return {"own": d0["inflight"], "peers": d0["peer_inflight"]}


class _Hostile(BaseHTTPRequestHandler):
    """A "peer" whose load report is malformed (a number where the gateway id goes)."""

    def do_GET(self) -> None:
        body = b'{"gateway": 7, "units": {"d0": 1000000}, "requests": 1}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        del format, args


@contextmanager
def _hostile_peer() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Hostile)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def _reads(gw: Service) -> dict[str, float]:
    """cacheroute_gateway_peer_reads_total by its `result` label."""
    out: dict[str, float] = {}
    prefix = 'cacheroute_gateway_peer_reads_total{result="'
    for line in get(gw.port, "/metrics").body.decode().splitlines():
        if line.startswith(prefix):
            label, _, value = line[len(prefix) :].partition('"} ')
            out[label] = float(value)
    return out


def test_a_request_held_at_one_gateway_counts_at_its_peer(tmp_path: Path) -> None:
    pa, pb, nobody = free_port(), free_port(), free_port()
    period = ["--peer-loads-s", "0.2"]
    with (
        _hostile_peer() as hostile,
        engine("d0", tmp_path, "--decode-ms", "40") as eng,
        gateway(
            "gw-a",
            tmp_path,
            {"d0": eng.port},
            "--peer",
            f"http://127.0.0.1:{pb}",
            *period,
            port=pa,
        ) as a,
        gateway(
            "gw-b",
            tmp_path,
            {"d0": eng.port},
            "--peer",
            f"http://127.0.0.1:{pa}",
            "--peer",
            f"http://127.0.0.1:{nobody}",
            "--peer",
            f"http://127.0.0.1:{hostile}",
            *period,
            port=pb,
        ) as b,
    ):
        wait_until(
            lambda: (
                b.metrics("cacheroute_gateway_peers_live").get("cacheroute_gateway_peers_live") == 1
            ),
            "gateway b hearing from gateway a",
            timeout=10,
        )
        assert _backend(b) == {"own": 0, "peers": 0}
        body = chat_body("hold this open", stream=True, max_tokens=150)  # 150 x 40 ms = 6 s
        conn = http.client.HTTPConnection("127.0.0.1", a.port, timeout=30)
        conn.request("POST", "/v1/chat/completions", body=body, headers={"x-session-id": "s"})
        resp = conn.getresponse()
        assert resp.readline().startswith(b"data: ")  # streaming: held in flight at gateway a
        own_a = _backend(a)["own"]
        assert own_a >= 1
        wait_until(
            lambda: _backend(b) == {"own": 0, "peers": own_a},
            "gateway a's in-flight request counted at gateway b",
            timeout=5,
        )
        # a answers /peer/loads with its own load only
        report = get(a.port, "/peer/loads").json()
        assert report == {"gateway": "gw-a", "units": {"d0": own_a}, "requests": 1}
        resp.read()  # the answer ends: released at a, and within a few periods at b
        conn.close()
        wait_until(
            lambda: _backend(b) == {"own": 0, "peers": 0},
            "gateway b seeing gateway a's request end",
            timeout=5,
        )
        reads = _reads(b)
        assert reads.get("unreachable", 0) >= 1  # the peer URL where nothing listens
        assert reads.get("ok", 0) >= 2
        assert reads.get("bad", 0) >= 1  # the malformed report: counted, never applied
