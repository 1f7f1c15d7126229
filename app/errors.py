"""Root error of the shell (CLI, settings, local broker, topic management)."""

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
