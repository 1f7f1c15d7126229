"""`cacheroute topics ensure|describe`: the project's topics with explicit configs."""

from __future__ import annotations

import click
import orjson
from rich.console import Console
from rich.table import Table

from cacheroute.settings import Settings
from cacheroute.topics import TopicOutcome, describe_topic_configs, ensure_topics, make_admin

__all__ = ["render_outcomes", "topics"]


@click.group()
def topics() -> None:
    """Create and inspect requests, rates, plans (compacted) and the dead-letter topic."""


def render_outcomes(outcomes: list[TopicOutcome], console: Console) -> None:
    """A table of what `ensure_topics` did."""
    table = Table(title="CacheRoute topics", title_justify="left")
    for col in ("role", "topic", "partitions", "action", "config"):
        table.add_column(col)
    for o in outcomes:
        cfg = ", ".join(f"{k}={v}" for k, v in o.spec.config.items())
        table.add_row(o.spec.role, o.spec.name, str(o.partitions), o.action, cfg)
    console.print(table)
    for o in outcomes:
        for key, (old, new) in o.changes.items():
            console.print(f"  {o.spec.name}: {key} {old} -> {new}")
        for warning in o.warnings:
            console.print(f"  [yellow]warning:[/] {warning}")


@topics.command()
@click.option("--json", "as_json", is_flag=True, help="Print the outcome as JSON.")
@click.pass_obj
def ensure(settings: Settings, as_json: bool) -> None:
    """Create missing topics; bring configs of existing ones to the settings."""
    outcomes = ensure_topics(settings)
    if as_json:
        click.echo(
            orjson.dumps(
                [
                    {
                        "role": o.spec.role,
                        "topic": o.spec.name,
                        "partitions": o.partitions,
                        "action": o.action,
                        "config": o.spec.config,
                        "changes": {k: list(v) for k, v in o.changes.items()},
                        "warnings": o.warnings,
                    }
                    for o in outcomes
                ],
                option=orjson.OPT_INDENT_2,
            )
        )
    else:
        render_outcomes(outcomes, Console())


@topics.command()
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
@click.pass_obj
def describe(settings: Settings, as_json: bool) -> None:
    """Show partitions and the configs CacheRoute cares about for each topic."""
    from cacheroute.topics import topic_specs  # noqa: PLC0415 - tiny, keeps imports together

    specs = topic_specs(settings)
    admin = make_admin(settings.bootstrap)
    meta = admin.list_topics(timeout=15)
    present = [s for s in specs if s.name in meta.topics]
    configs = describe_topic_configs(admin, [s.name for s in present]) if present else {}
    rows = []
    for s in specs:
        exists = s.name in meta.topics
        rows.append(
            {
                "role": s.role,
                "topic": s.name,
                "exists": exists,
                "partitions": len(meta.topics[s.name].partitions) if exists else None,
                "config": {k: configs.get(s.name, {}).get(k) for k in s.config},
            }
        )
    if as_json:
        click.echo(orjson.dumps(rows, option=orjson.OPT_INDENT_2))
        return
    table = Table(title=f"Topics at {settings.bootstrap}", title_justify="left")
    for col in ("role", "topic", "partitions", "config"):
        table.add_column(col)
    for r in rows:
        cfg = r["config"]
        assert isinstance(cfg, dict)
        table.add_row(
            str(r["role"]),
            str(r["topic"]),
            str(r["partitions"]) if r["exists"] else "[red]missing[/]",
            ", ".join(f"{k}={v}" for k, v in cfg.items()),
        )
    Console().print(table)
