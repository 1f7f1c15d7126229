"""Limits and slow-path checks of the values an event carries.

`Emitter.emit` checks the common case inline (an exact `int` in range, an ASCII `str`) because a
function call per field would double its cost; anything else comes here, where other int types
(numpy) are converted and everything Avro could not encode raises, so the event is rejected alone
instead of spoiling the batch it would have joined. Pure logic.
"""

from __future__ import annotations

import operator
from typing import Any

from cacheroute.dispatcher.errors import DispatchError

__all__ = ["INT_MAX", "LONG_MAX", "as_count", "as_event_time", "as_text"]

INT_MAX = 2**31 - 1
"""Largest Avro `int` (token counts)."""
LONG_MAX = 2**63 - 1
"""Largest Avro `long` (times)."""


def as_count(name: str, value: Any) -> int:
    """Slow path of token validation: ints of other types (numpy) pass, anything else fails."""
    if isinstance(value, bool):
        raise DispatchError(f"{name} must be an int, got a bool")
    n = operator.index(value)  # TypeError for floats, strings, None
    if not 0 <= n <= INT_MAX:
        raise DispatchError(f"{name} must be in 0..2**31-1, got {n}")
    return n


def as_event_time(value: Any) -> int:
    """Slow path of event-time validation: any int type in 0..2**63-1."""
    if isinstance(value, bool):
        raise DispatchError("event_time_ms must be an int, got a bool")
    n = operator.index(value)
    if not 0 <= n <= LONG_MAX:
        raise DispatchError(f"event_time_ms must be in 0..2**63-1, got {n}")
    return n


def as_text(name: str, value: Any) -> str:
    """Slow path of text validation: a str that UTF-8 can encode (Avro strings must be)."""
    if not isinstance(value, str):
        raise DispatchError(f"{name} must be a str, got {type(value).__name__}")
    value.encode("utf-8")  # lone surrogates raise UnicodeEncodeError
    return str(value)
