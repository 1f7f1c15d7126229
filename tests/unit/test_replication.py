"""Replication: topic specs per cluster size, doctor's replication check, the local cluster quorum."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from cacheroute.cli.main import cli
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
    assert replication_for(Settings(min_insync_replicas=1), 2) == (2, 1)  # fewer than 3 replicas
    assert replication_for(Settings(min_insync_replicas=3), 5) == (3, 3)
    with pytest.raises(ConfigError, match="exceeds CACHEROUTE_REPLICATION_FACTOR"):
        Settings.from_env(
            {"CACHEROUTE_REPLICATION_FACTOR": "2", "CACHEROUTE_MIN_INSYNC_REPLICAS": "3"}
        )
    with pytest.raises(ConfigError, match="must be 0"):
        Settings.from_env({"CACHEROUTE_REPLICATION_FACTOR": "-1"})


MIN_ISR_1_REFUSED = (
    "CACHEROUTE_MIN_INSYNC_REPLICAS=1 with 3 replicas: plans and the streams changelogs must "
    "never run with fewer than 2 in sync (an acknowledged plan could live on one broker only); "
    "unset it (automatic: 2) or set it to 2 or more (`topics ensure` flag: --min-insync-replicas)"
)


def test_min_insync_below_two_is_refused_with_three_replicas() -> None:
    """`plans` and the changelogs never run with 1 in sync on a replicated cluster: an explicit
    factor is refused when the settings are read, the automatic one once the cluster is known."""
    auto = Settings(min_insync_replicas=1)
    with pytest.raises(ConfigError) as refused:
        replication_for(auto, 3)
    assert str(refused.value) == MIN_ISR_1_REFUSED
    with pytest.raises(ConfigError) as refused:
        topic_specs(auto, 5)
    assert str(refused.value) == MIN_ISR_1_REFUSED
    with pytest.raises(ConfigError) as refused:
        Settings.from_env(
            {"CACHEROUTE_REPLICATION_FACTOR": "3", "CACHEROUTE_MIN_INSYNC_REPLICAS": "1"}
        )
    assert str(refused.value) == MIN_ISR_1_REFUSED
    with pytest.raises(ConfigError) as refused:
        Settings().with_overrides(replication_factor=4, min_insync_replicas=1)
    assert str(refused.value).startswith("CACHEROUTE_MIN_INSYNC_REPLICAS=1 with 4 replicas: ")
    # on one broker, 1 in sync is all there can be
    assert replication_for(auto, 1) == (1, 1)


def test_min_insync_above_the_automatic_factor_is_refused() -> None:
    """Kafka creates a topic whose min.insync.replicas exceeds its replicas, then refuses every
    acks=all write: with the factor automatic, it is caught once the cluster's size is known."""
    with pytest.raises(ConfigError) as refused:
        replication_for(Settings(min_insync_replicas=2), 1)
    assert str(refused.value) == (
        "CACHEROUTE_MIN_INSYNC_REPLICAS (2) exceeds the replication factor (1, from the "
        "cluster's 1 broker(s)): no write could succeed; lower it, or set "
        "CACHEROUTE_REPLICATION_FACTOR (`topics ensure` flags: --min-insync-replicas, "
        "--replication-factor)"
    )
    assert replication_for(Settings(min_insync_replicas=2), 3) == (3, 2)


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


def _topics_ensure(*flags: str) -> subprocess.CompletedProcess[str]:
    """`cacheroute topics ensure FLAGS` against no broker: what is checked here is refused before
    any connection (one would end in "no Kafka broker answers" instead)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CACHEROUTE_")}
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "cacheroute",
            "--bootstrap",
            "127.0.0.1:1",
            "topics",
            "ensure",
            *flags,
        ],
        capture_output=True,
        text=True,
        env=env | {"COLUMNS": "80"},
        timeout=60,
        check=False,
    )


def test_topics_ensure_replication_flags_are_validated_like_the_settings() -> None:
    refused = _topics_ensure("--replication-factor", "3", "--min-insync-replicas", "1")
    assert (refused.returncode, refused.stdout) == (1, "")
    assert refused.stderr == f"error: {MIN_ISR_1_REFUSED}\n"  # one line at any terminal width

    exceeds = _topics_ensure("--replication-factor", "2", "--min-insync-replicas", "3")
    assert exceeds.returncode == 1
    assert exceeds.stderr == (
        "error: CACHEROUTE_MIN_INSYNC_REPLICAS (3) exceeds CACHEROUTE_REPLICATION_FACTOR (2): "
        "no write could succeed (`topics ensure` flags: --min-insync-replicas, "
        "--replication-factor)\n"
    )
    zero = _topics_ensure("--replication-factor", "0")
    assert zero.returncode == 2  # a usage error
    assert "Invalid value for '--replication-factor': 0 is not in the range x>=1." in zero.stderr
    assert "Traceback" not in refused.stderr + exceeds.stderr + zero.stderr


def test_topics_ensure_help_names_the_replication_flags() -> None:
    result = CliRunner().invoke(cli, ["topics", "ensure", "--help"], terminal_width=200)
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert (
        "--replication-factor INTEGER RANGE Replicas per partition of new topics [default: "
        "CACHEROUTE_REPLICATION_FACTOR, else min(3, brokers)]."
    ) in text
    assert (
        "--min-insync-replicas INTEGER RANGE min.insync.replicas of the topics [default: "
        "CACHEROUTE_MIN_INSYNC_REPLICAS, else 2 with 3 or more replicas, 1 below]."
    ) in text
