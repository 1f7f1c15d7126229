"""`cacheroute plan build|show|diff`: build a plan offline, or inspect the versions on `plans`.

The planner itself is pure; this is the shell around it: `build` reads the CSV and the previous
plan, reads the clock for `created_ms`, turns planner errors into one clear CLI error, and prints.
`show` and `diff` read the plans topic like a follower does (read_committed, complete and
checksummed versions only) and print what a version routes where.
"""

from __future__ import annotations

import csv
import math
import time
from pathlib import Path
from typing import TYPE_CHECKING

import click
import numpy as np
import orjson
from rich.console import Console
from rich.table import Table

from cacheroute.cli.options import json_option, q_cap_option, warm_slots_option
from cacheroute.errors import CacheRouteError
from cacheroute.planner import (
    Destination,
    Plan,
    PlanDiff,
    PlannerError,
    PlannerParams,
    advise,
    build_plan,
    plan_diff,
    plan_from_dict,
    plan_to_dict,
)
from cacheroute.planner.params import DEFAULT_FAIR_SHARE
from cacheroute.settings import Settings

if TYPE_CHECKING:
    from cacheroute.dispatcher.reader import LivePlan, PlanHistory

__all__ = ["plan", "read_destinations", "read_plan", "read_rates_csv"]

_TIMEOUT_HELP = "Seconds to read the plans topic to its end."


@click.group()
def plan() -> None:
    """Build routing plans offline (no Kafka), or show and compare the versions on `plans`."""


def read_rates_csv(path: Path) -> tuple[list[str], list[float], list[float] | None]:
    """Keys, rates and (if the column is there) prefix tokens from `key,rate[,prefix_tokens]`.

    Every row is kept: a value that is not a number is an error naming the line and key; NaN,
    negative or duplicate values reach the planner, which rejects them naming the key.
    """
    keys: list[str] = []
    rates: list[float] = []
    tokens: list[float] = []
    with path.open(newline="", encoding="utf-8") as fh:
        reader = csv.reader(fh)
        header = [h.strip() for h in next(reader, [])]
        if header not in (["key", "rate"], ["key", "rate", "prefix_tokens"]):
            raise CacheRouteError(
                f"{path}: the header must be key,rate or key,rate,prefix_tokens (got {header})"
            )
        width = len(header)
        for row in reader:
            line = reader.line_num
            if not row or (len(row) == 1 and not row[0].strip()):
                continue
            if len(row) != width:
                raise CacheRouteError(f"{path}:{line}: expected {width} columns, got {len(row)}")
            key = row[0].strip()
            keys.append(key)
            rates.append(_number(path, line, key, "rate", row[1]))
            if width == 3:
                tokens.append(_number(path, line, key, "prefix_tokens", row[2]))
    return keys, rates, (tokens if width == 3 else None)


def _number(path: Path, line: int, key: str, what: str, raw: str) -> float:
    try:
        return float(raw)
    except ValueError:
        raise CacheRouteError(
            f"{path}:{line}: {what} {raw.strip()!r} of key {key!r} is not a number"
        ) from None


def read_destinations(path: Path) -> list[Destination]:
    """Destinations from a file: one per line, `NAME` or `NAME,CAPACITY`; `#` starts a comment."""
    out: list[Destination] = []
    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        name, _, cap = (part.strip() for part in line.partition(","))
        try:
            capacity = float(cap) if cap else 1.0
        except ValueError:
            raise CacheRouteError(f"{path}:{number}: capacity {cap!r} is not a number") from None
        out.append(Destination(name, capacity))
    if not out:
        raise CacheRouteError(f"{path}: no destinations in the file")
    return out


def read_plan(path: Path) -> Plan:
    """A plan written by `plan build --json` or `--out`."""
    try:
        return plan_from_dict(orjson.loads(path.read_bytes()))
    except orjson.JSONDecodeError as exc:
        raise CacheRouteError(f"{path}: not JSON: {exc}") from None
    except PlannerError as exc:
        raise CacheRouteError(f"{path}: {exc}") from None
    except OSError as exc:
        raise CacheRouteError(f"cannot read {path}: {exc}") from None


