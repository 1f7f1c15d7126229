"""`cacheroute workload generate`: write a synthetic workload as a replayable JSONL trace."""

from __future__ import annotations

from pathlib import Path

import click
import numpy as np
import orjson
from rich.console import Console
from rich.table import Table

from cacheroute.cli.options import json_option
from cacheroute.replay.sources import write_jsonl
from cacheroute.replay.workloads import KINDS, generate, spec_for

__all__ = ["workload"]


@click.group()
def workload() -> None:
    """Synthetic workloads (paper-like, whale, low-reuse) for replay and evaluation."""


@workload.command("generate")
@click.option("--kind", type=click.Choice(KINDS), default="paper", show_default=True)
@click.option("--keys", default=2000, show_default=True, type=click.IntRange(min=1))
@click.option("--requests", default=60_000, show_default=True, type=click.IntRange(min=2))
@click.option(
    "--rate", type=float, help="Offered load, requests/s [default: 100; conversation: 20]."
)
@click.option("--cv", default=1.0, show_default=True, help="Arrival CV (gamma arrivals if != 1).")
@click.option("--seed", default=0, show_default=True)
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    help="JSONL file (ts,key,prompt_tokens,prefix_tokens,output_tokens,hash_ids); "
    "read it back with --format csv.",
)
@json_option("Print the workload's shape as JSON.")
def generate_cmd(
    kind: str,
    keys: int,
    requests: int,
    rate: float | None,
    cv: float,
    seed: int,
    out: Path | None,
    as_json: bool,
) -> None:
    """Draw a seeded synthetic workload; print its shape and optionally write it."""
    extra = {"arrival": "gamma", "cv": cv} if cv != 1.0 else {}
    spec = spec_for(kind, keys=keys, requests=requests, rate=rate, **extra)  # type: ignore[arg-type]
    reqs = generate(spec, np.random.default_rng(seed))
    stats = reqs.stats() | {"spec": spec.to_dict(), "seed": seed}
    if out is not None:
        write_jsonl(reqs, out)
        stats["out"] = str(out)
    if as_json:
        click.echo(orjson.dumps(stats).decode())
        return
    table = Table(title=f"{kind} workload", title_justify="left", show_header=False)
    for name, value in stats.items():
        if name != "spec":
            table.add_row(name, f"{value:.4g}" if isinstance(value, float) else str(value))
    Console().print(table)
