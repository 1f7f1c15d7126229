"""Dispatcher shell: version swaps, staleness transitions, health checks, metrics, request()."""

from __future__ import annotations

import logging
import random
import threading
import time

import numpy as np
import pytest
from prometheus_client import generate_latest

from cacheroute.dispatcher.dispatcher import Dispatcher, DispatcherConfig
from cacheroute.dispatcher.routing import RouteKind
from cacheroute.planner import Plan, PlannerParams, build_plan

NAMES = ["d0", "d1", "d2"]


def plan(version: int, created_ms: int, dests: list[str] | None = None) -> Plan:
    keys = [f"k{i}" for i in range(50)]
    rates = np.linspace(10.0, 1.0, 50)
    return build_plan(
        keys,
        rates,
        dests or NAMES,
        PlannerParams(q_cap=4.0, warm_slots=10, control_interval_s=10.0),
        version=version,
        created_ms=created_ms,
    )


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_swaps_only_newer_versions_and_routes_by_them() -> None:
    clock = Clock(1000.0)
    d = Dispatcher(NAMES, rng=random.Random(0), clock=clock)
    p1 = plan(1, 1_000_000)
    assert d.apply_plan(p1)
    assert d.version == 1
    assert not d.apply_plan(plan(1, 1_000_000))
    assert d.apply_plan(plan(2, 1_000_000))
    assert d.version == 2
    assignments = p1.assignments()
    key = next(iter(assignments))
    allowed = {NAMES[i] for i in assignments[key]}
    assert d.route(key) in allowed
    assert d.router.counts[RouteKind.PLAN] == 1


def test_staleness_falls_back_and_recovers_with_one_log_line_each(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock(1000.0)
    d = Dispatcher(NAMES, DispatcherConfig(staleness_intervals=3), clock=clock)
    with caplog.at_level(logging.WARNING, logger="cacheroute.dispatcher"):
        d.apply_plan(plan(1, 1_000_000))
        assert not d.router.stale
        clock.t = 1000.0 + 31  # interval 10 s x 3
        assert d.check_staleness()
        assert d.check_staleness()
        d.route("k0")
        assert d.router.counts[RouteKind.STALE] == 1
        d.apply_plan(plan(2, 1_031_000))
        assert not d.router.stale
    stale_lines = [r for r in caplog.records if "path (no plan) until" in r.message]
    fresh_lines = [r for r in caplog.records if r.message.startswith("routing by plan")]
    assert len(stale_lines) == 1
    assert len(fresh_lines) == 2


def test_unknown_plan_destinations_are_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    d = Dispatcher(NAMES, clock=Clock(1000.0))
    with caplog.at_level(logging.WARNING, logger="cacheroute.dispatcher"):
        d.apply_plan(plan(1, 1_000_000, ["d0", "d1", "x9"]))
        d.apply_plan(plan(2, 1_000_000, ["d0", "d1", "x9"]))
    assert sum("'x9'" in r.message for r in caplog.records) == 1
    assert sum("'d2' is not in plan" in r.message for r in caplog.records) == 1
    for i in range(100):
        assert d.route(f"k{i}") in NAMES


def test_health_check_marks_down_and_up() -> None:
    healthy = {"d0": True, "d1": False, "d2": True}
    d = Dispatcher(
        NAMES, DispatcherConfig(maintenance_interval_s=0.01), health_check=lambda n: healthy[n]
    )
    with d:
        deadline = time.monotonic() + 5
        while d.router.is_up("d1") and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not d.router.is_up("d1")
        assert {d.route(f"c{i}") for i in range(200)} <= {"d0", "d2"}
        healthy["d1"] = True
        while not d.router.is_up("d1") and time.monotonic() < deadline:
            time.sleep(0.01)
        assert d.router.is_up("d1")


def test_request_context_counts_in_flight_and_never_raises_for_bad_names() -> None:
    d = Dispatcher(NAMES)
    with d.request("any") as dest:
        assert dest in NAMES
        assert sum(d.router.inflight) == 1
    assert sum(d.router.inflight) == 0
    d.mark_down("nope")
    d.mark_up("nope")


def test_metrics_export_counts() -> None:
    d = Dispatcher(NAMES, clock=Clock(1000.0))
    d.apply_plan(plan(4, 1_000_000))
    for i in range(10):
        d.route(f"cold-{i}")
    text = generate_latest(d.registry).decode()
    assert 'cacheroute_dispatcher_routed_total{reason="cold"} 10.0' in text
    assert "cacheroute_dispatcher_plan_version 4.0" in text


def test_swap_under_concurrent_routing_threads_keeps_every_decision_valid() -> None:
    d = Dispatcher(NAMES, clock=Clock(1000.0))
    errors: list[BaseException] = []
    stop = threading.Event()

    def work() -> None:
        try:
            while not stop.is_set():
                for i in range(200):
                    with d.request(f"k{i % 60}") as dest:
                        assert dest in NAMES
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(3)]
    for t in threads:
        t.start()
    for v in range(1, 30):
        d.apply_plan(plan(v, 1_000_000))
    stop.set()
    for t in threads:
        t.join()
    assert not errors
    assert d.version == 29
    assert d.router.inflight == [0, 0, 0]


