"""A dict with room for its entries from the start, so filling it never resizes it.

A dict grows by copying every entry into a table twice as large once it is 2/3 full. Filling a
gateway's routing table of 61k keys (`table_from_plan`) therefore copied 43,690 entries in one
C-level step with the GIL held: 0.6-1.7 ms measured on a 2-core machine, the worst stall a
routing thread saw while a plan was applied (`cacheroute bench dispatcher`, `swap_max_stall_ms`).
CPython can make a dict at its final size (`_PyDict_NewPresized`, what the interpreter uses for
dict displays); `presized_dict` calls it through ctypes, and an interpreter without it gets an
ordinary empty dict: the same contents, only the resizes come back.
"""

from __future__ import annotations

import ctypes
from typing import Any

from cacheroute.schemas.cpython_api import cpython_function

__all__ = ["PRESIZE_MAX", "presized_dict"]

PRESIZE_MAX = 87_381
"""CPython presizes for at most this many entries (a table of 2**17 slots, 2/3 usable); a
larger dict still resizes above that."""

_PRESIZED = cpython_function("_PyDict_NewPresized", [ctypes.c_ssize_t], ctypes.py_object)
"""CPython's `_PyDict_NewPresized` (its result, a new reference, is taken over by ctypes), or
None where it is not exported."""


def presized_dict(entries: int) -> dict[Any, Any]:
    """An empty dict that takes `entries` entries (up to `PRESIZE_MAX`) without resizing."""
    if _PRESIZED is None or entries <= 0:
        return {}
    made = _PRESIZED(min(entries, PRESIZE_MAX))
    return made if type(made) is dict else {}
