"""`Dispatcher`: what a gateway embeds to route requests by the live plan.

It wraps the pure `Router` with the parts that touch time and threads: applying new plan versions
(built off the routing path, swapped in with one reference assignment), the staleness rule (a plan
older than `staleness_intervals` control intervals -> the cold path for everything, with one log
line per transition), optional health checks, and metrics. The Kafka subscription that feeds
`apply_plan` is `follow()` (see dispatcher/subscription.py); tests and simulators call `apply_plan`
directly.

How old a plan is: the first version a gateway takes (at start, or after a silence longer than
the limit) may be a dead planner's last, so it is judged by its stamp, `created_ms`, against this
gateway's clock. Once versions keep coming, each is judged by when it *arrived*, on this
gateway's clock alone: a planner that publishes every interval is alive whatever its clock
says. Judged by stamps only, one planner host whose clock ran ten minutes slow (or five seconds
fast) made every gateway of the fleet route by the cold path for as long as it lasted, with
fresh plans arriving every interval; `cacheroute doctor` still names such a clock.
"""

from __future__ import annotations

import logging
import math
import random
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from itertools import islice

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from cacheroute.dispatcher.errors import DispatchError
from cacheroute.dispatcher.peers import LoadReport, PeerLoads
from cacheroute.dispatcher.routing import (
    COMPILED_FROM,
    DEFAULT_COLD_LOAD_FACTOR,
    DEFAULT_SPILL_FACTOR,
    DEFAULT_SPILL_MIN_INFLIGHT,
    DEFAULT_UNIT_TOKENS,
    InFlight,
    KeyGroups,
    PlanLike,
    RouteKind,
    Router,
    RoutingTable,
    table_from_plan,
)
from cacheroute.settings import Settings