@plan.command("build")
@click.option(
    "--rates",
    "rates_path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    required=True,
    help="CSV with header key,rate[,prefix_tokens] (rate in requests/s).",
)
@click.option(
    "--prev",
    "prev_path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="The live plan (JSON from --json or --out): re-plan from it, moving few keys.",
)
@click.option(
    "--destinations",
    "n_destinations",
    type=click.IntRange(min=1),
    help="Number of destinations, named d0 .. d{N-1} in index order.",
)
@click.option(
    "--destinations-file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="One destination per line: NAME or NAME,CAPACITY (relative weight).",
)
@q_cap_option("Capacity knee of one replica (req/s).", required=True)
@warm_slots_option(required=True)
@click.option(
    "--admission",
    type=click.Choice(["rate", "bytes"]),
    default="rate",
    show_default=True,
    help="Admission order: rate (the paper), or rate x prefix tokens per slot.",
)
@click.option(
    "--hysteresis",
    type=float,
    default=0.2,
    show_default=True,
    help="With --prev: admitted keys stay until rate < (1 - h) x cut-off.",
)
@click.option(
    "--tolerance",
    type=float,
    default=1.05,
    show_default=True,
    help="With --prev: move keys until max/mean expected load <= this.",
)
@click.option(
    "--fair-share",
    type=click.FloatRange(min=0),
    default=DEFAULT_FAIR_SHARE,
    show_default=True,
    help="Split keys above this x the mean destination load; 0: the paper's k_b rule.",
)
@click.option(
    "--group-separator",
    default="/",
    show_default=True,
    help="Co-locate keys with the same text before the last separator; '': plain LPT.",
)
@click.option("--plan-version", type=click.IntRange(min=0), help="[default: prev + 1, or 1]")
@click.option(
    "--out", type=click.Path(dir_okay=False, path_type=Path), help="Also write the plan JSON here."
)
@json_option("Print the plan as one JSON object.")
@click.pass_obj
def build(
    settings: Settings,
    *,
    rates_path: Path,
    prev_path: Path | None,
    n_destinations: int | None,
    destinations_file: Path | None,
    q_cap: float,
    warm_slots: int,
    admission: str,
    hysteresis: float,
    tolerance: float,
    fair_share: float,
    group_separator: str,
    plan_version: int | None,
    out: Path | None,
    as_json: bool,
) -> None:
    """Build a plan (Algorithm 1; churn-aware when --prev is given) and print it."""
    del settings  # offline: no broker settings needed
    if (n_destinations is None) == (destinations_file is None):
        raise click.UsageError("give exactly one of --destinations N and --destinations-file F")
    destinations: list[str] | list[Destination]
    if n_destinations is not None:
        destinations = [f"d{i}" for i in range(n_destinations)]
    else:
        assert destinations_file is not None  # exactly one of the two, checked above
        destinations = read_destinations(destinations_file)
    keys, rates, tokens = read_rates_csv(rates_path)
    prev = read_plan(prev_path) if prev_path is not None else None
    try:
        params = PlannerParams(
            q_cap=q_cap,
            warm_slots=warm_slots,
            imbalance_tolerance=tolerance,
            hysteresis=hysteresis,
            admission="bytes" if admission == "bytes" else "rate",
            fair_share=fair_share or None,
            group_separator=group_separator or None,
        )
        new = build_plan(
            keys,
            rates,
            destinations,
            params,
            prev=prev,
            prefix_tokens=tokens,
            version=plan_version,
            created_ms=time.time_ns() // 1_000_000,
        )
        new.validate()
    except PlannerError as exc:
        raise CacheRouteError(str(exc)) from None
    diff = plan_diff(prev, new) if prev is not None else None
    data = plan_to_dict(new)
    data["summary"] = new.to_summary()
    advice = None
    if prev is not None and diff is not None:
        data["diff"] = diff.to_dict()
        advice = advise(
            prev,
            new,
            keys,
            np.asarray(rates, dtype=np.float64),
            prefix_tokens=None if tokens is None else np.asarray(tokens, dtype=np.float64),
        )
        data["advice"] = advice.to_dict()
    if out is not None:
        out.write_bytes(orjson.dumps(data))
    if as_json:
        click.echo(orjson.dumps(data))
        return
    _render(new, diff, Console())
    if advice is not None:
        verdict = "publish" if advice.publish else "keep the live plan"
        click.echo(f"advice: {verdict} ({'; '.join(advice.reasons)})")
    if out is not None:
        click.echo(f"plan written to {out}")


def _render(new: Plan, diff: PlanDiff | None, console: Console) -> None:
    summary = new.to_summary()
    table = Table(title=f"Plan v{new.version}", title_justify="left", show_header=False)
    for name, value in summary.items():
        shown = f"{value:.6g}" if isinstance(value, float) and math.isfinite(value) else str(value)
        table.add_row(name, shown)
    if diff is not None:
        for name, value in diff.to_dict().items():
            shown = f"{value:.4g}" if isinstance(value, float) else str(value)
            table.add_row(f"vs prev: {name}", shown)
    console.print(table)
    loads = Table(title="Expected load per destination", title_justify="left")
    for col in ("destination", "capacity", "load (req/s)", "admitted keys"):
        loads.add_column(col, justify="right" if col != "destination" else "left")
    counts = [0] * len(new.destinations)
    for d in new.targets.tolist():
        counts[d] += 1
    for i, dest in enumerate(new.destinations):
        loads.add_row(dest.name, f"{dest.capacity:g}", f"{new.loads[i]:.6g}", str(counts[i]))
    console.print(loads)


