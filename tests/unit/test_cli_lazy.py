"""Commands that need an extra load lazily, and a missing extra is one line naming it.

The base install (a gateway's) has no numba, faust or matplotlib; `.ci/base-install` checks that
for real in a fresh venv. Here a module that imports a missing package stands in for it.
"""

from __future__ import annotations

import sys
import types

import click
import pytest
from click.testing import CliRunner

from cacheroute.cli.lazy import LazyGroup, MissingExtraError, missing_extra


@pytest.fixture
def needs_numba(monkeypatch: pytest.MonkeyPatch) -> str:
    """A module whose import fails as `import numba` fails where numba is not installed."""
    name = "cacheroute_test_needs_numba"

    class Finder:
        def find_spec(self, fullname: str, path: object, target: object = None) -> None:
            if fullname == name:
                raise ModuleNotFoundError("No module named 'numba'", name="numba")

    monkeypatch.setattr(sys, "meta_path", [Finder(), *sys.meta_path])
    monkeypatch.delitem(sys.modules, name, raising=False)
    return name


def _group(lazy: dict[str, tuple[str, str]]) -> click.Group:
    @click.group(cls=LazyGroup, lazy=lazy)
    def cli() -> None:
        """Test group."""

    @cli.command()
    def eager() -> None:
        """Always there."""
        click.echo("eager ran")

    return cli


def test_a_lazy_command_loads_when_run(monkeypatch: pytest.MonkeyPatch) -> None:
    module = types.ModuleType("cacheroute_test_lazy_ok")

    @click.command()
    def hello() -> None:
        """Says hello."""
        click.echo("hello ran")

    module.hello = hello  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "cacheroute_test_lazy_ok", module)
    cli = _group({"hello": ("cacheroute_test_lazy_ok:hello", "eval")})
    res = CliRunner().invoke(cli, ["--help"])
    assert "hello" in res.output
    assert "eager" in res.output
    assert CliRunner().invoke(cli, ["hello"]).output == "hello ran\n"


def test_a_command_whose_extra_is_missing_is_listed_and_says_which_to_install(
    needs_numba: str,
) -> None:
    cli = _group({"evaluate": (f"{needs_numba}:cmd", "eval")})
    listing = CliRunner().invoke(cli, ["--help"])
    assert listing.exit_code == 0, listing.output
    assert "evaluate" in listing.output
    run = CliRunner().invoke(cli, ["evaluate", "--workload", "whale"])
    assert run.exit_code != 0
    assert isinstance(run.exception, MissingExtraError)
    assert str(run.exception) == (
        "this needs numba, which comes with the [eval] extra: "
        "pip install 'cacheroute[eval]' (or 'cacheroute[all]')"
    )
    assert CliRunner().invoke(cli, ["eager"]).output == "eager ran\n"  # the rest still works


def test_only_missing_extras_are_explained() -> None:
    assert missing_extra(ModuleNotFoundError("x", name="faust")) is not None
    explained = missing_extra(ModuleNotFoundError("x", name="faust"))
    assert explained is not None
    assert "[streams]" in str(explained)
    assert missing_extra(ModuleNotFoundError("x", name="numpy")) is None  # a broken install
