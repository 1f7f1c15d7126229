"""The emitter's pure core imports no Kafka client and reads no clock or global randomness."""

from __future__ import annotations

import ast
from importlib import util
from pathlib import Path

import pytest

PURE = [
    "cacheroute.dispatcher.emitter.partitioner",
    "cacheroute.dispatcher.emitter.columns",
    "cacheroute.dispatcher.emitter.summary",
    "cacheroute.dispatcher.emitter.throttle",
    "cacheroute.dispatcher.emitter.config",
    "cacheroute.dispatcher.emitter.fields",
]
FORBIDDEN = {"confluent_kafka", "aiokafka", "faust", "time", "random", "datetime", "threading"}


@pytest.mark.parametrize("module", PURE)
def test_pure_module_has_no_forbidden_imports(module: str) -> None:
    spec = util.find_spec(module)
    assert spec is not None
    assert spec.origin is not None
    tree = ast.parse(Path(spec.origin).read_text())
    imported: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module.split(".")[0])
            if node.module.startswith("cacheroute."):
                assert node.module in PURE or node.module.startswith(
                    ("cacheroute.schemas", "cacheroute.dispatcher.errors")
                ), f"{module} imports the impure {node.module}"
    assert not imported & FORBIDDEN, f"{module} imports {imported & FORBIDDEN}"
