"""A fleet of G gateways: each routes only the requests dealt to it and sees only their completions.

Real deployments run many gateway replicas behind an L4 balancer. Each one keeps its own routing
state - in-flight counts, a reactive router's approximate prefix trees, CHWBL's loads - and learns
only of the requests it sent. One `Policy` instance is one gateway here:

* **deal** - which gateway takes request i: `round-robin` (i mod G, what an L4 balancer does with
  many short connections) or `client` (a stable hash of the routing key mod G: every request of a
  key reaches the same gateway, as with sticky client connections);
* **completions** - the engine reports finished request ids; each is released on the gateway that
  routed it, never on another;
* **shared plans** - plan-based policies (`planned.py`) share one planner: it sees every
  gateway's requests (the streams agent aggregates all of them) and builds one table per control
  interval; every gateway installs it `plan_delay_s` later (the plans topic's propagation),
  each into its own `Router`;
* **gossip** - with `sync_s` set, every `sync_s` seconds of replay time the gateways of a reactive
  policy that can (`Gossiping`: sglang, preble, chwbl, flat-lb) merge their state as peers that
  gossip would: each learns the blocks the others sent (prefix indexes), and with `sync_load`
  also the others' loads as of the sync. Without it a reactive baseline at G > 1 is judged on 1/G
  of the information a plan-based policy's shared planner gets; with it the comparison gives them
  their peers' view. Loads are not shared by default: measured on whale and conversation at
  G = 4, a load snapshot that stays fixed until the next sync herds every gateway away from the
  destinations that were busy at the sync and lowers sglang's, chwbl's and flat-lb's capacity,
  while shared prefix indexes alone raise sglang's and preble's - the fair comparison gives the
  baselines the better of the two. Plan-based policies ignore it (they share the plan already).

With G = 1 and no delay a fleet routes exactly as the single policy does (same random streams).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np

from cacheroute.dispatcher.routing import RoutingTable
from cacheroute.replay.errors import ReplayError
from cacheroute.replay.planned import _Planned
from cacheroute.replay.policies import make_policy
from cacheroute.replay.policy import Policy, PolicyContext
from cacheroute.replay.requestset import IntArray

__all__ = ["DEALS", "Deal", "Fleet", "FleetConfig", "Gossiping", "deal_requests"]

Deal = Literal["round-robin", "client"]
DEALS: tuple[Deal, ...] = ("round-robin", "client")

_SUMMED = ("routes", "decisions")
"""describe() entries that are per-gateway counters: the fleet reports their sums."""


@dataclass(frozen=True, slots=True)
class FleetConfig:
    """How many gateways, how requests reach them, and how fast a new plan reaches them."""

    gateways: int = 1
    deal: Deal = "round-robin"
    plan_delay_s: float = 0.0
    """Seconds (of replay time) from a plan's build to its use by every gateway."""
    sync_s: float | None = None
    """Reactive policies' gateways merge their state every this many replay seconds (None: never)."""
    sync_load: bool = False
    """With `sync_s`: share load views too, not only prefix indexes (see the module docstring)."""
    peer_loads_s: float | None = None
    """Plan-based policies' gateways report their own in-flight load per destination every
    this many replay seconds, and each counts the others' latest reports on top of its own
    (`Router.set_peer_loads`); None: each knows only its own."""

    def __post_init__(self) -> None:
        if self.gateways < 1:
            raise ReplayError("a fleet needs at least one gateway")
        if self.deal not in DEALS:
            raise ReplayError(f"deal must be one of {', '.join(DEALS)}, got {self.deal!r}")
        if not (math.isfinite(self.plan_delay_s) and self.plan_delay_s >= 0):
            raise ReplayError("plan_delay_s must be finite and >= 0")
        if self.sync_s is not None and not (math.isfinite(self.sync_s) and self.sync_s > 0):
            raise ReplayError("sync_s must be None or finite and > 0")
        if self.peer_loads_s is not None and not (
            math.isfinite(self.peer_loads_s) and self.peer_loads_s > 0
        ):
            raise ReplayError("peer_loads_s must be None or finite and > 0")


