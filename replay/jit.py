"""numba's `njit`, typed for mypy, with the options every replay kernel uses.

`cache=True` keeps the compiled kernels on disk, so a new process loads them instead of compiling
(about a second instead of ten). With `NUMBA_DISABLE_JIT=1` the kernels run as plain Python.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, cast

import numba
from numba.core.dispatcher import Dispatcher

__all__ = ["compiled", "njit"]

F = TypeVar("F", bound=Callable[..., Any])


def njit(fn: F) -> F:
    """Compile `fn` with numba in nopython mode (IEEE semantics: no fastmath)."""
    return cast(F, numba.njit(cache=True, nogil=True)(fn))


def compiled(fn: F, *args: Any) -> F:
    """`fn`'s machine code for these arguments' types, to call without numba's dispatch.

    A numba dispatcher works out every argument's type on each call, about 60 ns an array: for
    the replay's 28-argument engine step that was a third of its cost, and the simulator calls it
    once per request with the same arrays. So the caller looks the compiled function up once
    (compiling it, or loading it from the disk cache, if needed). It converts arguments but does
    not check their types: call it with arguments of the types given here. Plain `fn` when JIT is
    disabled.
    """
    if not isinstance(fn, Dispatcher):
        return fn
    signature = tuple(fn.typeof_pyval(a) for a in args)
    return cast(F, fn.compile(signature))
