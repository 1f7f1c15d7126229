"""Imports run one way: the libraries import only each other, downwards, plus a small shared base.

The libraries are the areas of the system (folders at the top of the repository): `schemas` at the
bottom, then `planner`, then `dispatcher` and `streams`, and `replay` on top. The shell in `app/`
(CLI, planner service, demo, doctor, local broker, HTTP gateway and engine) wires them together and
may import anything; no library imports the shell. The shared base is what every Kafka-facing
library needs: the error root, the connection settings and security, the Kafka I/O helpers and the
topic specs, which import nothing but each other. Checked on every import statement, including the
lazy ones inside functions. The pure cores (the planner, `dispatcher/routing.py`,
`streams/state.py`, the replay core) import no Kafka client at all.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

LIBRARIES = {  # package -> its folder
    "schemas": ROOT / "schemas",
    "planner": ROOT / "planner",
    "dispatcher": ROOT / "dispatcher",
    "streams": ROOT / "streams",
    "replay": ROOT / "replay",
}
MAY_IMPORT = {  # library -> the libraries below it
    "schemas": set(),
    "planner": {"schemas"},
    "dispatcher": {"planner", "schemas"},
    "streams": {"schemas"},
    "replay": {"dispatcher", "planner", "schemas", "streams"},
}
BASE = {"errors", "kafkasecurity", "settings", "kafkaio", "topics"}
"""`cacheroute.<name>` modules (folder app/) every library may use."""
PURE = [
    ROOT / "planner",
    ROOT / "dispatcher" / "routing.py",
    ROOT / "streams" / "state.py",
    ROOT / "streams" / "keyagg.py",
    ROOT / "streams" / "columns.py",
    ROOT / "streams" / "keytable.py",
    ROOT / "schemas" / "batch_scan.py",
    ROOT / "schemas" / "rate_columns.py",
]
KAFKA = {"confluent_kafka", "faust", "aiokafka", "mode"}


def _imports(path: Path) -> list[str]:
    """Every module an import statement in `path` names (absolute imports only: the project
    uses no relative ones outside tests)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: relative import"
            if node.module:
                names.append(node.module)
    return names


def _sources(where: Path) -> list[Path]:
    return sorted(where.rglob("*.py")) if where.is_dir() else [where]


@pytest.mark.parametrize("library", sorted(LIBRARIES))
def test_a_library_imports_only_the_libraries_below_it_and_the_base(library: str) -> None:
    allowed = {library, *MAY_IMPORT[library]}
    files = _sources(LIBRARIES[library])
    assert len(files) >= 3, files  # the check really reads the library
    wrong = []
    for path in files:
        for name in _imports(path):
            parts = name.split(".")
            if parts[0] != "cacheroute" or len(parts) == 1:
                continue
            if parts[1] in allowed or parts[1] in BASE:
                continue
            wrong.append(f"{path.relative_to(ROOT)} imports {name}")
    assert wrong == []


def test_the_base_imports_only_itself() -> None:
    wrong = []
    for name in sorted(BASE):
        path = ROOT / "app" / f"{name}.py"
        for imported in _imports(path):
            parts = imported.split(".")
            if parts[0] == "cacheroute" and len(parts) > 1 and parts[1] not in BASE:
                wrong.append(f"{name} imports {imported}")
    assert wrong == []


@pytest.mark.parametrize("where", PURE, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_pure_cores_import_no_kafka_client(where: Path) -> None:
    wrong = []
    for path in _sources(where):
        for name in _imports(path):
            if name.split(".")[0] in KAFKA or name.split(".")[-1] in BASE - {"errors"}:
                wrong.append(f"{path.relative_to(ROOT)} imports {name}")
    assert wrong == []


def test_the_check_catches_a_shell_import(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from cacheroute.planservice.follower import PlanFollower\n")
    assert _imports(bad) == ["cacheroute.planservice.follower"]


def test_benchmarks_live_together_outside_the_libraries() -> None:
    """Every benchmark module is in benchmarks/ (`cacheroute.benchmarks`); the `bench` CLI only
    wires them to the command line."""
    stray = [
        str(p.relative_to(ROOT))
        for where in (*LIBRARIES.values(), ROOT / "app")
        for p in where.rglob("*bench*.py")
        if p != ROOT / "app" / "cli" / "bench.py"
    ]
    assert stray == []
    assert len(list((ROOT / "benchmarks").glob("*.py"))) >= 6