@runtime_checkable
class Gossiping(Protocol):
    """A policy whose gateways can merge their state (`FleetConfig.sync_s`).

    The fleet calls `start_sync` on every gateway before the first request; then at every sync
    it collects each gateway's `export_state` (its *own* state: what it routed, never what it
    merged, so no request is counted twice) before handing each gateway the others' exports.
    """

    def start_sync(self, fleet: Sequence[object]) -> None:
        """Start recording what the peers will need (e.g. a journal of inserted blocks).

        `fleet` is every gateway's policy, this one among them, for state the gateways keep
        together (the prefix-aware baselines' index as of the last sync).
        """

    def export_state(self, t: float) -> object:
        """This gateway's own state at the sync time t, to be read by its peers."""

    def merge_state(self, others: list[object], *, loads: bool) -> None:
        """Fold the other gateways' exports into this gateway's view (their loads if `loads`)."""


def deal_requests(ctx: PolicyContext, config: FleetConfig) -> IntArray:
    """The gateway of every request (see the module docstring)."""
    n, g = ctx.requests.n, config.gateways
    if config.deal == "round-robin":
        out: IntArray = np.arange(n, dtype=np.int64) % g
        return out
    per_key = (ctx.hashes >> np.uint64(17)) % np.uint64(g)  # high bits: independent of rings
    dealt: IntArray = per_key.astype(np.int64)[ctx.requests.key_index]
    return dealt


