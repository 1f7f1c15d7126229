"""A gateway following a live plan on the real broker: `route()` never raises, whatever the key.

A list, a dict, None, bytes or a number as the routing key (a careless caller, a JSON field of the
wrong type) goes by power-of-two-choices and is counted `bad_key` in the dispatcher's metrics; the
planned keys around it keep their replica sets.
"""

from __future__ import annotations

import random
import time

from prometheus_client import generate_latest

from cacheroute.dispatcher.dispatcher import Dispatcher
from cacheroute.dispatcher.routing import RouteKind
from cacheroute.settings import Settings
from cacheroute.topics import ensure_topics
from tests.integration.planservice_support import make_plan, started_publisher

NAMES = [f"gpu-{i}" for i in range(8)]
BAD_KEYS: list[object] = [["a", "list"], {"a": "dict"}, None, b"bytes", 42, 1.5, ("t", "u")]


def test_route_never_raises_for_hostile_keys_once_a_plan_is_live(settings: Settings) -> None:
    ensure_topics(settings)
    plan = make_plan(500, version=1, seed=4, created_ms=int(time.time() * 1000) - 1)
    allowed = {k: {plan.destination_names[t] for t in ts} for k, ts in plan.assignments().items()}
    with started_publisher(settings, "test-hostile-keys") as publisher:
        publisher.publish(plan)
        dispatcher = Dispatcher(NAMES, rng=random.Random(0)).follow(settings)
        try:
            deadline = time.monotonic() + 30
            while dispatcher.version != 1:
                assert time.monotonic() < deadline, "the gateway never applied version 1"
                time.sleep(0.05)
            for key in BAD_KEYS:
                assert dispatcher.route(key) in NAMES
                with dispatcher.request(key) as dest:  # type: ignore[arg-type]
                    assert dest in NAMES
            assert dispatcher.router.counts[RouteKind.BAD_KEY] == 2 * len(BAD_KEYS)
            assert dispatcher.router.total_inflight == 0  # every request released
            for key, dests in list(allowed.items())[:200]:
                assert dispatcher.route(key) in dests
            metrics = generate_latest(dispatcher.registry).decode()
            assert f'reason="bad_key"}} {float(2 * len(BAD_KEYS))}' in metrics
        finally:
            dispatcher.close()
