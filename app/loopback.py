"""Talking to processes this project started on 127.0.0.1: free ports and their metrics.

The benchmark, the demo and the tests all start `cacheroute` processes with a `--metrics-port` and
read their Prometheus endpoint; this is the one implementation of both halves.
"""

from __future__ import annotations

import socket
import urllib.request

__all__ = ["free_port", "free_port_block", "scrape_metrics"]


def free_port() -> int:
    """A TCP port that is free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_port_block(n: int) -> int:
    """A port p such that p .. p+n-1 are all free on 127.0.0.1 right now (a local broker takes
    its listener and controller ports in a row, a cluster n of them)."""
    for _ in range(100):
        base = free_port()
        if base + n > 65535:
            continue
        socks: list[socket.socket] = []
        try:
            for port in range(base, base + n):
                sock = socket.socket()
                socks.append(sock)
                sock.bind(("127.0.0.1", port))
        except OSError:
            continue
        finally:
            for sock in socks:
                sock.close()
        return base
    raise RuntimeError(f"no block of {n} free ports on 127.0.0.1")


def scrape_metrics(
    port: int, names: tuple[str, ...] | None = None, timeout: float = 2.0
) -> dict[str, float]:
    """Per metric name, the sum of its samples at 127.0.0.1:port (labels summed over).

    Only `names` when given; {} when nothing answers (a process that is starting or gone).
    """
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout) as resp:
            text = resp.read().decode()
    except OSError:
        return {}
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        name = head.split("{", 1)[0]
        if names is not None and name not in names:
            continue
        try:
            out[name] = out.get(name, 0.0) + float(value)
        except ValueError:
            continue
    return out
