"""Root error of the replay and evaluation package."""

from __future__ import annotations

from cacheroute.errors import CacheRouteError

__all__ = ["ReplayError"]


class ReplayError(CacheRouteError):
    """Bad replay input (a trace that cannot be read, a workload or option that cannot work).

    A `CacheRouteError`, so the CLI prints it as one clear line without a traceback.
    """