class Fleet:
    """G instances of one policy behind an L4 balancer; plan-based ones share the planner."""

    def __init__(self, name: str, ctx: PolicyContext, config: FleetConfig) -> None:
        self.config = config
        self.members: list[Policy] = [
            make_policy(name, ctx if g == 0 else ctx.for_gateway(g)) for g in range(config.gateways)
        ]
        self.gateway_of: list[int] = deal_requests(ctx, config).tolist()
        self.dest: list[int] = [0] * ctx.requests.n
        self._route = [m.route for m in self.members]
        self._release = [m.release for m in self.members]
        self._first = [m.first_token for m in self.members]
        self.wants_first_tokens = any(
            type(m).first_token is not Policy.first_token for m in self.members
        )
        """Whether any gateway acts on first tokens (the simulator skips them otherwise)."""
        leader = self.members[0]
        self.planner: _Planned | None = leader if isinstance(leader, _Planned) else None
        if self.planner is not None:  # the planner hears of every gateway's routes (events)
            self.planner.routed = self.dest
        self._finished: Callable[[int], None] | None = None
        """Appends a finished request to the planner's usage reports (`report_usage`)."""
        self.pending: deque[tuple[float, RoutingTable]] = deque()
        self.next_activation = math.inf
        self.gossip: list[Gossiping] = []
        self.syncs = 0
        self.first_t = float(ctx.requests.times[0]) if ctx.requests.n else 0.0
        """The first arrival: syncs and load reports fall on grids from it."""
        self.next_sync = math.inf
        if config.sync_s is not None and config.gateways > 1 and ctx.requests.n:
            gossip: list[Gossiping] = [m for m in self.members if isinstance(m, Gossiping)]
            if len(gossip) == len(self.members):
                self.gossip = gossip
                for m in gossip:
                    m.start_sync(gossip)
                self.next_sync = self.first_t + config.sync_s
        self.peers: list[_Planned] = []
        self.next_report = math.inf
        self.reports = 0
        if config.peer_loads_s is not None and config.gateways > 1 and ctx.requests.n:
            planned = [m for m in self.members if isinstance(m, _Planned)]
            if len(planned) == len(self.members):
                self.peers = planned
                self.next_report = self.first_t + config.peer_loads_s

    def route(self, i: int, t: float) -> int:
        """Destination of request i at time t, chosen by the gateway it was dealt to."""
        if t >= self.next_activation:
            self._activate(t)
        if t >= self.next_sync:
            self._sync(t)
        if t >= self.next_report:
            self._report_loads(t)
        d = self._route[self.gateway_of[i]](i, t)
        self.dest[i] = d
        return d

    def release(self, i: int) -> None:
        """Request i finished: only the gateway that sent it learns of it (and the planner, from
        its event, the cached tokens the engine reported)."""
        self._release[self.gateway_of[i]](self.dest[i], i)
        if self._finished is not None:
            self._finished(i)

    def report_usage(self, cached: IntArray) -> None:
        """Per request, the prompt tokens the engine served from cache (final once it has
        finished): the usage a gateway reads from each answer and puts in its event. The
        planner of a policy that plans on reported costs (`PlanConfig.reported_cost`) reads
        the finished requests' figures at each re-plan."""
        planner = self.planner
        if planner is not None and planner.reported_cost:
            planner.cached_view = cached
            self._finished = planner.finished.append

    def first_token(self, i: int) -> None:
        """Request i's first token streamed back: only the gateway that sent it sees it."""
        self._first[self.gateway_of[i]](self.dest[i], i)

    def tick(self, t: float, i: int) -> None:
        """Control-interval boundary: the shared planner re-plans; other policies get the tick."""
        if self.planner is None:
            for m in self.members:
                m.tick(t, i)
            return
        table = self.planner.build(t, i)
        if table is None:
            return
        self.pending.append((t + self.config.plan_delay_s, table))
        self.next_activation = self.pending[0][0]
        if self.config.plan_delay_s == 0.0:
            self._activate(t)

    def _activate(self, t: float) -> None:
        table = None
        while self.pending and self.pending[0][0] <= t:
            _, table = self.pending.popleft()
        if table is not None:
            for m in self.members:
                assert isinstance(m, _Planned)
                m.install(table)
        self.next_activation = self.pending[0][0] if self.pending else math.inf

    def _sync(self, t: float) -> None:
        """Every gateway merges the others' state (all export first, then all merge).

        Syncs fall on a fixed grid (first arrival + k * sync_s); one arrival after several
        grid points syncs once, as there was nothing new to gossip in between.
        """
        states = [m.export_state(t) for m in self.gossip]
        for g, m in enumerate(self.gossip):
            m.merge_state(states[:g] + states[g + 1 :], loads=self.config.sync_load)
        self.syncs += 1
        assert self.config.sync_s is not None
        self.next_sync = _next_on_grid(self.first_t, self.config.sync_s, t)

    def _report_loads(self, t: float) -> None:
        """Every gateway reports its own in-flight load; each then counts the sum of the
        others' reports on top of its own (what gateways reading each other's `GET /peer/loads`
        see, as of the report). On a fixed grid, like `_sync`."""
        own = [m.router.own_loads() for m in self.peers]
        n = len(own[0][0])
        units = [sum(o[0][d] for o in own) for d in range(n)]
        requests = sum(o[1] for o in own)
        for m, (mine, mine_requests) in zip(self.peers, own, strict=True):
            m.router.set_peer_loads(
                [units[d] - mine[d] for d in range(n)], requests - mine_requests
            )
        self.reports += 1
        assert self.config.peer_loads_s is not None
        self.next_report = _next_on_grid(self.first_t, self.config.peer_loads_s, t)

    def describe(self) -> dict[str, Any]:
        """The first gateway's counters, with per-gateway decision counts summed over the fleet."""
        each = [m.describe() for m in self.members]
        out = dict(each[0])
        for key in _SUMMED:
            if isinstance(out.get(key), dict):
                total: dict[str, Any] = {}
                for d in each:
                    for k, v in d.get(key, {}).items():
                        total[k] = total.get(k, 0) + v
                out[key] = total
        if "spilled_requests" in out:
            out["spilled_requests"] = sum(int(d.get("spilled_requests", 0)) for d in each)
        out["gateways"] = self.config.gateways
        out["deal"] = self.config.deal
        if self.gossip:
            out["sync_s"] = self.config.sync_s
            out["syncs"] = self.syncs
        if self.peers:
            out["peer_loads_s"] = self.config.peer_loads_s
            out["load_reports"] = self.reports
        return out


def _next_on_grid(t0: float, step: float, t: float) -> float:
    """The first point of the grid t0 + k * step after t (one arrival after several grid
    points acts once, as nothing new happened in between; never t itself, whatever the
    rounding)."""
    k = math.floor((t - t0) / step) + 1
    after = t0 + k * step
    return after if after > t else t + step
