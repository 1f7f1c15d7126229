"""`cacheroute bench propagation` as a user runs it, small: 2 gateway processes, 2 versions.

It runs the CLI in a subprocess (the gateways are its own children, stopped by pid) and checks what
the numbers must satisfy whatever the machine: every (version, gateway) pair observed, latencies
positive and ordered, every documented field present, and no topic or process left behind.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from cacheroute.benchmarks.propagation import RESULT_FIELDS
from cacheroute.settings import Settings
from cacheroute.topics import make_admin

pytestmark = pytest.mark.kafka


@pytest.mark.timeout(240)
def test_small_run_observes_every_pair(settings: Settings) -> None:
    argv = [sys.executable, "-m", "cacheroute", "--bootstrap", settings.bootstrap]
    argv += ["--topic-prefix", settings.topic_prefix, "bench", "propagation", "--json"]
    argv += ["--gateways", "2", "--keys", "2000", "--versions", "2", "--interval", "1"]
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=220)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)  # exactly one JSON object on stdout

    assert tuple(result) == tuple(RESULT_FIELDS)
    assert (result["gateways"], result["keys"], result["versions"]) == (2, 2000, 2)
    assert result["missing_pairs"] == []
    assert result["pairs"] == 2 * 2
    assert len(result["per_version"]) == 2
    assert all(v["gateways"] == 2 for v in result["per_version"])
    versions = [v["version"] for v in result["per_version"]]
    assert versions == sorted(set(versions))
    assert 0 < result["min_ms"] <= result["p50_ms"] <= result["p99_ms"] <= result["max_ms"]
    assert 0 < result["single_gateway_p50_ms"] <= result["single_gateway_p99_ms"]
    assert result["single_gateway_p99_ms"] <= result["single_gateway_max_ms"]
    assert result["p50_ratio"] > 0
    assert result["p99_ratio"] > 0
    assert result["plan_bytes"] > 0
    assert result["plan_chunks"] >= 1
    assert result["admitted_keys"] == 2000  # W = 2048 on 30 destinations admits them all
    assert result["observed_by"] == "apply_plan-hook"
    assert result["compiled_decode"] is True  # the test install has numba

    left = make_admin(settings).list_topics(timeout=10).topics
    assert not [t for t in left if t.startswith(settings.topic_prefix + "bench-propagation-")]
