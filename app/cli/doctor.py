"""`cacheroute doctor`: is the deployment healthy, and if not, what to do (see cacheroute.doctor)."""

from __future__ import annotations

import sys

import click
import orjson
from rich.console import Console
from rich.markup import escape

from cacheroute.cli.options import json_option
from cacheroute.doctor import DoctorOptions, run_doctor
from cacheroute.settings import Settings

__all__ = ["doctor"]

_MARK = {"ok": "[green]ok[/]  ", "warn": "[yellow]warn[/]", "fail": "[red]FAIL[/]"}


@click.command()
@click.option(
    "--streams-group",
    default="cacheroute-streams",
    show_default=True,
    help="Consumer group of the streams agent (its --app-id).",
)
@click.option(
    "--max-plan-age",
    type=click.FloatRange(min=0),
    default=None,
    help="Seconds a plan may be old [default: 3 x the plan's control interval].",
)
@click.option(
    "--max-lag",
    type=click.IntRange(min=0),
    default=100_000,
    show_default=True,
    help="Records of requests the streams group may lag behind.",
)
@click.option(
    "--dlq-window-min",
    type=click.FloatRange(min=0),
    default=None,
    help="Also count dead letters of the last N minutes; more than --max-dlq-recent is a problem.",
)
@click.option("--max-dlq-recent", type=click.IntRange(min=0), default=0, show_default=True)
@click.option(
    "--dlq-scan-max",
    type=click.IntRange(min=0),
    default=10_000,
    show_default=True,
    help="Newest dead letters read per partition to name gateways with skewed clocks.",
)
@click.option("--timeout", default=10.0, show_default=True, help="Seconds per broker request.")
@json_option("Print one JSON object.")
@click.pass_obj
def doctor(
    settings: Settings,
    streams_group: str,
    max_plan_age: float | None,
    max_lag: int,
    dlq_window_min: float | None,
    max_dlq_recent: int,
    dlq_scan_max: int,
    timeout: float,
    as_json: bool,
) -> None:
    """Check broker, topics, plan freshness, streams lag, dead letters and gateway clocks.

    Exit code 0: all good; 1: problems (each with what to do); 2: the broker is unreachable.
    """
    report = run_doctor(
        settings,
        DoctorOptions(
            streams_group=streams_group,
            max_plan_age_s=max_plan_age,
            max_lag=max_lag,
            dlq_window_min=dlq_window_min,
            max_dlq_recent=max_dlq_recent,
            dlq_scan_max=dlq_scan_max,
            timeout_s=timeout,
        ),
    )
    if as_json:
        click.echo(orjson.dumps(report.to_dict(), option=orjson.OPT_INDENT_2))
    else:
        console = Console(highlight=False)
        console.print(f"CacheRoute doctor at {escape(report.bootstrap)}")
        for f in report.findings:
            console.print(f"  {_MARK.get(f.status, f.status)} {f.check:<18} {escape(f.message)}")
            if f.status != "ok" and f.fix:
                console.print(f"         [dim]→ {escape(f.fix)}[/]")
        n = len(report.problems)
        console.print("all good" if n == 0 else f"{n} problem(s)")
    sys.exit(report.exit_code)