__all__ = ["Dispatcher", "DispatcherConfig", "InFlight"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DispatcherConfig:
    """Knobs of a gateway's dispatcher."""

    staleness_intervals: float = 3.0
    """A plan older than this many control intervals is stale (the paper's fallback rule)."""
    control_interval_s: float = 60.0
    """Used when a plan does not say its own interval."""
    maintenance_interval_s: float = 1.0
    """How often the background thread re-checks staleness and runs the health check."""
    max_clock_skew_s: float = 5.0
    """A first version (see the module docstring) created further than this in the future of
    this gateway's clock is stale too.

    Its age is negative, and a negative age never reaches the staleness limit: the last plan of a
    dead planner whose clock runs fast would stay live for as long as its clock is ahead. Hosts
    synchronised by NTP differ by milliseconds; this allows for a host without it, and a planner
    clock ahead by less than this only delays noticing a dead planner by as much."""
    build_yield_every: int = 500
    """Keys per slice while building a routing table; between slices the builder yields the GIL
    once at least 0.5 ms of work has passed since its last yield (`_Paced`)."""
    spill_factor: float | None = DEFAULT_SPILL_FACTOR
    """A planned destination holding this many times the mean in-flight count is overloaded: the
    request goes by power-of-two-choices instead (counted as `spilled`). None: the paper's rule."""
    spill_min_inflight: int = DEFAULT_SPILL_MIN_INFLIGHT
    """...once it has at least this many requests in flight from this gateway. With G gateways in
    front of engines that batch B sequences, about B / G is a good value."""
    cold_affinity: bool = True
    """Keys the plan does not admit go by bounded-load consistent hashing, the same ring on every
    gateway, so a new conversation keeps its replica before any plan admits it. False: the
    paper's power-of-two-choices."""
    cold_load_factor: float = DEFAULT_COLD_LOAD_FACTOR
    """The cold path's load bound as a multiple of the mean in-flight count (CHWBL's c)."""
    cold_choices: int = 2
    """A key new to this gateway goes to the less loaded of its 2 consistent candidates (1: the
    first only)."""
    unit_tokens: int = DEFAULT_UNIT_TOKENS
    """`request(key, prompt_tokens=P)` weighs a request 1 + P's tokens not expected in the
    destination's cache // this (`Router.work_units`)."""
    context_slack: bool = True
    """A key may stay where its context is cached past the load bounds by what recomputing the
    context would cost (`Router.context_slack`; needs `prompt_tokens`)."""
    spill_home: bool = False
    """Set only when this is the cluster's one gateway: a planned key balances between its
    planned destination and its spill home (`Router.spill_home`)."""
    context_home: bool = False
    """Set only when this is the cluster's one gateway: a key new in the live plan stays where
    its context is cached while that is the cheaper choice (`Router.context_home`)."""
    switch_interval_s: float | None = 0.0005
    """Python's thread switch interval while this dispatcher runs (`start()`, `follow()`): a
    table built in the background holds the GIL until the interpreter hands it over, which it
    forces only after this long (5 ms by default) - so a route() call on the serving thread
    waited up to that whenever the builder's own pauses did not hand it over - always, once a
    third thread wants the GIL too. Measured with `bench dispatcher` (128k-key versions, 20 of
    them), 5 ms -> 0.5 ms: receive stall p99 7.8 -> 6.1 ms; with a CPU-bound thread competing,
    p50 17.5 -> 4.9 ms and max 28 -> 7.9 ms. It costs nothing while only one thread runs.
    Lowered only, never raised; None leaves the interpreter's setting alone."""
    cache_tokens: int | None = None
    """Set only when this is the cluster's one gateway: each destination's KV cache capacity in
    tokens, so a key's context counts as cached only while it can still fit there
    (`Router.cache_tokens`); None: cached until the key moves."""
    prefix_blocks: int = 0
    """Set only when this is the cluster's one gateway: remember this many prompt blocks per
    destination, so a key new to the cold path goes where its prompt's leading blocks went
    (`Router.prefix_blocks`; pass `blocks` to `request`). 0: off."""
    cold_cost: bool = False
    """Set only when this is the cluster's one gateway, with `prefix_blocks`: a cold key that has
    to be placed goes where its prompt's missing blocks plus the destination's recent cache
    churn cost least (`Router.cold_cost`)."""

    def __post_init__(self) -> None:
        if self.switch_interval_s is not None and not (
            math.isfinite(self.switch_interval_s) and self.switch_interval_s > 0
        ):
            raise DispatchError(
                f"switch_interval_s must be > 0 (or None), got {self.switch_interval_s!r}"
            )


class Dispatcher:
    """Routes requests of one gateway. Thread-safe; `route`/`acquire`/`release` never raise."""

    def __init__(
        self,
        destinations: Sequence[str],
        config: DispatcherConfig | None = None,
        *,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.time,
        health_check: Callable[[str], bool] | None = None,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.config = config or DispatcherConfig()
        # S311: load balancing, not cryptography
        self.router = Router(
            list(destinations),
            rng=rng or random.Random(),  # noqa: S311
            spill_factor=self.config.spill_factor,
            spill_min_inflight=self.config.spill_min_inflight,
            cold_affinity=self.config.cold_affinity,
            cold_load_factor=self.config.cold_load_factor,
            cold_choices=self.config.cold_choices,
            unit_tokens=self.config.unit_tokens,
            context_slack=self.config.context_slack,
            spill_home=self.config.spill_home,
            context_home=self.config.context_home,
            cache_tokens=self.config.cache_tokens,
            prefix_blocks=self.config.prefix_blocks,
            cold_cost=self.config.cold_cost,
        )
        self.clock = clock
        self.health_check = health_check
        self.registry = registry or CollectorRegistry()
        self.registry.register(_DispatcherCollector(self))
        self._apply_lock = threading.Lock()
        self._key_groups: KeyGroups | None = None
        """Keys' sibling groups remembered across plan versions (used under `_apply_lock`)."""
        self._retired: list[RoutingTable] = []
        """Tables replaced by the last swap, emptied a slice at a time by the next `apply_plan`
        (freeing a 60k-key table in one go holds the GIL for about half a millisecond)."""
        self._mode_lock = threading.Lock()
        self._interval_s = self.config.control_interval_s
        self._arrived_s: float | None = None
        """This gateway's clock when the live plan was applied."""
        self._following = False
        """Whether the live plan came while this gateway followed the planner's versions (its
        previous one within the staleness limit): then its age is time since it arrived."""
        self._mode = "no_plan"
        self._warned: set[str] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.swaps = 0
        self.subscription: object | None = None
        # the hot path, bound once
        self.request = self.router.hold  # type: ignore[method-assign]  # same signature
        self.route = self.router.route
        self.route_index = self.router.route_index
        self.acquire = self.router.acquire
        self.release = self.router.release
        log.warning(
            "no plan yet: routing everything by %s",
            "bounded-load consistent hashing"
            if self.config.cold_affinity
            else "power-of-two-choices",
        )

    # ------------------------------------------------------------------------------ routing
    def request(
        self,
        key: str,
        units: int = 1,
        *,
        prompt_tokens: int | None = None,
        session: str | None = None,
        blocks: Sequence[int] | None = None,
    ) -> InFlight:
        """Route `key` and count it in flight until the `with` block ends; `as` gives the name.

            with dispatcher.request(key, prompt_tokens=n) as destination:
                ...  # send the request, stream the answer; released when the block exits

        The request's load: with `prompt_tokens`, 1 + the prompt's tokens not expected in the
        destination's cache // `unit_tokens` (a conversation's next turn, sent where its last
        turn went, weighs only its new message; `Router.work_units`), and the key gets its
        context slack; call `first_token()` on the returned object when the first byte of the
        answer arrives to keep only the decode unit. Without, `units` (1: balance request
        counts). The request is routed and counted at the call, so an async gateway may also
        keep the returned object and call `release()` itself when the last byte went out.
        `session`: the request's conversation when `key` is coarser (a tenant, a system prompt):
        a planned key's replicas then share its conversations and each conversation stays where
        its history is cached (`Router.route_index`). `blocks`: the prompt's chained block
        hashes (`openai_api.prefix_block_hashes`), for `prefix_blocks`. Never raises.
        """
        # each instance binds `request` to `Router.hold` in __init__ (no frame of its own on
        # the hot path); this body runs only if a caller reaches the class attribute
        return self.router.hold(
            key, units, prompt_tokens=prompt_tokens, session=session, blocks=blocks
        )

    def load_report(self, gateway_id: str) -> LoadReport:
        """This gateway's own in-flight load (without its peers'), for the other gateways."""
        own, requests = self.router.own_loads()
        return LoadReport(gateway_id, dict(zip(self.router.names, own, strict=True)), requests)

    def apply_peer_loads(self, peers: PeerLoads, now: float) -> None:
        """Count the live peers' latest loads on top of this gateway's own (see
        `cacheroute.dispatcher.peers`); `now` on the clock `peers` was updated with."""
        units, requests = peers.totals(now)
        self.router.set_peer_loads(units, requests)

    def mark_down(self, name: str) -> None:
        """Exclude a destination at once (unknown names are logged once and ignored)."""
        if not self.router.mark_down(name):
            self._warn_once(
                f"down:{name}", "mark_down(%r): not a destination of this gateway", name
            )

    def mark_up(self, name: str) -> None:
        """Include a destination again."""
        if not self.router.mark_up(name):
            self._warn_once(f"up:{name}", "mark_up(%r): not a destination of this gateway", name)

    # --------------------------------------------------------------------------------- plans
    @property
    def table(self) -> RoutingTable | None:
        """The live routing table (None before the first plan)."""
        return self.router.table

    @property
    def version(self) -> int | None:
        """Version of the live plan."""
        table = self.router.table
        return None if table is None else table.version

    def apply_plan(self, plan: PlanLike, control_interval_s: float | None = None) -> bool:
        """Build the routing table of `plan` off the routing path and swap it in.

        Returns False (and keeps the live plan) when `plan` is not newer than the live one. The
        table is built in slices of `build_yield_every` keys with a `time.sleep(0)` once at least
        `_PAUSE_BUDGET_S` (0.25 ms) of work has passed, so a router thread waiting for the GIL gets
        it within about that long. The table this one replaces is kept whole until the next
        apply, which empties it in the same paced slices before building (`_drain`): freeing a
        60k-key table at once held the GIL ~0.5 ms.
        """
        with self._apply_lock:
            live = self.router.table
            if live is not None and plan.version <= live.version:
                return False
            sep = getattr(getattr(plan, "params", None), "group_separator", None)
            if sep and (self._key_groups is None or self._key_groups.separator != sep):
                self._key_groups = KeyGroups(sep)
            pause = _Paced(_yield_gil)
            step = self.config.build_yield_every
            retired, self._retired = self._retired, []
            for old in retired:  # out of service for a whole version: no route() holds them
                _drain(old, pause, step)
            del retired
            table = table_from_plan(
                plan, self.router.names, yield_every=step, pause=pause, key_groups=self._key_groups
            )
            router = self.router
            replaced = [t for t in (router.table, router.previous_table) if t is not None]
            # arrived while following the versions (the last one within the limit then in force)?
            now = self.clock()
            previous = self._arrived_s
            limit = self.config.staleness_intervals * self._interval_s
            self._following = previous is not None and 0.0 <= now - previous <= limit
            self._arrived_s = now
            router.install(table)  # the swap: one reference assignment
            self._retired = [
                t for t in replaced if t is not router.table and t is not router.previous_table
            ]
            self.swaps += 1
            if control_interval_s is not None:
                self._interval_s = control_interval_s
            else:
                params = getattr(plan, "params", None)
                self._interval_s = float(
                    getattr(params, "control_interval_s", self.config.control_interval_s)
                )
            for name in sorted(table.unknown_destinations):
                self._warn_once(
                    f"unknown:{name}",
                    "plan v%d names destination %r that this gateway does not know; its keys "
                    "use their other replicas or the cold path",
                    table.version,
                    name,
                )
            for name in sorted(table.unplanned_destinations):
                self._warn_once(
                    f"unplanned:{name}",
                    "destination %r is not in plan v%d; it only takes cold-path traffic",
                    name,
                    table.version,
                )
            self.check_staleness(now)
            return True

    def check_staleness(self, now: float | None = None) -> bool:
        """Set the router's stale flag from the live plan's age; log once per transition."""
        table = self.router.table
        if table is None:
            return True
        now = self.clock() if now is None else now
        limit = self.config.staleness_intervals * self._interval_s
        arrived = self._arrived_s
        if self._following and arrived is not None:  # a live version: its age is since arrival
            age = now - arrived
            future = False
            stale = age > limit
            mode = "silent" if stale else "plan"
        else:  # the first version taken: it may be a dead planner's last, so its stamp counts
            age = now - table.created_ms / 1000.0
            future = age < -self.config.max_clock_skew_s
            stale = future or age > limit
            mode = "future" if future else "stale" if stale else "plan"
        self.router.stale = stale
        with self._mode_lock:  # the apply, maintenance and caller threads all check
            if mode == self._mode:
                return stale
            self._mode = mode
            # A first version's age is this gateway's clock against a stamp of the planner's:
            # from here neither clock can be told wrong, so the lines name both and say how to
            # tell (a third host judging the same plan; the plan's Kafka record time is not kept
            # by the follower, and with CreateTime it is the planner's clock again anyway).
            if future:
                log.warning(
                    "plan v%d was created %.0f s in the future of this gateway's clock (more "
                    "than the %g s allowed for clock skew): either the planner's clock is ahead "
                    "or this gateway's clock is behind. To tell which, compare both hosts with "
                    "NTP (chronyc tracking / timedatectl), or run `cacheroute doctor` on another "
                    "host: if it finds the plan fresh, this gateway's clock is the wrong one. "
                    "Treating the plan as stale, routing everything by the cold path until the "
                    "next version arrives (versions that keep coming count from their arrival)",
                    table.version,
                    -age,
                    self.config.max_clock_skew_s,
                )
            elif mode == "silent":
                log.warning(
                    "no plan newer than v%d for %.0f s (limit %.0f s): routing everything by "
                    "the cold path (no plan) until a new version arrives. The planner stopped "
                    "publishing, or this gateway stopped receiving its versions: run "
                    "`cacheroute doctor`",
                    table.version,
                    age,
                    limit,
                )
            elif stale:
                log.warning(
                    "plan v%d is %.0f s old by this gateway's clock (limit %.0f s): routing "
                    "everything by the cold path (no plan) until a fresh plan arrives. Either "
                    "the planner stopped publishing, or the clocks disagree (the planner's clock "
                    "behind or this gateway's clock ahead): if `cacheroute doctor` on another "
                    "host finds the plan fresh, check this gateway's clock. The next version to "
                    "arrive counts from its arrival",
                    table.version,
                    age,
                    limit,
                )
            else:
                log.warning("routing by plan v%d (%d admitted keys)", table.version, len(table))
        return stale

    def plan_age_s(self) -> float | None:
        """Seconds since the live plan was built."""
        table = self.router.table
        return None if table is None else self.clock() - table.created_ms / 1000.0

    def follow(self, settings: Settings, *, client_id: str = "cacheroute-gateway") -> Dispatcher:
        """Subscribe to the plans topic (background thread) and start maintenance; returns self."""
        from cacheroute.dispatcher.subscription import follow_plans  # noqa: PLC0415 - Kafka edge

        follow_plans(self, settings, client_id=client_id)
        return self.start()

    # ------------------------------------------------------------------------- maintenance
    def start(self) -> Dispatcher:
        """Start the background thread for staleness and health checks (idempotent).

        Also lowers Python's thread switch interval to `switch_interval_s` (see its doc): from
        now on tables may be built on another thread while this one routes."""
        wanted = self.config.switch_interval_s
        if wanted is not None and sys.getswitchinterval() > wanted:
            log.info(
                "thread switch interval %.2f ms -> %.2f ms: route() waits less for the GIL "
                "while a plan's table is built",
                sys.getswitchinterval() * 1e3,
                wanted * 1e3,
            )
            sys.setswitchinterval(wanted)
        if self._thread is None:
            log.info(
                "routing runs %s",
                "compiled (mypyc)"
                if COMPILED_FROM is not None
                else "as Python: about half the decisions per second of the compiled module "
                "(installed with CACHEROUTE_PURE_PYTHON=1 or without a C compiler; see README)",
            )
            self._thread = threading.Thread(
                target=self._maintain, name="cacheroute-dispatcher", daemon=True
            )
            self._thread.start()
        return self

    def _maintain(self) -> None:
        while not self._stop.wait(self.config.maintenance_interval_s):
            try:
                self.check_staleness()
                if self.health_check is not None:
                    for name in self.router.names:
                        ok = bool(self.health_check(name))
                        if ok != self.router.is_up(name):
                            (self.router.mark_up if ok else self.router.mark_down)(name)
            except Exception:  # a broken hook must not kill maintenance
                log.exception("dispatcher maintenance failed; retrying next interval")

    def close(self) -> None:
        """Stop background work (and the plan subscription, if any)."""
        self._stop.set()
        close = getattr(self.subscription, "close", None)
        if callable(close):
            close()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> Dispatcher:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _warn_once(self, tag: str, msg: str, *args: object) -> None:
        if tag not in self._warned:
            self._warned.add(tag)
            log.warning(msg, *args)


def _yield_gil() -> None:
    time.sleep(0)


_PAUSE_BUDGET_S = 0.00025
"""Work between two GIL yields while a plan's routing table is built (0.25 ms; see `_Paced`):
half the thread switch interval, so a router thread waiting for the GIL gets it from the builder's
own yield before the interpreter would force one (compiled table code never checks for that)."""


def _drain(table: RoutingTable, pause: Callable[[], None], step: int) -> None:
    """Empty a retired table's dicts with `pause()` between slices of at most `step` keys.

    Dropping a whole table at once decrefs (and, where it held the last reference, frees) every
    key in one C-level pass that holds the GIL (~0.5-1.5 ms for 61k keys). Here the keys are
    first collected into a list (`step` at a time; nothing mutates a retired table), the dict is
    cleared while that list keeps every key alive (decrefs only: ~0.2 ms for 61k), and the list
    is then cut from its end `step` keys at a time: each cut frees its keys in one C-level
    loop. (Popping the dict entry by entry did the same in a Python-level loop: 5-10 ms of a
    follower's CPU per plan version against ~2 ms this way, measured on a 61k-key table.)
    """
    step = max(1, step)
    for d in (*table.shards, table.multi, table.groups):
        if not isinstance(d, dict) or not d:
            continue
        held: list[object] = []
        keys = iter(d)
        while part := list(islice(keys, step)):
            held += part
            pause()
        del keys
        d.clear()
        pause()
        while held:
            del held[-step:]
            pause()


class _Paced:
    """A `pause` that runs at most once per `budget_s` of work: call it as often as convenient.

    Background builders call `pause()` between small steps so a routing thread waiting for the GIL
    gets it quickly; each real pause (`time.sleep(0)`) costs a syscall and, on a loaded machine, a
    trip through the scheduler (~70 us measured). Pausing by elapsed time instead of by a fixed
    count of steps keeps the longest GIL hold near `budget_s` while skipping the pauses that would
    come sooner than needed.
    """

    __slots__ = ("_budget", "_last", "_pause")

    def __init__(self, pause: Callable[[], None], budget_s: float = _PAUSE_BUDGET_S) -> None:
        self._pause = pause
        self._budget = budget_s
        self._last = time.perf_counter()

    def __call__(self) -> None:
        now = time.perf_counter()
        if now - self._last >= self._budget:
            self._pause()
            self._last = time.perf_counter()


class _DispatcherCollector(Collector):
    """Exports the router's plain-int counters on scrape (no metric objects on the hot path)."""

    def __init__(self, dispatcher: Dispatcher) -> None:
        self.d = dispatcher

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        router = self.d.router
        routed = CounterMetricFamily(
            "cacheroute_dispatcher_routed", "Routing decisions by reason", labels=["reason"]
        )
        for kind, name in enumerate(RouteKind.NAMES):
            routed.add_metric([name], router.counts[kind])
        yield routed
        inflight = GaugeMetricFamily(
            "cacheroute_dispatcher_inflight",
            "Load units this gateway has in flight",
            labels=["destination"],
        )
        peer = GaugeMetricFamily(
            "cacheroute_dispatcher_peer_inflight",
            "Load units the peer gateways last reported in flight (counted on top)",
            labels=["destination"],
        )
        up = GaugeMetricFamily(
            "cacheroute_dispatcher_up", "Destination routable", labels=["destination"]
        )
        own, _ = router.own_loads()
        for i, name in enumerate(router.names):
            inflight.add_metric([name], own[i])
            peer.add_metric([name], router.inflight[i] - own[i])
            up.add_metric([name], 1.0 if router.up[i] else 0.0)
        yield inflight
        yield peer
        yield up
        yield GaugeMetricFamily(
            "cacheroute_dispatcher_plan_version",
            "Live plan version (0: none)",
            value=self.d.version or 0,
        )
        yield GaugeMetricFamily(
            "cacheroute_dispatcher_plan_stale",
            "1 while routing falls back for staleness",
            value=1.0 if router.stale else 0.0,
        )
        age = self.d.plan_age_s()
        yield GaugeMetricFamily(
            "cacheroute_dispatcher_plan_age_seconds", "Age of the live plan", value=age or 0.0
        )
