"""Every command and group answers --help (users first), and errors come without a traceback."""

from __future__ import annotations

import subprocess
import sys

import click
import pytest
from click.testing import CliRunner

from cacheroute.cli.main import cli


def _all_command_paths(group: click.Group, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    paths = [prefix]
    ctx = click.Context(group)
    for name in group.list_commands(ctx):  # lazy commands too (cacheroute.cli.lazy)
        command = group.get_command(ctx, name)
        assert command is not None, name
        if isinstance(command, click.Group):
            paths.extend(_all_command_paths(command, (*prefix, name)))
        else:
            paths.append((*prefix, name))
    return paths


@pytest.mark.parametrize("path", _all_command_paths(cli), ids=lambda p: " ".join(p) or "cacheroute")
def test_help_everywhere(path: tuple[str, ...]) -> None:
    result = CliRunner().invoke(cli, [*path, "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage:" in result.output
    assert len(result.output.splitlines()) > 3


def test_operational_error_is_one_clear_line() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "cacheroute", "--bootstrap", "nonsense", "kafka", "status"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 1
    assert "is not host:port" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("module", ["cacheroute.demo.gateway", "cacheroute.demo.httpload"])
def test_demo_children_parse_with_click(module: str, capsys: pytest.CaptureFixture[str]) -> None:
    """The demo's child processes take their argv through click, like every other command."""
    main = __import__(module, fromlist=["main"]).main
    assert main(["--help"]) == 0
    assert f"Usage: python -m {module}" in capsys.readouterr().out
    assert main(["--rate", "fast"]) == 2  # a usage error: one line, exit code 2
    err = capsys.readouterr().err
    assert "Error:" in err
    assert "Traceback" not in err


def test_shared_options_validate_alike() -> None:
    """`--q-cap` and `--warm-slots` are one declaration (cacheroute.cli.options): one rule."""
    from cacheroute.cli.demo import DEMO_WARM_SLOTS  # noqa: PLC0415 - the demo command module
    from cacheroute.replay.policy import WARM_SLOTS  # noqa: PLC0415

    assert DEMO_WARM_SLOTS == WARM_SLOTS
    for args in (
        ["plan", "build", "--q-cap", "0", "--warm-slots", "4", "--destinations", "2"],
        ["evaluate", "--workload", "whale", "--q-cap", "-1"],
        ["bench", "planner", "--warm-slots", "-1"],
    ):
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 2, (args, result.output)
        assert "Invalid value for" in result.output