def test_request_holds_its_units_until_the_block_ends_even_on_error() -> None:
    """`request()` counts the load at the call and releases it when the `with` block exits."""
    d = Dispatcher(["a", "b"], rng=random.Random(0))
    with d.request("k", units=3) as first:
        assert first in ("a", "b")
        assert d.router.total_inflight == 3
        with d.request("k") as second:
            assert second in ("a", "b")
            assert d.router.total_inflight == 4
        assert d.router.total_inflight == 3
    assert d.router.total_inflight == 0
    seen: list[int] = []

    def failing() -> None:
        with d.request("k", units=2):
            seen.append(d.router.total_inflight)
            raise RuntimeError("backend failed")

    with pytest.raises(RuntimeError):
        failing()
    assert seen == [2]
    assert d.router.inflight == [0, 0]
    assert d.router.total_requests == 0  # every exit, error or not, released its request
    # kept without `with`, as an async gateway does: released by hand
    held = d.request("k", units=5)
    assert d.router.total_inflight == 5
    held.release()
    assert d.router.total_inflight == 0


def test_request_with_blocks_sends_a_new_conversation_where_its_prompt_went() -> None:
    names = [f"d{i}" for i in range(6)]
    d = Dispatcher(names, DispatcherConfig(prefix_blocks=64))
    with d.request("tenant-a/conv-1", blocks=[101, 102, 103]) as first:
        pass
    # another conversation of the same system prompt (3 of its 4 leading blocks) follows it,
    # whichever conversation key it has
    for n in range(2, 40):
        with d.request(f"tenant-a/conv-{n}", blocks=[101, 102, 103, 1000 + n]) as dest:
            assert dest == first
    assert d.router.counts[RouteKind.PREFIX] == 38
    assert sum(d.router.inflight) == 0
    # without prefix_blocks the blocks change nothing (the cold path's ring decides)
    plain = Dispatcher(names)
    with plain.request("tenant-a/conv-1", blocks=[101, 102, 103]):
        pass
    spread = set()
    for n in range(2, 40):
        with plain.request(f"tenant-a/conv-{n}", blocks=[101, 102, 103, 1000 + n]) as dest:
            spread.add(dest)
    assert len(spread) > 1
    assert plain.router.counts[RouteKind.PREFIX] == 0


@pytest.mark.parametrize("context_home", [False, True])
def test_a_replaced_table_is_emptied_by_the_next_apply_and_routing_stays_by_plan(
    context_home: bool,
) -> None:
    """Tables leave service whole and are freed a slice at a time one version later (so a
    route() that still held one during the swap saw it intact); with `context_home` the router
    keeps the last one as `previous_table`, so a table retires one version later still."""
    d = Dispatcher(
        NAMES, DispatcherConfig(build_yield_every=7, context_home=context_home), clock=Clock(1000.0)
    )
    sizes = []
    tables = []
    for v in range(1, 6):
        p = plan(v, 1_000_000)
        d.apply_plan(p)
        assert d.router.table is not None
        tables.append(d.router.table)
        sizes.append([len(t) for t in tables])
        for key, members in p.assignments().items():
            assert d.route(key) in {NAMES[i] for i in members}
    full = len(plan(1, 1_000_000).assignments())
    assert full > 7  # several slices of 7
    lag = 2 if context_home else 1  # versions a table stays referenced by the router
    for v, row in enumerate(sizes, start=1):
        for t, size in enumerate(row, start=1):
            # table t is emptied by the apply of version t + lag + 1
            assert size == (0 if v >= t + lag + 1 else full), (v, t, row)
