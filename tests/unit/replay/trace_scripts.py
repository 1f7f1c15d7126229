"""The trace generators under tests/data/traces, loaded as modules (they are scripts, not package
code: a user runs them to write a trace)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

TRACES = Path(__file__).resolve().parents[2] / "data" / "traces"


def load_script(name: str) -> ModuleType:
    """tests/data/traces/`name`.py as a module."""
    spec = importlib.util.spec_from_file_location(name, TRACES / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
