"""Configuration of `cacheroute planner run`: one frozen dataclass, from a TOML file and flags.

Kafka addresses and topic names stay in `Settings` (shared by every process); this holds what only
the planner service needs: the cluster it plans for (destinations, q_cap, W), the control loop
(interval, smoothing, advisor), the wire (chunk size) and high availability (group, timeouts).

The file is TOML (stdlib `tomllib`), flat keys, for example:

    q_cap = 8.0
    warm_slots = 2048
    interval_s = 60
    destinations = 30                  # d0..d29; or ["a", "b"]; or [[destinations]] tables
    ewma_alpha = 0.5

Unknown keys are an error (a typo must not silently fall back to a default). Flags override the
file; `load_service_config` validates everything once, naming the key to fix.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cacheroute.errors import ConfigError
from cacheroute.planner import Destination, PlannerError, PlannerParams
from cacheroute.planner.advisor import DEFAULT_REWARM_S
from cacheroute.planner.inputs import normalize_destinations
from cacheroute.planner.params import DEFAULT_FAIR_SHARE
from cacheroute.planner.protocol import DEFAULT_MAX_CHUNK_BYTES, HARD_MAX_CHUNK_BYTES
from cacheroute.planner.smoothing import SmoothingParams
from cacheroute.planner.work import DEFAULT_WORK_UNIT_TOKENS
from cacheroute.schemas import MAX_PROMPT_TOKENS

__all__ = ["CONFIG_KEYS", "PlannerServiceConfig", "load_service_config", "parse_destinations"]


@dataclass(frozen=True)
class PlannerServiceConfig:
    """Everything `planner run` needs besides `Settings` (see the module docstring)."""

    destinations: tuple[Destination, ...]
    params: PlannerParams
    """Algorithm-1 and re-planning parameters; `params.control_interval_s` is the tick."""
    smoothing: SmoothingParams = field(default_factory=SmoothingParams)
    work_unit_tokens: int | None = DEFAULT_WORK_UNIT_TOKENS
    """Plan on work: each key's rate weighted by its mean request cost, 1 + uncached prompt tokens
    / this (`planner.work`, the unit the gateways' Router charges). None: on request counts."""
    rewarm_s: float = DEFAULT_REWARM_S
    """Publish advisor: seconds a moved key is assumed to run cold at its new home."""
    max_plan_age_s: float | None = None
    """Republish the live plan's routing under a new version when it is older than this, so
    followers can tell a quiet planner from a dead one by the plan's age. None: 2 intervals (must
    stay below the dispatcher's staleness limit, 3 intervals, or gateways fall back to P2C while
    the planner merely keeps its plan);
    0: never."""
    max_chunk_bytes: int = DEFAULT_MAX_CHUNK_BYTES
    rates_lookback_s: float | None = None
    """How far back in `rates` a starting planner reads. None: 3 intervals."""
    group: str = "cacheroute-planner"
    """Consumer group of the planner instances (leadership) and base of the transactional id."""
    planner_id: str = ""
    """This instance's name in plan headers and logs."""
    session_timeout_ms: int = 6_000
    """Group session timeout: how long a killed active planner goes unnoticed (broker min: 6 s)."""
    transaction_timeout_ms: int = 60_000
    """An active planner killed mid-publish blocks read_committed followers at most this long when
    no other planner takes over (a takeover or restart aborts the transaction at once)."""
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"

    @property
    def interval_s(self) -> float:
        """The control interval (seconds between plans)."""
        return self.params.control_interval_s

    @property
    def plan_max_age_s(self) -> float:
        """`max_plan_age_s` with its default applied (0: no refresh)."""
        return 2 * self.interval_s if self.max_plan_age_s is None else self.max_plan_age_s

    @property
    def lookback_s(self) -> float:
        """`rates_lookback_s` with its default applied."""
        return 3 * self.interval_s if self.rates_lookback_s is None else self.rates_lookback_s

    def transactional_id(self, topic_prefix: str) -> str:
        """Shared by all instances of the group, so a new active one fences the old (zombie) one."""
        return f"{topic_prefix}{self.group}"

    def group_id(self, topic_prefix: str) -> str:
        """The leadership group (topic prefix included, so test runs do not share a group)."""
        return f"{topic_prefix}{self.group}"


DEFAULT_GROUP_SEPARATOR = "/"
"""Deployed default: `tenant/conversation` keys of one tenant are co-located."""


def _separator(raw: object, source: str) -> str | None:
    if not isinstance(raw, str):
        raise ConfigError(f"planner setting 'group_separator' must be a string{source}")
    return raw or None


CONFIG_KEYS: dict[str, str] = {
    "destinations": "int (d0..dN-1), list of names, or [[destinations]] with name and capacity",
    "q_cap": "capacity knee of one replica of a key, requests/s (required)",
    "warm_slots": "W, warm slots per destination (required)",
    "interval_s": "control interval, seconds (default 60)",
    "imbalance_tolerance": "max/mean expected load re-planning aims for (default 1.05)",
    "hysteresis": "admission hysteresis h in [0, 1) (default 0.2)",
    "admission": "'rate' or 'bytes' (default rate)",
    "fair_share": "split keys above this x the mean destination load; 0: the paper's k_b "
    f"(default {DEFAULT_FAIR_SHARE:g})",
    "group_separator": "co-locate keys with the same text before the last one; '': off (default '/')",
    "work_unit_tokens": "plan on work: weigh keys by 1 + uncached prompt tokens / this; 0: on "
    "request counts (default 512)",
    "max_prompt_tokens": "ignore a rate record whose mean prompt is above this (default 4e6)",
    "ewma_alpha": "weight of the newest window in the per-key EWMA (default 0.5)",
    "settle_s": "quiet time before a window that every partition reported folds (default 2)",
    "max_wait_s": "a window folds this long after its first record regardless (default 30)",
    "forget_after_windows": "forget a key absent this many windows in a row (default 10)",
    "max_ahead_s": "ignore a rate window ending this far after its record's timestamp (default 30)",
    "max_key_rate": "ignore a key rate above this, requests/s (default 1e6)",
    "max_surge": "clamp a key's window rate to this x the cluster's smoothed total (default 100)",
    "max_total_growth": "cut a window's total rate to this x the smoothed total (default 10)",
    "total_floor": "the smoothed total counts as at least this for max_total_growth (default 100)",
    "rewarm_s": f"advisor: seconds a moved key runs cold (default {DEFAULT_REWARM_S:g})",
    "max_plan_age_s": "republish the live routing when older than this; 0: never (default 2 x interval)",
    "max_chunk_bytes": f"upper bound of one chunk record (default {DEFAULT_MAX_CHUNK_BYTES})",
    "rates_lookback_s": "how far back a starting planner reads rates (default 3 x interval)",
    "group": "planner consumer group / transactional id base (default cacheroute-planner)",
    "planner_id": "this instance's name in plan headers (default host:pid)",
    "session_timeout_ms": "leadership session timeout (default 6000)",
    "transaction_timeout_ms": "Kafka transaction timeout (default 60000)",
    "metrics_port": "Prometheus port on metrics_host (default: off)",
    "metrics_host": "address of the metrics endpoint (default 127.0.0.1)",
}
"""Keys a config file may set, with what they mean (shown by `planner run --help`)."""


def parse_destinations(value: object, *, where: str = "destinations") -> tuple[Destination, ...]:
    """`N` (d0..dN-1), a list of names, or a list of {name, capacity} tables."""
    if isinstance(value, bool):
        raise ConfigError(f"{where}: give a count, a list of names or tables, not {value!r}")
    if isinstance(value, int):
        if value < 1:
            raise ConfigError(f"{where}: need at least one destination, got {value}")
        return tuple(Destination(f"d{i}") for i in range(value))
    if not isinstance(value, list) or not value:
        raise ConfigError(f"{where}: give a count, a list of names or a list of tables")
    out: list[Destination] = []
    for i, item in enumerate(value):
        if isinstance(item, str):
            out.append(Destination(item))
        elif isinstance(item, dict) and isinstance(item.get("name"), str):
            extra = set(item) - {"name", "capacity"}
            if extra:
                raise ConfigError(f"{where}[{i}]: unknown keys {sorted(extra)}")
            cap = item.get("capacity", 1.0)
            if isinstance(cap, bool) or not isinstance(cap, int | float):
                raise ConfigError(f"{where}[{i}]: capacity {cap!r} is not a number")
            out.append(Destination(item["name"], float(cap)))
        else:
            raise ConfigError(f"{where}[{i}]: {item!r} is neither a name nor a {{name, capacity}}")
    return tuple(out)


def _read_file(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as fh:
            data = tomllib.load(fh)
    except OSError as exc:
        raise ConfigError(f"cannot read planner config {path}: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    unknown = sorted(set(data) - set(CONFIG_KEYS))
    if unknown:
        raise ConfigError(
            f"{path}: unknown keys {', '.join(unknown)} (known: {', '.join(CONFIG_KEYS)})"
        )
    return data


def load_service_config(
    path: Path | None = None, overrides: Mapping[str, Any] | None = None
) -> PlannerServiceConfig:
    """Defaults < the TOML file < `overrides` (flags; None values are ignored). Validated."""
    values: dict[str, Any] = _read_file(path) if path is not None else {}
    values.update({k: v for k, v in (overrides or {}).items() if v is not None})
    unknown = sorted(set(values) - set(CONFIG_KEYS))
    if unknown:
        raise ConfigError(f"unknown planner settings: {', '.join(unknown)}")
    source = f" (in {path})" if path is not None else ""
    for required in ("destinations", "q_cap", "warm_slots"):
        if required not in values:
            raise ConfigError(
                f"planner setting {required!r} is missing{source}: set it in the config file "
                f"or with --{required.replace('_', '-')}"
            )

    def number(name: str, default: float) -> float:
        raw = values.get(name, default)
        if isinstance(raw, bool) or not isinstance(raw, int | float) or not math.isfinite(raw):
            raise ConfigError(f"planner setting {name!r} must be a number, got {raw!r}{source}")
        return float(raw)

    def integer(name: str, default: int) -> int:
        raw = values.get(name, default)
        if isinstance(raw, bool) or not isinstance(raw, int):
            raise ConfigError(f"planner setting {name!r} must be an integer, got {raw!r}{source}")
        return raw

    try:
        params = PlannerParams(
            q_cap=number("q_cap", 0.0),
            warm_slots=integer("warm_slots", 0),
            control_interval_s=number("interval_s", 60.0),
            imbalance_tolerance=number("imbalance_tolerance", 1.05),
            hysteresis=number("hysteresis", 0.2),
            admission="bytes" if values.get("admission", "rate") == "bytes" else "rate",
            fair_share=number("fair_share", DEFAULT_FAIR_SHARE) or None,
            group_separator=_separator(
                values.get("group_separator", DEFAULT_GROUP_SEPARATOR), source
            ),
        )
        if values.get("admission", "rate") not in ("rate", "bytes"):
            raise ConfigError(f"planner setting 'admission' must be rate or bytes{source}")
        smoothing = SmoothingParams(
            alpha=number("ewma_alpha", 0.5),
            settle_ms=round(number("settle_s", 2.0) * 1000),
            max_wait_ms=round(number("max_wait_s", 30.0) * 1000),
            forget_after_windows=integer("forget_after_windows", 10),
            max_ahead_ms=round(number("max_ahead_s", 30.0) * 1000),
            max_key_rate=number("max_key_rate", 1_000_000.0),
            max_surge=number("max_surge", 100.0),
            max_total_growth=number("max_total_growth", 10.0),
            total_floor=number("total_floor", 100.0),
            max_prompt_tokens=integer("max_prompt_tokens", MAX_PROMPT_TOKENS),
        )
    except PlannerError as exc:
        raise ConfigError(f"planner settings{source}: {exc}") from None
    try:
        destinations = normalize_destinations(parse_destinations(values["destinations"]))
    except PlannerError as exc:
        raise ConfigError(f"planner destinations{source}: {exc}") from None
    max_chunk = integer("max_chunk_bytes", DEFAULT_MAX_CHUNK_BYTES)
    if not 1024 <= max_chunk <= HARD_MAX_CHUNK_BYTES:
        raise ConfigError(f"max_chunk_bytes must be in [1024, {HARD_MAX_CHUNK_BYTES}]{source}")
    for name in ("rewarm_s", "max_plan_age_s", "rates_lookback_s"):
        if name in values and number(name, 0.0) < 0:
            raise ConfigError(f"planner setting {name!r} must be >= 0{source}")
    if (
        integer("session_timeout_ms", 6000) < 1000
        or integer("transaction_timeout_ms", 60000) < 1000
    ):
        raise ConfigError(f"session_timeout_ms and transaction_timeout_ms must be >= 1000{source}")
    unit = integer("work_unit_tokens", DEFAULT_WORK_UNIT_TOKENS)
    if unit < 0:
        raise ConfigError(f"planner setting 'work_unit_tokens' must be >= 0, got {unit}{source}")
    port = values.get("metrics_port")
    if port is not None and (isinstance(port, bool) or not isinstance(port, int) or port < 0):
        raise ConfigError(f"metrics_port must be a port number, got {port!r}{source}")
    return PlannerServiceConfig(
        destinations=destinations,
        params=params,
        smoothing=smoothing,
        work_unit_tokens=unit or None,
        rewarm_s=number("rewarm_s", DEFAULT_REWARM_S),
        max_plan_age_s=number("max_plan_age_s", 0.0) if "max_plan_age_s" in values else None,
        max_chunk_bytes=max_chunk,
        rates_lookback_s=(
            number("rates_lookback_s", 0.0) if "rates_lookback_s" in values else None
        ),
        group=str(values.get("group", "cacheroute-planner")),
        planner_id=str(values.get("planner_id", "")),
        session_timeout_ms=integer("session_timeout_ms", 6000),
        transaction_timeout_ms=integer("transaction_timeout_ms", 60000),
        metrics_port=port,
        metrics_host=str(values.get("metrics_host", "127.0.0.1")),
    )
