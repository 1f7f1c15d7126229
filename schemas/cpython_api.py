"""CPython C API functions reached through ctypes, where the interpreter has them.

A few large containers on the gateway's plan path are cheaper to build with a function the
interpreter exports but Python does not expose (`gc_tracking.py`, `dispatcher/presized.py`).
Each caller falls back to plain Python when `cpython_function` returns None: another
interpreter, or a CPython that no longer exports the name.
"""

from __future__ import annotations

import ctypes
import sys
from typing import Any

__all__ = ["cpython_function"]


def cpython_function(name: str, argtypes: list[Any], restype: Any) -> Any:
    """`ctypes.pythonapi.<name>` with its signature set, or None where it is not exported."""
    if sys.implementation.name != "cpython":
        return None
    try:
        fn = getattr(ctypes.pythonapi, name)
    except (AttributeError, OSError):
        return None
    fn.argtypes = argtypes
    fn.restype = restype
    return fn