# ------------------------------------------------------------------------ the plans topic
def _history(settings: Settings, wanted: set[int], timeout: float) -> PlanHistory:
    from cacheroute.dispatcher.reader import read_plan_history  # noqa: PLC0415 - Kafka client
    from cacheroute.kafkaio import connect_admin  # noqa: PLC0415 - Kafka client

    # a broker that is down or refuses us is one line naming the cause within seconds, not a
    # metadata error after the whole read timeout
    connect_admin(settings, timeout=min(10.0, timeout), doing="reading plans")
    return read_plan_history(
        settings, keep=wanted.__contains__, timeout=timeout, now_ms=time.time_ns() // 1_000_000
    )


def _version_of(history: PlanHistory, version: int | None, topic: str) -> LivePlan:
    if history.live is None:
        raise CacheRouteError(
            f"no complete plan version on {topic} ({history.records} records read); is the "
            "planner running (`cacheroute planner run`)?"
        )
    if version is None:
        return history.live
    found = history.versions.get(version)
    if found is None:
        available = ", ".join(str(v) for v in history.applied) or "none"
        raise CacheRouteError(
            f"version {version} is not on {topic} (found: {available}; compaction keeps only the "
            "newest version)"
        )
    return found


@plan.command("show")
@click.option(
    "--version", "plan_version", type=click.IntRange(min=0), help="[default: the live one]"
)
@click.option("--key", help="Also show where this key goes.")
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write the whole plan as JSON (readable by `plan build --prev` and `plan diff`).",
)
@click.option("--timeout", default=60.0, show_default=True, help=_TIMEOUT_HELP)
@json_option("Print one JSON object.")
@click.pass_obj
def show(
    settings: Settings,
    plan_version: int | None,
    key: str | None,
    out: Path | None,
    timeout: float,
    as_json: bool,
) -> None:
    """Show a plan version from the plans topic: keys, replicas, expected load, imbalance."""
    from cacheroute.planservice.report import (  # noqa: PLC0415 - Kafka client behind it
        key_report,
        plan_report,
        render_plan_report,
    )

    topic = settings.topics["plans"]
    history = _history(settings, {plan_version} if plan_version is not None else set(), timeout)
    live = _version_of(history, plan_version, topic)
    data = plan_report(live, now_ms=time.time_ns() // 1_000_000)
    data["live_version"] = history.live.version if history.live is not None else None
    data["versions_on_topic"] = list(history.applied)
    data["rejected_versions"] = [
        {"version": r.version, "reason": r.reason, "where": r.where} for r in history.rejected
    ]
    if key is not None:
        data["key"] = key_report(live, key)
    if out is not None:
        out.write_bytes(orjson.dumps(plan_to_dict(live.plan)))
    if as_json:
        click.echo(orjson.dumps(data))
        return
    render_plan_report(data, topic, Console())
    if out is not None:
        click.echo(f"plan written to {out}")


def _resolve(arg: str, history: PlanHistory | None, topic: str) -> Plan:
    path = Path(arg)
    if path.is_file():
        return read_plan(path)
    assert history is not None
    if arg == "live":
        return _version_of(history, None, topic).plan
    return _version_of(history, int(arg), topic).plan


@plan.command("diff")
@click.argument("a")
@click.argument("b")
@click.option("--timeout", default=60.0, show_default=True, help=_TIMEOUT_HELP)
@json_option("Print one JSON object.")
@click.pass_obj
def diff(settings: Settings, a: str, b: str, timeout: float, as_json: bool) -> None:
    """Compare plan A with plan B: moved keys and rate, added/removed keys, loads.

    A and B are versions on the plans topic, `live`, or plan JSON files (`plan show --out`,
    `plan build --out`). Older versions stay on the topic only until compaction removes them.
    """
    from cacheroute.planservice.report import (  # noqa: PLC0415 - Kafka client behind it
        diff_report,
        render_diff_report,
    )

    topic = settings.topics["plans"]
    for arg in (a, b):
        if not Path(arg).is_file() and arg != "live" and not arg.isdigit():
            raise click.BadParameter(f"{arg!r} is neither a version, `live`, nor a plan file")
    wanted = {int(x) for x in (a, b) if x.isdigit() and not Path(x).is_file()}
    needs_topic = any(not Path(x).is_file() for x in (a, b))
    history = _history(settings, wanted, timeout) if needs_topic else None
    data = diff_report(_resolve(a, history, topic), _resolve(b, history, topic))
    if as_json:
        click.echo(orjson.dumps(data))
        return
    render_diff_report(data, Console())
