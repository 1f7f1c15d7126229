"""Dispatcher: the in-gateway library that follows the plan topic and routes each request.

`routing` holds the pure decisions (plan table, cold path, load units), `dispatcher` the
thread-safe `Dispatcher` a gateway embeds, `follower` and `reader` the plans topic's reading
side (`subscription` wires a follower to a Dispatcher), and `emitter` the batching reporter of
every request to the `requests` topic.

The public API is importable from here (`from cacheroute.dispatcher import Dispatcher,
Emitter`). The names load on first use (PEP 562), so importing a pure module such as
`cacheroute.dispatcher.routing` still loads no Kafka client.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cacheroute.dispatcher.dispatcher import Dispatcher, DispatcherConfig, InFlight
    from cacheroute.dispatcher.emitter.config import EmitterConfig
    from cacheroute.dispatcher.emitter.emitter import Emitter
    from cacheroute.dispatcher.errors import DispatchError
    from cacheroute.dispatcher.routing import Router

__all__ = [
    "DispatchError",
    "Dispatcher",
    "DispatcherConfig",
    "Emitter",
    "EmitterConfig",
    "InFlight",
    "Router",
]

_WHERE = {
    "DispatchError": "cacheroute.dispatcher.errors",
    "Dispatcher": "cacheroute.dispatcher.dispatcher",
    "DispatcherConfig": "cacheroute.dispatcher.dispatcher",
    "Emitter": "cacheroute.dispatcher.emitter.emitter",
    "EmitterConfig": "cacheroute.dispatcher.emitter.config",
    "InFlight": "cacheroute.dispatcher.dispatcher",
    "Router": "cacheroute.dispatcher.routing",
}


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(where), name)
