"""Commands whose modules load on first use, and one-line errors for extras that are missing.

`pip install cacheroute` is what a gateway needs (routing, plan following, the emitter, the HTTP
proxy); the streams worker, the planner's compiled loops and the evaluator come with extras
(`[streams]`, `[planner]`, `[eval]`, `[all]`). The CLI must still start, list every command and
answer `--help` without them, so the commands whose modules import an extra at import time load
lazily here, and a command that needs a missing extra says which one to install.
"""

from __future__ import annotations

import importlib
from typing import Any

import click

from cacheroute.errors import CacheRouteError

__all__ = ["EXTRA_OF", "LazyGroup", "MissingExtraError", "missing_extra"]

EXTRA_OF = {
    "faust": "streams",
    "mode": "streams",
    "aiokafka": "streams",
    "numba": "planner",
    "llvmlite": "planner",
    "matplotlib": "eval",
}
"""Top-level module -> the extra that installs it."""


class MissingExtraError(CacheRouteError):
    """A command needs a package of an extra that is not installed."""


def missing_extra(exc: ImportError, extra: str | None = None) -> MissingExtraError | None:
    """The one-line error for an import that failed because an extra is missing (else None).

    `extra`: the extra the failing command needs as a whole (else the one of the missing module).
    """
    name = (getattr(exc, "name", None) or "").split(".")[0]
    if name not in EXTRA_OF:
        return None
    extra = extra or EXTRA_OF[name]
    return MissingExtraError(
        f"this needs {name}, which comes with the [{extra}] extra: "
        f"pip install 'cacheroute[{extra}]' (or 'cacheroute[all]')"
    )


class LazyGroup(click.Group):
    """A group some of whose commands are imported only when listed or run.

    `lazy` maps a command name to ("module:attribute", the extra it needs). A command whose module
    cannot be imported for want of an extra is listed with a help text saying so, and running it
    prints that line.
    """

    def __init__(
        self, *args: Any, lazy: dict[str, tuple[str, str]] | None = None, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.lazy = dict(lazy or {})

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        entry = self.lazy.get(cmd_name)
        if entry is None:
            return super().get_command(ctx, cmd_name)
        where, extra = entry
        module, _, attr = where.partition(":")
        try:
            command = getattr(importlib.import_module(module), attr)
        except ImportError as exc:
            error = missing_extra(exc, extra)
            if error is None:
                raise
            return _unavailable(cmd_name, error)
        if not isinstance(command, click.Command):
            raise TypeError(f"{where} is not a click command")
        return command


def _unavailable(name: str, error: MissingExtraError) -> click.Command:
    def run() -> None:
        raise error

    return click.Command(
        name,
        callback=run,
        help=f"(not installed) {error}",
        short_help=f"(needs an extra) {str(error).split(': ', 1)[-1]}",
        context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
    )
