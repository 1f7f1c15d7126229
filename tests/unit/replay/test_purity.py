"""The replay core is pure: no Kafka client, no clock, no global random state."""

from __future__ import annotations

import ast
from pathlib import Path

import cacheroute.replay

IMPURE = {"live.py"}  # the Kafka replay: the shell side, on purpose
FORBIDDEN_MODULES = {"confluent_kafka", "faust", "aiokafka", "kafka", "time"}
CLOCK_READS = {"now", "utcnow", "today", "monotonic", "perf_counter", "time_ns"}
NP_GLOBAL_RNG = {"seed", "rand", "randn", "random", "randint", "normal", "choice", "default_rng"}


def violations(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.split(".")[0] in FORBIDDEN_MODULES]
        elif isinstance(node, ast.ImportFrom) and node.module:
            root = node.module.split(".")[0]
            if root in FORBIDDEN_MODULES or node.module == "cacheroute.replay.live":
                found.append(node.module)
            if root == "random":
                found.append("from random import ...")
        elif isinstance(node, ast.Attribute):
            chain = ast.unparse(node)
            if node.attr in CLOCK_READS:
                found.append(chain)
            # random.Random(seed) is an explicitly seeded generator; the module functions are not
            if chain.startswith("random.") and chain != "random.Random":
                found.append(chain)
            seeded = node.attr == "default_rng" and path.name in {"policy.py", "sources.py"}
            if chain.startswith(("np.random.", "numpy.random.")) and node.attr in NP_GLOBAL_RNG:
                found += [] if seeded else [chain]
    return [f"{path.name}: {v}" for v in found]


def test_pure_replay_modules() -> None:
    files = sorted(Path(cacheroute.replay.__file__).parent.glob("*.py"))
    assert len(files) > 10
    problems = [v for f in files if f.name not in IMPURE for v in violations(f)]
    assert problems == []


def test_the_checker_catches_violations(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import time\nimport random\nfrom confluent_kafka import Producer\nimport numpy as np\n"
        "x = random.random()\ny = np.random.normal()\nz = random.Random(1)\n"
        "from datetime import datetime\nw = datetime.now()\n",
        encoding="utf-8",
    )
    assert len(violations(bad)) == 5
