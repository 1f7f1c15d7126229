"""A local N-node KRaft cluster on loopback: every node is controller and broker.

Why: a single broker cannot show what production replication buys — that an acknowledged plan or
request survives losing the broker that led its partition, and that writes go on meanwhile. With
three nodes, `topics ensure` creates the topics with replication factor 3 and
`min.insync.replicas=2`, the internal topics (offsets, transactions) are replicated alike, and a
node can be killed and restarted by its pid.

Node i (0-based) listens on `port + 2i` (clients) and `port + 2i + 1` (controller); the bootstrap
address lists every node. State: `<state_dir>/cluster.json` (cluster id, node directory ids: the
quorum every node is formatted with, made once) and `<state_dir>/node-<i>/` (a `LocalBroker`
folder each).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from cacheroute.errors import CacheRouteError
from cacheroute.localkafka.broker import BrokerStatus, LocalBroker, Quorum, Voter, kraft_uuid
from cacheroute.localkafka.distribution import KafkaDistribution

__all__ = ["ClusterStart", "LocalCluster"]


def _uuid22() -> str:
    """A Kafka Uuid in its text form (never one that starts with "-": see `kraft_uuid`)."""
    return kraft_uuid()


@dataclass(frozen=True)
class ClusterStart:
    """What `LocalCluster.start` did."""

    bootstrap: str
    pids: tuple[int, ...]
    already_running: bool
    seconds: float


class LocalCluster:
    """`brokers` local nodes forming one KRaft cluster (see the module docstring)."""

    def __init__(
        self,
        state_dir: Path,
        *,
        host: str = "127.0.0.1",
        port: int = 9092,
        brokers: int = 3,
        heap: str = "384m",
    ) -> None:
        if brokers < 2:
            raise CacheRouteError("a local cluster has at least 2 brokers; use LocalBroker for 1")
        self.state_dir = state_dir
        self.host = host
        self.port = port
        self.size = brokers
        self.heap = heap
        quorum = self._quorum()
        self.nodes = [
            LocalBroker(
                state_dir / f"node-{i}",
                host=host,
                port=port + 2 * i,
                controller_port=port + 2 * i + 1,
                heap=heap,
                node_id=i + 1,
                quorum=quorum,
            )
            for i in range(brokers)
        ]

    @property
    def bootstrap(self) -> str:
        """Every node's client address, comma-separated."""
        return ",".join(n.bootstrap for n in self.nodes)

    def _quorum(self) -> Quorum:
        """The cluster id and node directory ids, made once and kept in cluster.json."""
        meta = self.state_dir / "cluster.json"
        if meta.exists():
            data = json.loads(meta.read_text())
            if len(data["directory_ids"]) != self.size:
                raise CacheRouteError(
                    f"{self.state_dir} holds a {len(data['directory_ids'])}-node cluster, not "
                    f"{self.size}; start it with --brokers {len(data['directory_ids'])} or delete "
                    "the folder"
                )
        else:
            data = {"cluster_id": _uuid22(), "directory_ids": [_uuid22() for _ in range(self.size)]}
            self.state_dir.mkdir(parents=True, exist_ok=True)
            meta.write_text(json.dumps(data, indent=2) + "\n")
        voters = tuple(
            Voter(i + 1, self.host, self.port + 2 * i + 1, d)
            for i, d in enumerate(data["directory_ids"])
        )
        return Quorum(str(data["cluster_id"]), voters)

    def start(self, distribution: KafkaDistribution, *, timeout: float = 180.0) -> ClusterStart:
        """Launch every node that is not running, then wait until each answers."""
        began = time.monotonic()
        running = [n.pid() is not None for n in self.nodes]
        launched = [n.start(distribution, timeout=timeout, wait=False) for n in self.nodes]
        for node in self.nodes:
            node.wait_ready(max(1.0, timeout - (time.monotonic() - began)))
        return ClusterStart(
            self.bootstrap,
            tuple(r.pid for r in launched),
            all(running),
            time.monotonic() - began,
        )

    def stop(self, *, timeout: float = 60.0) -> list[int]:
        """Stop every node of ours (by its pid file); return the pids stopped."""
        return [pid for n in self.nodes if (pid := n.stop(timeout=timeout)) is not None]

    def status(self) -> list[BrokerStatus]:
        """Each node's status."""
        return [n.status() for n in self.nodes]
