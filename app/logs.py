"""Log output of every CacheRoute process: readable text for people, JSON lines for machines.

`--log-format json` (or CACHEROUTE_LOG_FORMAT=json) makes each record one JSON object on stderr
with `ts`, `level`, `logger`, `msg`, `pid` (and `exc` for exceptions), so log shippers can index
them. The choice is passed to child processes through the environment (the demo's workers, planner
and gateways inherit it), and the Faust worker gets the same formatter through its logging config.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from typing import Any

from rich.console import Console
from rich.logging import RichHandler

from cacheroute.schemas.codec import dump_json

__all__ = ["ENV", "FORMATS", "JsonFormatter", "faust_logging_config", "setup_logging"]

ENV = "CACHEROUTE_LOG_FORMAT"
FORMATS = ("text", "json")


class JsonFormatter(logging.Formatter):
    """One JSON object per record."""

    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        out: dict[str, Any] = {
            "ts": f"{ts}.{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
            "pid": record.process,
        }
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return dump_json(out).decode()


def setup_logging(level: int, fmt: str | None = None) -> str:
    """Configure the root logger; returns the format used (and exports it to children)."""
    fmt = fmt or os.environ.get(ENV, "text")
    if fmt not in FORMATS:
        fmt = "text"
    os.environ[ENV] = fmt
    handler: logging.Handler
    if fmt == "json":
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(JsonFormatter())
    else:
        handler = RichHandler(console=Console(stderr=True), show_path=False)
        handler.setFormatter(logging.Formatter("%(message)s"))
    logging.basicConfig(level=level, handlers=[handler], force=True)
    return fmt


def faust_logging_config(level: str) -> dict[str, Any] | None:
    """A dictConfig for Faust's worker when JSON logs are wanted (None: Faust's own format)."""
    if os.environ.get(ENV) != "json":
        return None
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"json": {"()": "cacheroute.logs.JsonFormatter"}},
        "handlers": {
            "stderr": {
                "class": "logging.StreamHandler",
                "formatter": "json",
                "stream": "ext://sys.stderr",
            }
        },
        "root": {
            "level": level.upper().replace("WARN", "WARNING").replace("CRIT", "CRITICAL"),
            "handlers": ["stderr"],
        },
    }
