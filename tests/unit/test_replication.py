"""Replication: topic specs per cluster size, doctor's replication check, the local cluster quorum."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cacheroute.doctor import FAIL, OK, WARN, PartitionReplicas, check_replication
from cacheroute.errors import CacheRouteError, ConfigError
from cacheroute.localkafka.cluster import LocalCluster
from cacheroute.localkafka.config import render_server_properties
from cacheroute.settings import Settings
from cacheroute.topics import replication_for, topic_specs


@pytest.mark.parametrize(
    ("brokers", "want"),
    [(1, (1, 1)), (2, (2, 1)), (3, (3, 2)), (5, (3, 2))],
)
def test_replication_follows_the_cluster(brokers: int, want: tuple[int, int]) -> None:
    settings = Settings()
    assert replication_for(settings, brokers) == want
    for spec in topic_specs(settings, brokers):
        assert spec.replication_factor == want[0]
        assert spec.config["min.insync.replicas"] == str(want[1])


def test_replication_settings_override_and_validate() -> None:
    env = {"CACHEROUTE_REPLICATION_FACTOR": "2", "CACHEROUTE_MIN_INSYNC_REPLICAS": "2"}
    assert replication_for(Settings.from_env(env), 5) == (2, 2)
    assert replication_for(Settings(min_insync_replicas=1), 3) == (3, 1)
    with pytest.raises(ConfigError, match="exceeds CACHEROUTE_REPLICATION_FACTOR"):
        Settings.from_env(
            {"CACHEROUTE_REPLICATION_FACTOR": "2", "CACHEROUTE_MIN_INSYNC_REPLICAS": "3"}
        )
    with pytest.raises(ConfigError, match="must be 0"):
        Settings.from_env({"CACHEROUTE_REPLICATION_FACTOR": "-1"})


def _r(leader: int, replicas: tuple[int, ...], isr: tuple[int, ...]) -> PartitionReplicas:
    return PartitionReplicas(leader, replicas, isr)


def test_check_replication_healthy_degraded_refusing_offline() -> None:
    healthy = {"plans": {0: _r(1, (1, 2, 3), (1, 2, 3))}, "rates": {0: _r(2, (2, 3, 1), (2, 3, 1))}}
    ok = check_replication(healthy, {"plans": 2, "rates": 2}, want_replicas=3)
    assert (ok.status, ok.message) == (OK, "all 2 partitions fully replicated")

    degraded = {
        "plans": {0: _r(1, (2, 1, 3), (1, 3))},
        "rates": {0: _r(3, (3, 1, 2), (3, 1)), 1: _r(1, (1, 3, 2), (1, 3, 2))},
    }
    f = check_replication(degraded, {"plans": 2, "rates": 2}, want_replicas=3)
    assert f.status == FAIL
    assert f.message == (
        "2 under-replicated partition(s): plans[0] (in sync 2/3, lagging or down: broker 2), "
        "rates[0] (in sync 2/3, lagging or down: broker 2) — writes go on, but one more broker "
        "loss can stop them"
    )
    assert f.detail["offline"] == []

    worse = {"plans": {0: _r(1, (1, 2, 3), (1,))}, "rates": {0: _r(-1, (2, 3, 1), ())}}
    f = check_replication(worse, {"plans": 2, "rates": 2}, want_replicas=3)
    assert f.status == FAIL
    assert f.message.startswith(
        "1 partition(s) without a leader: rates[0] — nothing is read or written there; "
        "1 partition(s) below min.insync.replicas: plans[0] (in sync 1/3, needs 2) — writes "
        "(acks=all) are refused"
    )

    thin = check_replication({"plans": {0: _r(1, (1,), (1,))}}, {"plans": 1}, want_replicas=3)
    assert thin.status == WARN
    assert thin.message == "1 partition(s) have fewer than 3 replicas: plans[0]"


def test_cluster_quorum_is_made_once_and_rendered(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path, port=19100, brokers=3)
    again = LocalCluster(tmp_path, port=19100, brokers=3)
    assert cluster.nodes[0].quorum == again.nodes[0].quorum  # kept in cluster.json
    quorum = cluster.nodes[0].quorum
    assert quorum is not None
    assert cluster.bootstrap == "127.0.0.1:19100,127.0.0.1:19102,127.0.0.1:19104"
    assert quorum.bootstrap_servers == "127.0.0.1:19101,127.0.0.1:19103,127.0.0.1:19105"
    ids = json.loads((tmp_path / "cluster.json").read_text())["directory_ids"]
    assert quorum.initial_controllers == (
        f"1@127.0.0.1:19101:{ids[0]},2@127.0.0.1:19103:{ids[1]},3@127.0.0.1:19105:{ids[2]}"
    )
    node = cluster.nodes[1]
    assert (node.node_id, node.port, node.controller_port) == (2, 19102, 19103)
    props = dict(
        line.split("=", 1)
        for line in render_server_properties(
            host="127.0.0.1",
            port=node.port,
            controller_port=node.controller_port,
            data_dir=tmp_path,
            node_id=node.node_id,
            overrides=node._cluster_properties(quorum),
        ).splitlines()
        if line and not line.startswith("#")
    )
    assert props["node.id"] == "2"
    assert props["controller.quorum.bootstrap.servers"] == quorum.bootstrap_servers
    assert props["offsets.topic.replication.factor"] == "3"
    assert props["transaction.state.log.min.isr"] == "2"
    with pytest.raises(CacheRouteError, match="holds a 3-node cluster"):
        LocalCluster(tmp_path, port=19100, brokers=5)
