"""Keep large containers of strings out of Python's cyclic garbage collector.

A follower decodes each plan version's admitted keys (60k+ strings at paper scale) into a list
per chunk and then one tuple. New containers are tracked by the collector, and each collection
that meets one visits every item with the GIL held: lists on every pass over their generation,
a tuple until the first pass finds that it holds only strings and untracks it. The strings are
spread over memory, so one such pass took 1-2.3 ms here, a stall for every thread routing
requests in the gateway (`cacheroute bench dispatcher`, `receive_*_stall_ms`). A container that
holds only strings cannot be part of a reference cycle, so `untrack_strings` takes it out of the
collector's view at once, without the visits.
"""

from __future__ import annotations

import ctypes

from cacheroute.schemas.cpython_api import cpython_function

__all__ = ["untrack_strings"]

_UNTRACK = cpython_function("PyObject_GC_UnTrack", [ctypes.py_object], None)
"""CPython's `PyObject_GC_UnTrack` (stable C API), or None on another interpreter."""


def untrack_strings(items: tuple[str, ...] | list[str]) -> None:
    """Stop the collector tracking `items`, a tuple or list whose items are all exact `str`.

    The caller guarantees the item types (a `str` subclass may carry a `__dict__` and so could
    reach a cycle), and for a list that nothing adds other objects to it later; that is what
    makes untracking safe, and for a tuple it is exactly the test CPython's collector applies
    before untracking it itself. A no-op where the C API is not reachable.
    """
    if _UNTRACK is not None and type(items) in (tuple, list):
        _UNTRACK(items)
