"""JSON log lines carry what a log shipper needs; the format choice reaches child processes."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import pytest

from cacheroute.logs import ENV, JsonFormatter, faust_logging_config


def test_json_formatter_writes_one_object_per_record() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        record = logging.getLogger("x.y").makeRecord(
            "x.y", logging.ERROR, __file__, 1, "plan v%d rejected", (7,), sys.exc_info()
        )
    line = JsonFormatter().format(record)
    data = json.loads(line)
    assert data["level"] == "ERROR"
    assert data["logger"] == "x.y"
    assert data["msg"] == "plan v7 rejected"
    assert data["ts"].endswith("Z")
    assert "ValueError: boom" in data["exc"]


def test_cli_emits_json_lines_and_exports_the_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    env = {k: v for k, v in os.environ.items() if k != ENV}
    code = (
        "import logging, os, sys\n"
        "from cacheroute.logs import setup_logging\n"
        "setup_logging(logging.INFO, 'json')\n"
        "logging.getLogger('cacheroute.test').warning('hello %s', 'world')\n"
        "print(os.environ['CACHEROUTE_LOG_FORMAT'])\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    assert proc.stdout.strip() == "json"
    (line,) = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert json.loads(line)["msg"] == "hello world"
    monkeypatch.setenv(ENV, "json")
    config = faust_logging_config("warn")
    assert config is not None
    assert config["root"]["level"] == "WARNING"
    monkeypatch.setenv(ENV, "text")
    assert faust_logging_config("info") is None
