"""numba's `njit`, typed for mypy, with the options every replay kernel uses.

`cache=True` keeps the compiled kernels on disk, so a new process loads them instead of compiling
(about a second instead of ten). With `NUMBA_DISABLE_JIT=1` the kernels run as plain Python.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, cast

import numba

__all__ = ["njit"]

F = TypeVar("F", bound=Callable[..., Any])


def njit(fn: F) -> F:
    """Compile `fn` with numba in nopython mode (IEEE semantics: no fastmath)."""
    return cast(F, numba.njit(cache=True, nogil=True)(fn))
