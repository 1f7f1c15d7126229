"""The dispatcher package's one root error."""

from __future__ import annotations

from cacheroute.errors import CacheRouteError

__all__ = ["DispatchError"]


class DispatchError(CacheRouteError, ValueError):
    """The dispatcher library was given something it cannot work with.

    Raised for invalid configuration (at construction, never on the request path) and used inside
    `Emitter.emit` to describe why an event was rejected; `emit` itself never lets it escape. Never
    retriable: the same input fails the same way.
    """

    retriable = False
