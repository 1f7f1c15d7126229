"""`cacheroute evaluate`: --slo-ms auto (default) or given, and the held-out knee workload."""

from __future__ import annotations

import click
import orjson
import pytest
from click.testing import CliRunner

from cacheroute.cli.evaluate import _slo
from cacheroute.cli.main import cli

ARGS = [
    "evaluate", "--workload", "whale", "--requests", "1500", "--keys", "200", "-R", "4",
    "--policies", "flat-lb,cacheroute", "--quick", "--json", "--seed", "3",
]  # fmt: skip


def test_slo_option_parses_auto_and_milliseconds() -> None:
    assert _slo("auto") == (2000.0, True)
    assert _slo(" AUTO ") == (2000.0, True)
    assert _slo("3000") == (3000.0, False)
    assert _slo(30_000.0) == (30_000.0, False)  # the evidence suite passes a float
    with pytest.raises(click.BadParameter, match="milliseconds or 'auto'"):
        _slo("fast")


def test_evaluate_auto_slo_given_slo_and_held_out_knee() -> None:
    auto = CliRunner().invoke(cli, ARGS)
    assert auto.exit_code == 0, auto.output
    data = orjson.loads(auto.output)
    assert data["cluster"]["slo_auto"] is True
    assert data["cluster"]["slo_ms"] == 2000.0  # whale's idle p99 x 2.5 fits in the default
    assert data["plan"]["knee_held_out"] is True
    assert data["plan"]["q_cap_source"] == (
        "1 x the knee measured on seed 1003 of the same workload (held out)"
    )
    given = CliRunner().invoke(cli, [*ARGS, "--slo-ms", "3000"])
    assert given.exit_code == 0, given.output
    cluster = orjson.loads(given.output)["cluster"]
    assert (cluster["slo_ms"], cluster["slo_auto"], cluster["slo_rule"]) == (3000.0, False, "given")
    assert cluster["slo_idle_p99_ms"] is None
    bad = CliRunner().invoke(cli, [*ARGS, "--slo-ms", "-5"])
    assert bad.exit_code != 0
