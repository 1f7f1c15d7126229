"""The replay commands end to end on tiny inputs (no Kafka)."""

from __future__ import annotations

from pathlib import Path

import orjson
from click.testing import CliRunner

from cacheroute.cli.main import cli


def test_workload_generate_writes_a_replayable_trace(tmp_path: Path) -> None:
    out = tmp_path / "w.jsonl"
    res = CliRunner().invoke(
        cli,
        [
            "workload",
            "generate",
            "--kind",
            "whale",
            "--requests",
            "500",
            "--out",
            str(out),
            "--json",
        ],
    )
    assert res.exit_code == 0, res.output
    stats = orjson.loads(res.output)
    assert stats["requests"] == 500
    assert stats["spec"]["kind"] == "whale"
    assert len(out.read_text(encoding="utf-8").splitlines()) == 500


def test_evaluate_json_and_out(tmp_path: Path) -> None:
    args = [
        "evaluate", "--workload", "whale", "--requests", "1500", "--keys", "200", "-R", "4",
        "--policies", "flat-lb,affinity,cacheroute", "--quick", "--json", "--out", str(tmp_path),
    ]  # fmt: skip
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    data = orjson.loads(res.output)
    assert set(data["policies"]) == {"flat-lb", "affinity", "cacheroute"}
    assert data["sim_requests_per_s"] > 0
    assert data["recommendation"] in ("deploy", "keep flat-lb")
    assert data["diagnostic"]["verdict"] in ("win", "tie", "lose")
    assert {p.name for p in tmp_path.iterdir()} >= {
        "report.md", "result.json", "p99_vs_load.png", "hit_vs_load.png", "load_bars.png",
    }  # fmt: skip


def test_evaluate_needs_one_source() -> None:
    res = CliRunner().invoke(cli, ["evaluate"])
    assert res.exit_code != 0
    assert "--workload" in res.output


def test_replay_copy_needs_a_destination() -> None:
    res = CliRunner().invoke(cli, ["replay", "topic:requests"])
    assert res.exit_code != 0
    assert "--to" in res.output
