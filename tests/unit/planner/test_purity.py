"""The planner is a pure core: no Kafka client, no clock, no global random state."""

from __future__ import annotations

import ast
from pathlib import Path

import cacheroute.planner

FORBIDDEN_MODULES = {"confluent_kafka", "faust", "aiokafka", "kafka", "time", "random", "datetime"}
# Global-state RNG entry points of numpy: randomness must come in as a Generator.
FORBIDDEN_NP_RANDOM = {
    "seed",
    "rand",
    "randn",
    "random",
    "randint",
    "normal",
    "lognormal",
    "choice",
    "shuffle",
    "permutation",
    "uniform",
    "default_rng",
}


def planner_sources() -> list[Path]:
    files = sorted(Path(cacheroute.planner.__file__).parent.glob("*.py"))
    assert len(files) > 5
    return files


def violations(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.split(".")[0] in FORBIDDEN_MODULES]
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module.split(".")[0] in FORBIDDEN_MODULES:
                found.append(node.module)
        elif isinstance(node, ast.Attribute):
            chain = ast.unparse(node)
            if chain in {"time.time", "time.time_ns", "time.monotonic", "time.perf_counter"}:
                found.append(chain)
            if (
                isinstance(node.value, ast.Attribute)
                and node.value.attr == "random"
                and node.attr in FORBIDDEN_NP_RANDOM
            ):
                found.append(chain)
    return [f"{path.name}: {v}" for v in found]


def test_planner_modules_import_no_kafka_clock_or_global_rng() -> None:
    problems = [v for path in planner_sources() for v in violations(path)]
    assert problems == []


def test_the_checker_itself_catches_violations(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import time\nfrom confluent_kafka import Producer\nimport numpy as np\n"
        "x = time.time()\ny = np.random.default_rng()\n",
        encoding="utf-8",
    )
    assert len(violations(bad)) == 4
