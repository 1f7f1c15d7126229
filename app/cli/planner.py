"""`cacheroute planner run`: the planner service (rates in, plan versions out, highly available)."""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
from pathlib import Path
from types import FrameType

import click

from cacheroute.cli.options import q_cap_option, warm_slots_option
from cacheroute.cli.plan import read_destinations
from cacheroute.errors import ConfigError
from cacheroute.kafkaio import check_credentials
from cacheroute.planner.params import DEFAULT_FAIR_SHARE
from cacheroute.planservice.config import CONFIG_KEYS, load_service_config
from cacheroute.settings import Settings

__all__ = ["planner"]


@click.group()
def planner() -> None:
    """The planner service: per-key rates from `rates` -> plan versions on `plans`."""


def _config_help() -> str:
    return "\n".join(f"  {k}: {v}" for k, v in CONFIG_KEYS.items())


@planner.command(
    epilog="Config file keys (TOML, flat; flags override them):\n\n\b\n" + _config_help()
)
@click.option(
    "--config",
    "config_path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="TOML file with the planner settings (keys below).",
)
@click.option("--destinations", "n_destinations", type=click.IntRange(min=1), help="N: d0..dN-1.")
@click.option(
    "--destinations-file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="One destination per line: NAME or NAME,CAPACITY.",
)
@q_cap_option("Capacity knee of one replica of a key (req/s).")
@warm_slots_option()
@click.option("--interval", "interval_s", type=float, help="Control interval, seconds [60].")
@click.option("--tolerance", "imbalance_tolerance", type=float, help="max/mean bound [1.05].")
@click.option("--hysteresis", type=float, help="Admission hysteresis h [0.2].")
@click.option("--admission", type=click.Choice(["rate", "bytes"]), help="Admission order [rate].")
@click.option(
    "--fair-share",
    type=click.FloatRange(min=0),
    help="Split keys above this x the mean destination load; 0: the paper's k_b "
    f"[{DEFAULT_FAIR_SHARE:g}].",
)
@click.option(
    "--group-separator",
    help="Co-locate keys with the same text before the last separator; '': off ['/'].",
)
@click.option("--ewma-alpha", type=float, help="Weight of the newest rate window [0.5].")
@click.option(
    "--work-unit-tokens",
    type=click.IntRange(min=0),
    help="Plan on work: weigh each key by 1 + its uncached prompt tokens / this; 0: plan on "
    "request counts [512].",
)
@click.option("--rewarm-s", type=float, help="Advisor: seconds a moved key runs cold [10].")
@click.option(
    "--max-plan-age",
    "max_plan_age_s",
    type=float,
    help="Republish the live routing when older than this (s); 0: never [2 intervals].",
)
@click.option("--planner-id", help="This instance's name in plan headers [host:pid].")
@click.option("--group", help="Planner group and transactional id base [cacheroute-planner].")
@click.option(
    "--metrics-port",
    type=click.IntRange(min=0, max=65535),
    help="Serve Prometheus metrics on 127.0.0.1:PORT (off by default).",
)
@click.pass_obj
def run(
    settings: Settings,
    config_path: Path | None,
    n_destinations: int | None,
    destinations_file: Path | None,
    q_cap: float | None,
    warm_slots: int | None,
    interval_s: float | None,
    imbalance_tolerance: float | None,
    hysteresis: float | None,
    admission: str | None,
    fair_share: float | None,
    group_separator: str | None,
    ewma_alpha: float | None,
    work_unit_tokens: int | None,
    rewarm_s: float | None,
    max_plan_age_s: float | None,
    planner_id: str | None,
    group: str | None,
    metrics_port: int | None,
) -> None:
    """Run one planner instance; start two or more for high availability.

    Every instance reads all of `rates` and keeps smoothed per-key rates; the one that holds the
    plans partition in the planner group is active: each interval it builds a plan (churn-aware,
    from the live plan), asks the publish advisor, and publishes a new version or logs why not.
    The others are hot standbys; when the active one dies, one of them takes over after the group
    session timeout (6 s) and fences it. Stop with Ctrl-C or SIGTERM (leaves the group at once).
    """
    from prometheus_client import start_http_server  # noqa: PLC0415 - only this command

    from cacheroute.planservice.service import PlannerService  # noqa: PLC0415

    if n_destinations is not None and destinations_file is not None:
        raise click.UsageError("give at most one of --destinations and --destinations-file")
    destinations: object = n_destinations
    if destinations_file is not None:
        destinations = [
            {"name": d.name, "capacity": d.capacity} for d in read_destinations(destinations_file)
        ]
    config = load_service_config(
        config_path,
        {
            "destinations": destinations,
            "q_cap": q_cap,
            "warm_slots": warm_slots,
            "interval_s": interval_s,
            "imbalance_tolerance": imbalance_tolerance,
            "hysteresis": hysteresis,
            "admission": admission,
            "fair_share": fair_share,
            "group_separator": group_separator,
            "ewma_alpha": ewma_alpha,
            "work_unit_tokens": work_unit_tokens,
            "rewarm_s": rewarm_s,
            "max_plan_age_s": max_plan_age_s,
            "planner_id": planner_id,
            "group": group,
            "metrics_port": metrics_port,
        },
    )
    if not config.planner_id:
        import dataclasses  # noqa: PLC0415

        config = dataclasses.replace(config, planner_id=f"{socket.gethostname()}:{os.getpid()}")
    service_log = logging.getLogger("cacheroute.planservice")
    if service_log.getEffectiveLevel() > logging.INFO:
        service_log.setLevel(logging.INFO)  # a service says what it does by default
    check_credentials(settings, doing="starting the planner")  # a wrong password: one line, now
    service = PlannerService(settings, config)
    server = None
    if config.metrics_port is not None:
        try:
            server, _ = start_http_server(
                config.metrics_port, addr=config.metrics_host, registry=service.metrics.registry
            )
        except OSError as exc:
            raise ConfigError(
                f"cannot serve metrics on {config.metrics_host}:{config.metrics_port}: {exc}"
            ) from None
        service_log.warning(
            "metrics on http://%s:%d/metrics", config.metrics_host, server.server_port
        )
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        del frame
        service_log.warning("signal %d: stopping", signum)
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        service.run(stop)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        if server is not None:
            server.shutdown()
            server.server_close()
