"""A serving destination dies mid-run while three gateways route by real plans from Kafka.

Each gateway is a `Dispatcher` following the plans topic, routing on its own thread with requests
held in flight. The health check of every gateway marks one destination down in the middle of the
run, and the planner (not knowing yet) publishes a new version that still names it. What is lost:
nothing — no route fails or returns an unknown destination, no request goes to the dead
destination after `mark_down` returned, every admitted key stays inside its T(b) while a member of
T(b) lives (and goes to a live destination by power-of-two-choices when none does) unless the
dispatcher spilled it off an overloaded member (the cold path, which never picks a down
destination either), and the destination takes traffic again after `mark_up`.
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field

from cacheroute.dispatcher.dispatcher import Dispatcher
from cacheroute.dispatcher.routing import RouteKind
from cacheroute.planner import Plan
from cacheroute.settings import Settings
from cacheroute.topics import ensure_topics
from tests.integration.planservice_support import make_plan, started_publisher

NAMES = [f"gpu-{i}" for i in range(8)]
DEAD = "gpu-3"


def _plan(version: int, seed: int) -> Plan:
    now = int(time.time() * 1000)
    return make_plan(3000, version=version, seed=seed, created_ms=now - version)


def _allowed(plan: Plan) -> dict[str, frozenset[str]]:
    names = plan.destination_names
    return {k: frozenset(names[t] for t in ts) for k, ts in plan.assignments().items()}


@dataclass
class Gateway:
    dispatcher: Dispatcher
    seed: int
    down_begin: float = 0.0  # perf_counter before mark_down was called
    down_since: float | None = None  # perf_counter when mark_down returned
    up_begin: float = 0.0  # before mark_up was called
    up_since: float = 0.0  # when mark_up returned
    log: list[tuple[float, float, int | None, str, str, int | None, bool]] = field(
        default_factory=list
    )
    """(started, ended, version before, key, destination, version after if unchanged, spilled):
    a route's call lies between `started` and `ended` (the thread may be switched out anywhere
    in between, so only that interval says which state of a destination it may have seen)."""
    errors: list[BaseException] = field(default_factory=list)


def _drive(gw: Gateway, keys: list[str], stop: threading.Event) -> None:
    rng = random.Random(gw.seed)
    held: list[int] = []
    d = gw.dispatcher
    try:
        while not stop.is_set():
            for key in rng.sample(keys, 200):
                before = d.version
                spills = d.router.counts[RouteKind.SPILLED]
                started = time.perf_counter()
                i = d.route_index(key)
                ended = time.perf_counter()
                after = d.version
                spilled = d.router.counts[RouteKind.SPILLED] != spills
                d.acquire(i)
                held.append(i)
                while len(held) > rng.randint(0, 30):
                    d.release(held.pop(rng.randrange(len(held))))
                gw.log.append(
                    (
                        started,
                        ended,
                        before,
                        key,
                        d.router.names[i],
                        after if after == before else None,
                        spilled,
                    )
                )
            time.sleep(0.001)
    except BaseException as exc:  # recorded and asserted on
        gw.errors.append(exc)
    finally:
        for i in held:
            d.release(i)


def test_destination_down_mid_run_routes_nothing_to_it_and_keeps_keys_in_their_sets(
    settings: Settings,
) -> None:
    ensure_topics(settings)
    v1, v2 = _plan(1, seed=21), _plan(2, seed=22)
    allowed = {1: _allowed(v1), 2: _allowed(v2)}
    keys = [*list(v1.keys)[:1500], *list(v2.keys)[:1500], *[f"cold-{i}" for i in range(300)]]
    stop = threading.Event()
    gateways: list[Gateway] = []
    threads: list[threading.Thread] = []
    with started_publisher(settings, settings.topic_prefix + "down") as publisher:
        publisher.publish(v1)
        try:
            for seed in (1, 2, 3):
                d = Dispatcher(NAMES, rng=random.Random(seed)).follow(settings)
                gateways.append(Gateway(d, seed))
            deadline = time.monotonic() + 60
            while any(gw.dispatcher.version != 1 for gw in gateways):
                assert time.monotonic() < deadline, "gateways never applied version 1"
                time.sleep(0.05)
            threads = [
                threading.Thread(target=_drive, args=(gw, keys, stop), daemon=True)
                for gw in gateways
            ]
            for t in threads:
                t.start()
            time.sleep(1.0)
            for gw in gateways:  # the health check notices the dead replica
                gw.down_begin = time.perf_counter()
                gw.dispatcher.mark_down(DEAD)
                gw.down_since = time.perf_counter()
            time.sleep(1.0)
            publisher.publish(v2)  # the planner does not know yet: v2 still uses DEAD
            deadline = time.monotonic() + 60
            while any(gw.dispatcher.version != 2 for gw in gateways):
                assert time.monotonic() < deadline, "gateways never applied version 2"
                time.sleep(0.05)
            time.sleep(1.0)
            for gw in gateways:
                sample = gw.dispatcher.registry.get_sample_value(
                    "cacheroute_dispatcher_up", {"destination": DEAD}
                )
                assert sample == 0.0
            for gw in gateways:
                gw.up_begin = time.perf_counter()
                gw.dispatcher.mark_up(DEAD)
                gw.up_since = time.perf_counter()
            time.sleep(1.0)
        finally:
            stop.set()
            for t in threads:
                t.join(timeout=10)
            for gw in gateways:
                gw.dispatcher.close()

    for gw in gateways:
        _verify(gw, allowed)


def _verify(gw: Gateway, allowed: dict[int, dict[str, frozenset[str]]]) -> None:
    """Nothing to the dead destination while down, keys inside T(b), no failed route.

    Routes whose call overlapped `mark_down`/`mark_up` may see either state: they are checked
    only for landing on a known destination.
    """
    assert not gw.errors, gw.errors
    assert gw.down_since is not None
    counts = gw.dispatcher.router.counts
    assert counts[RouteKind.PLAN_DOWN] > 0  # keys whose whole T(b) was DEAD
    assert sum(gw.dispatcher.router.inflight) == 0
    during = after_up = to_dead_while_down = checked = 0
    for started, ended, version, key, dest, same, spilled in gw.log:
        assert dest in NAMES
        # the whole call after mark_down returned and before mark_up began: it saw the
        # destination down; the whole call before mark_down began or after mark_up returned:
        # up; calls that overlap either may have seen either state
        down = gw.down_since < started and ended < gw.up_begin
        up = ended < gw.down_begin or started > gw.up_since
        if down:
            during += 1
            to_dead_while_down += dest == DEAD
        elif started > gw.up_since:
            after_up += dest == DEAD
        if not (up or down) or version is None or same is None:
            continue  # the live version changed during this very call
        if spilled:  # an overloaded member: the cold path, which never picks a down destination
            continue
        members = allowed[version].get(key)
        if members is None:
            continue  # cold key: power-of-two-choices
        live = members - {DEAD} if down else members
        if live:
            assert dest in live, (version, key, dest, sorted(members), down)
            checked += 1
        else:
            assert dest != DEAD
    assert during > 1000
    assert to_dead_while_down == 0
    assert checked > 1000
    assert after_up > 0  # back in service after mark_up
