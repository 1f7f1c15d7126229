"""`cacheroute topics ensure|describe|list|acls`: the project's topics and the ACLs they need."""

from __future__ import annotations

import click
import orjson
from rich.console import Console
from rich.table import Table

from cacheroute.cli.options import json_option
from cacheroute.kafkaacls import ROLES, apply_acls, deployment_acls, kafka_acls_commands
from cacheroute.kafkaio import connect_admin
from cacheroute.settings import Settings
from cacheroute.topics import TopicOutcome, describe_topic_configs, ensure_topics

__all__ = ["render_outcomes", "topics"]

_STREAMS_APP_ID = click.option(
    "--streams-app-id",
    default="cacheroute-streams",
    show_default=True,
    help="The streams agent's --app-id: its consumer group and the prefix of its Faust topics.",
)
_PLANNER_GROUP = click.option(
    "--planner-group",
    default="cacheroute-planner",
    show_default=True,
    help="The planner's group, also the base of its transactional id (topic prefix prepended).",
)
_COMMAND_CONFIG = click.option(
    "--command-config",
    default="admin.properties",
    show_default=True,
    help="The admin's client properties file, as named in the printed kafka-acls commands.",
)


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
@json_option("Print the outcome as JSON.")
@click.option(
    "--print-acls",
    is_flag=True,
    help="Afterwards, print the kafka-acls commands that give each role (gateway, streams, "
    "planner, admin) exactly what it needs on these topics (on stderr with --json).",
)
@click.option(
    "--replication-factor",
    type=click.IntRange(min=1),
    default=None,
    help="Replicas per partition of new topics [default: CACHEROUTE_REPLICATION_FACTOR, else "
    "min(3, brokers)]. Existing topics keep theirs (a warning names the reassignment to run).",
)
@click.option(
    "--min-insync-replicas",
    type=click.IntRange(min=1),
    default=None,
    help="min.insync.replicas of the topics [default: CACHEROUTE_MIN_INSYNC_REPLICAS, else 2 "
    "with 3 or more replicas, 1 below]. At most the replication factor; below 2 with 3 or more "
    "replicas is refused (plans must never run with fewer than 2 in sync).",
)
@_STREAMS_APP_ID
@_PLANNER_GROUP
@_COMMAND_CONFIG
@click.pass_obj
def ensure(
    settings: Settings,
    as_json: bool,
    print_acls: bool,
    replication_factor: int | None,
    min_insync_replicas: int | None,
    streams_app_id: str,
    planner_group: str,
    command_config: str,
) -> None:
    """Create missing topics; bring configs of existing ones to the settings."""
    # validated like the environment variables (Settings.validate), the rest by replication_for
    settings = settings.with_overrides(
        replication_factor=replication_factor, min_insync_replicas=min_insync_replicas
    )
    outcomes = ensure_topics(settings)
    if print_acls:
        rules = deployment_acls(
            settings, streams_app_id=streams_app_id, planner_group=planner_group
        )
        lines = kafka_acls_commands(
            rules, bootstrap=settings.bootstrap, command_config=command_config
        )
        click.echo("\n".join(lines), err=as_json)
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
@json_option("Print as JSON.")
@click.pass_obj
def describe(settings: Settings, as_json: bool) -> None:
    """Show partitions and the configs CacheRoute cares about for each topic."""
    from cacheroute.topics import cluster_size, topic_specs  # noqa: PLC0415 - keeps imports together

    admin = connect_admin(settings, doing="describing topics")
    meta = admin.list_topics(timeout=15)
    specs = topic_specs(settings, cluster_size(meta))
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
                "replication_factor": min(
                    (len(p.replicas) for p in meta.topics[s.name].partitions.values()), default=0
                )
                if exists
                else None,
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


@topics.command(name="list")
@json_option("Print a JSON list.")
@click.pass_obj
def list_cmd(settings: Settings, as_json: bool) -> None:
    """List the topics this principal may see (Kafka hides the others), with partition counts."""
    admin = connect_admin(settings, doing="listing topics")
    meta = admin.list_topics(timeout=15)
    rows = sorted(
        (name, len(t.partitions)) for name, t in meta.topics.items() if not name.startswith("__")
    )
    if as_json:
        click.echo(orjson.dumps([{"topic": n, "partitions": p} for n, p in rows]))
        return
    for name, parts in rows:
        click.echo(f"{name}\t{parts}")


@topics.command()
@click.option(
    "--apply",
    "do_apply",
    is_flag=True,
    help="Create the ACLs on the cluster (run with a principal allowed to alter ACLs).",
)
@click.option(
    "--principal",
    "principals",
    multiple=True,
    metavar="ROLE=PRINCIPAL",
    help=f"Map a role ({', '.join(ROLES)}) to its principal, e.g. gateway=User:gw-eu1 "
    "[default: User:<role>]. Repeatable.",
)
@_STREAMS_APP_ID
@_PLANNER_GROUP
@_COMMAND_CONFIG
@json_option("Print the rules as JSON.")
@click.pass_obj
def acls(
    settings: Settings,
    do_apply: bool,
    principals: tuple[str, ...],
    streams_app_id: str,
    planner_group: str,
    command_config: str,
    as_json: bool,
) -> None:
    """The ACLs a deployment needs: least privilege per role, for the current topic names.

    Prints `kafka-acls.sh --add` commands (or JSON); --apply creates them directly.
    """
    mapping: dict[str, str] = {}
    for item in principals:
        role, sep, principal = item.partition("=")
        if not sep or role not in ROLES or not principal.strip():
            raise click.BadParameter(
                f"{item!r} is not ROLE=PRINCIPAL with ROLE one of {', '.join(ROLES)}",
                param_hint="--principal",
            )
        mapping[role] = principal.strip()
    rules = deployment_acls(
        settings, principals=mapping, streams_app_id=streams_app_id, planner_group=planner_group
    )
    if as_json:
        click.echo(
            orjson.dumps(
                [
                    {
                        "role": r.role,
                        "principal": r.principal,
                        "resource": r.resource,
                        "name": r.name,
                        "pattern": r.pattern,
                        "operation": r.operation,
                    }
                    for r in rules
                ],
                option=orjson.OPT_INDENT_2,
            )
        )
    else:
        lines = kafka_acls_commands(
            rules, bootstrap=settings.bootstrap, command_config=command_config
        )
        click.echo("\n".join(lines))
    if do_apply:
        n = apply_acls(settings, rules)
        click.echo(f"created {n} ACL entries at {settings.bootstrap}", err=True)
