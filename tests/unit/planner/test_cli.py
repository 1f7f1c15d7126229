"""`cacheroute plan build` and `cacheroute bench planner|churn`, offline, through click."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner

from cacheroute.cli.main import cli
from cacheroute.errors import CacheRouteError


def write_rates(path: Path, rows: list[str], header: str = "key,rate") -> Path:
    path.write_text("\n".join([header, *rows]) + "\n", encoding="utf-8")
    return path


def invoke(*args: str) -> tuple[int, str, BaseException | None]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.stdout, result.exception


def test_plan_build_json(tmp_path: Path) -> None:
    rates = write_rates(tmp_path / "r.csv", ["a,9", "b,7", "c,5", "d,3", "e,2", "f,1"])
    code, out, exc = invoke(
        "plan",
        "build",
        "--rates",
        str(rates),
        "--destinations",
        "3",
        "--q-cap",
        "4",
        "--warm-slots",
        "2",
        "--json",
    )
    assert code == 0, exc
    data = orjson.loads(out)
    assert data["assignments"] == {"a": ["d0", "d1", "d2"], "b": ["d0", "d1"], "d": ["d2"]}
    assert data["loads"] == pytest.approx({"d0": 55 / 6, "d1": 55 / 6, "d2": 26 / 3})
    assert data["summary"]["admitted_keys"] == 3
    assert data["version"] == 1


def test_plan_build_from_prev_and_destinations_file(tmp_path: Path) -> None:
    rates = write_rates(tmp_path / "r.csv", [f"k{i},{1 + i % 7}" for i in range(60)])
    first = tmp_path / "plan.json"
    code, _, exc = invoke(
        "plan",
        "build",
        "--rates",
        str(rates),
        "--destinations",
        "4",
        "--q-cap",
        "10",
        "--warm-slots",
        "20",
        "--out",
        str(first),
    )
    assert code == 0, exc
    dests = tmp_path / "dests.txt"
    dests.write_text("# cluster\nd0\nd1,2.0\nd2\n", encoding="utf-8")
    code, out, exc = invoke(
        "plan",
        "build",
        "--rates",
        str(rates),
        "--destinations-file",
        str(dests),
        "--prev",
        str(first),
        "--q-cap",
        "10",
        "--warm-slots",
        "20",
        "--json",
    )
    assert code == 0, exc
    data = orjson.loads(out)
    assert data["version"] == 2
    assert data["destinations"][1] == {"name": "d1", "capacity": 2.0}
    assert "diff" in data
    assert data["advice"]["publish"] is True  # a destination is gone: must publish
    assert "destinations changed" in data["advice"]["reasons"]
    on_d3 = sum(1 for t in orjson.loads(first.read_bytes())["assignments"].values() if "d3" in t)
    assert data["diff"]["moved_keys"] >= on_d3


def test_plan_build_bytes_admission_and_human_output(tmp_path: Path) -> None:
    rates = write_rates(
        tmp_path / "r.csv", ["short,10,100", "long,5,1000"], header="key,rate,prefix_tokens"
    )
    code, out, exc = invoke(
        "plan",
        "build",
        "--rates",
        str(rates),
        "--destinations",
        "1",
        "--q-cap",
        "100",
        "--warm-slots",
        "1",
        "--admission",
        "bytes",
    )
    assert code == 0, exc
    assert "Plan v1" in out
    assert "admitted_keys" in out


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        (["a,1", "b,nan"], "'b' has rate nan"),
        (["a,1", "a,2"], "duplicate key 'a'"),
        (["a,-1"], "'a' has rate -1.0"),
        (["a,lots"], "r.csv:2: rate 'lots' of key 'a' is not a number"),
        ([], "no keys"),
    ],
)
def test_plan_build_bad_input_names_the_key(tmp_path: Path, rows: list[str], message: str) -> None:
    rates = write_rates(tmp_path / "r.csv", rows)
    code, _, exc = invoke(
        "plan",
        "build",
        "--rates",
        str(rates),
        "--destinations",
        "2",
        "--q-cap",
        "1",
        "--warm-slots",
        "1",
    )
    assert code != 0
    assert isinstance(exc, CacheRouteError)
    assert message in str(exc)


def test_plan_build_needs_exactly_one_destination_option(tmp_path: Path) -> None:
    rates = write_rates(tmp_path / "r.csv", ["a,1"])
    code, _, _ = invoke("plan", "build", "--rates", str(rates), "--q-cap", "1", "--warm-slots", "1")
    assert code == 2


def test_bench_planner_prints_one_json_object() -> None:
    code, out, exc = invoke(
        "bench",
        "planner",
        "--keys",
        "3000",
        "--runs",
        "2",
        "--reference-runs",
        "1",
        "--no-memory",
        "--json",
    )
    assert code == 0, exc
    data = orjson.loads(out)  # exactly one JSON object on stdout
    assert data["keys"] == 3000
    assert data["destinations"] == 30
    assert data["identical"] is True
    assert data["build_ms"] > 0
    assert data["reference_ms"] > 0
    assert data["speedup"] == data["reference_ms"] / data["build_ms"]
    assert data["reference_runs"] == 1


def test_bench_planner_memory_probe_runs_in_a_subprocess() -> None:
    code, out, exc = invoke(
        "bench",
        "planner",
        "--keys",
        "2000",
        "--runs",
        "1",
        "--reference-runs",
        "0",
        "--json",
    )
    assert code == 0, exc
    data = orjson.loads(out)
    assert data["peak_mb"] > 0
    assert data["process_peak_rss_mb"] > data["peak_mb"]
    assert data["identical"] is None


def test_bench_churn_prints_both_strategies() -> None:
    code, out, exc = invoke(
        "bench",
        "churn",
        "--keys",
        "4000",
        "--destinations",
        "8",
        "--warm-slots",
        "150",
        "--intervals",
        "2",
        "--json",
    )
    assert code == 0, exc
    data = orjson.loads(out)
    for name in ("scratch", "hysteresis"):
        for field in (
            "moved_keys_fraction",
            "moved_rate_fraction",
            "max_over_mean",
            "admitted_fraction",
        ):
            assert isinstance(data[name][field], float)
    assert data["hysteresis"]["moved_rate_fraction"] < data["scratch"]["moved_rate_fraction"]
