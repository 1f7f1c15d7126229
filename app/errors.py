"""The one root of every CacheRoute error, shared by the libraries and the shell.

It imports nothing, so every library (`schemas`, `planner`, `streams`, `dispatcher`, `replay`) can
derive its errors from it without loading the shell. Library errors that callers catch as
`ValueError` keep that as a second base; the CLI catches `CacheRouteError` alone.
"""

from __future__ import annotations

__all__ = ["CacheRouteError", "ConfigError"]


class CacheRouteError(Exception):
    """An operational failure the user can act on; the message says what to do.

    `retriable` tells callers whether trying the same thing again later may succeed (a broker that is
    still starting) or not (a missing Java runtime).
    """

    retriable: bool = False

    def __init__(self, message: str, *, retriable: bool = False) -> None:
        super().__init__(message)
        self.retriable = retriable


class ConfigError(CacheRouteError):
    """A setting (environment variable or flag) has a value that cannot work."""
