"""Options several commands share, declared once: the same flag, type, validation and help stem.

Where a default differs between commands it is because the commands model different things
(`bench plan` builds the paper's 128k-key plan with W = 2048; `evaluate` and `demo` plan a
2,000-key workload with W = 64; `plan build` and `planner run` take W from the user or the
planner config), so the default is the caller's argument, while the option itself is one.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import TypeVar

import click

__all__ = ["json_option", "q_cap_option", "time_ms", "warm_slots_option"]

F = TypeVar("F", bound=Callable[..., object])

JSON_HELP = "Print exactly one JSON object on stdout."


def json_option(help: str = JSON_HELP) -> Callable[[F], F]:
    """`--json` (parameter `as_json`): machine output instead of the rich view."""
    return click.option("--json", "as_json", is_flag=True, help=help)


def q_cap_option(
    help: str,
    *,
    default: float | None = None,
    required: bool = False,
) -> Callable[[F], F]:
    """`--q-cap`: the capacity knee of one replica of a key, requests/s (> 0)."""
    return click.option(
        "--q-cap",
        type=click.FloatRange(min=0, min_open=True),
        default=default,
        required=required,
        show_default=default is not None,
        help=help,
    )


def warm_slots_option(
    help: str = "W: warm slots per destination (C = R x W).",
    *,
    default: int | None = None,
    required: bool = False,
) -> Callable[[F], F]:
    """`--warm-slots`: W, keys planned per destination (>= 0)."""
    return click.option(
        "--warm-slots",
        type=click.IntRange(min=0),
        default=default,
        required=required,
        show_default=default is not None,
        help=help,
    )


def time_ms(text: str) -> int:
    """Epoch milliseconds from an integer or an ISO-8601 time (local time if no zone), for
    options such as `--from-time`."""
    if text.isdigit():
        return int(text)
    try:
        return int(datetime.fromisoformat(text).timestamp() * 1000)
    except ValueError:
        raise click.BadParameter(f"not epoch ms or ISO-8601: {text!r}") from None
