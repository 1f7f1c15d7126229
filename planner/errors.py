"""The planner package's one root error."""

from __future__ import annotations

from cacheroute.errors import CacheRouteError

__all__ = ["PlannerError"]


class PlannerError(CacheRouteError, ValueError):
    """The planner was given input it cannot plan from, or a plan breaks an invariant.

    Never retriable: the same rates and parameters fail the same way, so the planner service keeps
    its last good plan and reports this message. Whenever one key is to blame (a NaN rate, a
    duplicate) the message names it and `key` holds it, so an operator can find the bad record.
    """

    retriable = False

    def __init__(self, message: str, *, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key
