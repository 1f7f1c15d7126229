"""The replay commands end to end on tiny inputs (no Kafka)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import orjson
from click.testing import CliRunner

from cacheroute.cli.evaluate import EvaluateOptions, evaluate_cmd
from cacheroute.cli.main import cli

TRACES = Path(__file__).resolve().parents[2] / "data" / "traces"


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


def _plan_of(args: list[str]) -> dict[str, object]:
    base = [
        "evaluate", "--trace", str(TRACES / "conversation_mooncake_6000.jsonl"), "--requests",
        "1200", "-R", "4", "--policies", "flat-lb,cacheroute", "--quick", "--json", "--jobs", "1",
    ]  # fmt: skip
    res = CliRunner().invoke(cli, base + args)
    assert res.exit_code == 0, res.output
    plan: dict[str, object] = orjson.loads(res.output)["plan"]
    return plan


def test_session_hints_go_with_block_keys_only() -> None:
    # keys of leading blocks are coarser than conversations: the gateways pass sessions
    assert _plan_of(["--key-blocks", "2"])["session_hints"] is True
    # session keys already are the conversations; and the flag turns the hints off
    assert _plan_of(["--key-blocks", "session"])["session_hints"] is False
    assert _plan_of(["--key-blocks", "2", "--no-session-hints"])["session_hints"] is False


def test_evaluate_options_are_typed_one_field_per_option() -> None:
    """`evaluate`'s callback gets one typed EvaluateOptions, not a dict of Any."""
    names = {p.name for p in evaluate_cmd.params}
    assert names == {f.name for f in dataclasses.fields(EvaluateOptions)}


def test_evaluate_says_in_the_terminal_what_it_left_out(tmp_path: Path) -> None:
    lines = (TRACES / "mooncake_arxiv_1000.jsonl").read_text(encoding="utf-8").splitlines()[:300]
    huge = {
        "timestamp": 60_000,
        "input_length": 10_000_000,
        "output_length": 1,
        "hash_ids": list(range(10**7, 10**7 + 10_000_000 // 512)),
    }
    trace = tmp_path / "t.jsonl"
    trace.write_text("\n".join([*lines, orjson.dumps(huge).decode()]) + "\n", encoding="utf-8")
    args = [
        "evaluate", "--trace", str(trace), "--requests", "301", "--tile", "1", "-R", "4",
        "--policies", "flat-lb,cacheroute", "--quick",
    ]  # fmt: skip
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    text = " ".join(res.output.split())  # the console wraps long lines
    assert (
        "workload: left out 1 of 301 requests whose prompt exceeds a replica's KV capacity" in text
    )
