"""The emitter: the gateway's batching reporter of every request to the `requests` topic.

`emitter` holds the thread-safe `Emitter` a gateway embeds; `config` its settings; `columns`,
`fields` and `summary` the pure column batch and its per-key summary; `sealer` seals a batch and
hands it to `transport` (the Kafka producer) under `throttle`'s backpressure; `partitioner` picks
the partition by key exactly as the Java client does; `metrics` its Prometheus counters.

`from cacheroute.dispatcher.emitter import Emitter, EmitterConfig` works; the names load on
first use (PEP 562), so importing a pure module such as `cacheroute.dispatcher.emitter.columns`
loads no Kafka client.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cacheroute.dispatcher.emitter.config import EmitterConfig
    from cacheroute.dispatcher.emitter.emitter import Emitter

__all__ = ["Emitter", "EmitterConfig"]

_WHERE = {
    "Emitter": "cacheroute.dispatcher.emitter.emitter",
    "EmitterConfig": "cacheroute.dispatcher.emitter.config",
}


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(where), name)
