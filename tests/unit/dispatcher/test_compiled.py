"""The routing module compiled with mypyc (setup.py) is current and decides as its source does.

The reference is routing.py itself, loaded from source under another name: an independent copy
of every rule, run by the interpreter. Both routers get the same table, options and random
stream and must pick the same destination for every request of a long mixed stream.
"""

from __future__ import annotations

import importlib.util
import os
import random
import sys
import threading
from collections import deque
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from cacheroute.dispatcher import routing

SOURCE = Path(routing.__file__).with_name("routing.py")
NAMES = [f"d{i}" for i in range(8)]


def _interpreted() -> ModuleType:
    spec = importlib.util.spec_from_file_location("cacheroute_routing_source", SOURCE)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while building
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    assert module.COMPILED_FROM is None
    return module


def test_the_compiled_module_is_built_from_the_routing_py_beside_it() -> None:
    assert SOURCE.exists()
    assert not routing.compiled_is_stale(), "routing.py changed since it was compiled: make install"
    if os.environ.get("CI") == "true":  # CI must test what gateways run: the compiled module
        assert routing.COMPILED_FROM is not None, "setup.py could not compile routing.py"


def _decisions(module: Any, options: dict[str, Any], seed: int) -> list[int]:
    assignments = [(f"t{k % 5}/hot{k}", [NAMES[k % 8], NAMES[(3 * k + 1) % 8]]) for k in range(6)]
    assignments += [(f"t{k % 5}/warm{k}", [NAMES[(5 * k) % 8]]) for k in range(30)]
    table = module.build_table(3, 0, assignments, NAMES, NAMES, group_separator="/")
    r = module.Router(NAMES, rng=random.Random(seed), **options)
    r.table = table
    draw = random.Random(seed + 1)  # the stream: the same for both routers
    window: deque[tuple[int, int]] = deque()
    out = []
    for n in range(6000):
        u = draw.random()
        if u < 0.5:
            key = assignments[draw.randrange(6)][0]
        elif u < 0.8:
            key = assignments[draw.randrange(6, 36)][0]
        else:  # cold keys, new and repeated, some without a group
            key = f"t{draw.randrange(7)}/cold{draw.randrange(400)}" if u < 0.95 else f"x{n}"
        session = f"s{draw.randrange(50)}" if draw.random() < 0.3 else None
        blocks = [draw.randrange(40) for _ in range(draw.randrange(1, 6))]
        if n == 2000:
            r.mark_down("d3")
        if n == 4000:
            r.mark_up("d3")
        d = r.route_index(key, session, blocks)
        r.remember(d, blocks)
        units = r.work_units(key, d, draw.randrange(1, 4000), session)
        r.acquire(d, units)
        window.append((d, units))
        if len(window) > draw.choice((8, 64)):
            r.release(*window.popleft())
        out.append(d)
    out.extend(r.counts)
    return out


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"spill_home": True, "context_home": True, "cache_tokens": 20_000},
        {"prefix_blocks": 4096, "cold_cost": True, "spill_factor": 1.2},
        {"cold_affinity": False, "context_slack": False, "cold_choices": 1},
    ],
    ids=["defaults", "one-gateway homes", "prefix and cost", "plain"],
)
def test_compiled_and_interpreted_routers_make_the_same_decisions(options: dict[str, Any]) -> None:
    reference = _decisions(_interpreted(), options, seed=11)
    assert _decisions(routing, options, seed=11) == reference
    assert len(set(reference[:6000])) == len(NAMES)  # the stream reached every destination
    kinds = routing.RouteKind
    counts = reference[6000:]
    assert counts[kinds.PLAN] > 0
    assert counts[kinds.COLD] > 0
    assert counts[kinds.PLAN_DOWN] > 0
    assert counts[kinds.SPILLED] > 0  # the spill rule ran, not only the plain paths


def test_a_dispatchers_request_is_the_routers_hold() -> None:
    from cacheroute.dispatcher import Dispatcher  # noqa: PLC0415 - logs at construction

    d = Dispatcher(NAMES, rng=random.Random(3))
    assert getattr(d.request, "__self__", None) is d.router  # bound at construction: no own frame
    with d.request("t1/a", prompt_tokens=4 * 512) as first:
        # the class's method (what a subclass calling super() reaches) takes the same path
        held = type(d).request(d, "t1/b")
        assert d.router.inflight[NAMES.index(first)] >= 5  # 1 + 2048 // 512 units
        assert d.router.total_requests == 2
        assert d.router.total_inflight == 5 + 1  # and one for the request without a count
        held.release()
    assert d.router.total_inflight == 0
    assert d.router.total_requests == 0


def _hammer(module: Any) -> Any:
    """Four threads route and release through the documented path (`request` and `with`), with
    requests held across a window, switching threads as often as the interpreter allows, plus
    `acquire`/`settle`/`release` with weights; returns the router."""
    table = module.build_table(1, 0, [("hot", ["d1", "d2"]), ("solo", ["d3"])], NAMES, NAMES)
    r = module.Router(NAMES, rng=random.Random(5))
    r.table = table

    def work(seed: int) -> None:
        draw = random.Random(seed)
        window: deque[Any] = deque()
        for n in range(30_000):
            key = ("hot", "solo", f"cold{draw.randrange(50)}")[n % 3]
            held = r.hold(key, prompt_tokens=draw.randrange(1, 3000) if n % 4 == 0 else None)
            held.__enter__()
            if n % 5 == 0:
                held.first_token()
            window.append(held)
            if len(window) > 16:
                window.popleft().__exit__(None, None, None)
            d = r.route_index(key)
            r.acquire(d, 3)
            r.settle(d, 2)
            r.release(d, 1)
        while window:
            window.popleft().__exit__(None, None, None)

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(old)
    return r


@pytest.mark.parametrize("compiled", [True, False], ids=["as-installed", "interpreted"])
def test_in_flight_counts_stay_exact_when_threads_race_on_the_documented_path(
    compiled: bool,
) -> None:
    # as installed, the counters are updated without a lock where that is atomic (compiled
    # code never lets another thread in between a read and its write); as Python, under one
    r = _hammer(routing if compiled else _interpreted())
    assert r.inflight == [0] * len(NAMES)
    assert r.total_inflight == 0
    assert r.total_requests == 0
    assert sum(r.counts) == 4 * 30_000 * 2  # every decision counted once
