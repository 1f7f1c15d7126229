"""Plan-based policies: the ablation steps `affinity`, `affinity+replication` and the full `cacheroute`.

All three run the *real* code: admission comes from the planner's `build_plan`, routing tables from
the dispatcher (`table_from_plan` for CacheRoute - what `Dispatcher.apply_plan` builds - and
`build_table` for the hash placements), and every request is routed by the dispatcher's `Router` (admitted
key -> least-loaded member of T(b) by in-flight count; any other key -> power-of-two-choices). Only
the placement differs, which is what the ablation isolates:

* `affinity` - Algorithm 1's admission with k_b forced to 1 (no replication), each admitted key on
  one destination chosen by rendezvous hashing (pinning, hash placement);
* `affinity+replication` - Algorithm 1's admission and k_b = ceil(rate / q_cap), the k_b
  destinations chosen by rendezvous hashing (hash placement, no LPT);
* `affinity+replication+lpt` - Algorithm 1 as published: admission, replication, LPT placement
  from the cold-tail load, with our churn-aware re-planning (hysteresis, few moves);
* `cacheroute` - planner and dispatcher as deployed: the above plus our three extensions,
  fair-share sizing (`PlannerParams.fair_share`: no replica of a key above the mean destination
  load), sibling co-location (`PlannerParams.group_separator`: keys of one tenant share
  destinations) and the dispatcher's overload spill (`Router.spill_factor`: a planned request
  whose destination holds twice the mean in-flight count goes by P2C).

Every control interval (`PlanConfig.control_interval_s` of replay time) each policy re-plans from the
per-key rates observed so far in the replay - request counts since the start over the elapsed
time, or, with `rate_decay` d < 1, counts decayed by d per interval (an exponential window of about
interval / (1 - d)) - and swaps the Router's table; before the first plan every request is cold
(P2C). With
`PlanConfig.oracle` the plan is built once, up front, from the true rates of the whole replay.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from cacheroute.dispatcher.routing import (
    DEFAULT_UNIT_TOKENS,
    RouteKind,
    Router,
    RoutingTable,
    build_table,
    table_from_plan,
)
from cacheroute.planner import Plan, PlannerParams, build_plan, plan_diff
from cacheroute.planner.work import work_rates
from cacheroute.replay.policy import Policy, PolicyContext, UIntArray
from cacheroute.replay.requestset import FloatArray, IntArray

__all__ = ["Affinity", "AffinityReplication", "CacheRoute", "PaperLPT", "rendezvous_order"]

_HUGE_Q_CAP = 1e300  # k_b = ceil(rate / q_cap) = 1 for every key: affinity without replication


def _mix(x: UIntArray) -> UIntArray:
    """splitmix64 finaliser (vectorised, wraps mod 2**64)."""
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    out: UIntArray = x ^ (x >> np.uint64(31))
    return out


def rendezvous_order(hashes: UIntArray, destinations: int) -> IntArray:
    """Per key, destinations by rendezvous (highest-random-weight) score, best first. (n, R)."""
    salts = _mix(np.arange(1, destinations + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15))
    scores = _mix(hashes[:, None] ^ salts[None, :])
    out: IntArray = np.argsort(scores, axis=1, kind="stable")[:, ::-1].astype(np.int64)
    return out


class _Planned(Policy):
    """Observed-rate re-planning and Router dispatch; subclasses decide the assignments."""

    extensions = False
    """Whether the policy runs our extensions (fair share, siblings, spill) or the paper's rules."""

    def __init__(self, ctx: PolicyContext) -> None:
        super().__init__(ctx)
        cfg = ctx.plan
        self.router = Router(
            ctx.names,
            rng=ctx.random(1),
            spill_factor=cfg.spill_factor if self.extensions else None,
            spill_min_inflight=cfg.spill_min_inflight,
            cold_affinity=cfg.cold_affinity and self.extensions,
            cold_load_factor=cfg.cold_load_factor,
            unit_tokens=cfg.work_unit_tokens or DEFAULT_UNIT_TOKENS,
            context_slack=cfg.context_slack and self.extensions,
            spill_home=cfg.spill_home and self.extensions,
            context_home=cfg.context_home and self.extensions,
            cache_tokens=ctx.service.cache_tokens if cfg.cache_aware and self.extensions else None,
            prefix_blocks=(
                ctx.service.cache_tokens // ctx.requests.block_tokens
                if cfg.prefix_affinity and self.extensions
                else 0
            ),
            cold_cost=cfg.cold_cost and cfg.prefix_affinity and self.extensions,
        )
        self.inflight = self.router.inflight
        self.keys = ctx.requests.keys
        unit = cfg.work_unit_tokens if self.extensions else None
        q = ctx.requests
        self.unit_tokens = unit
        self.prompts: list[int] = q.prompt_tokens.tolist()
        self.units: list[int] = [1] * q.n
        self.all_key_index = ctx.requests.key_index
        self.sessions = ctx.sessions if self.extensions else None
        self.block_offsets: list[int] | None = (
            q.block_offsets.tolist() if cfg.prefix_affinity and self.extensions else None
        )
        """Per request, where its prompt's blocks start in `q.block_ids` (prefix affinity)."""
        self.params = PlannerParams(
            q_cap=cfg.q_cap,
            warm_slots=cfg.warm_slots,
            control_interval_s=cfg.control_interval_s,
            imbalance_tolerance=cfg.imbalance_tolerance,
            hysteresis=cfg.hysteresis,
            # Algorithm 1's sizing and plain LPT unless this policy runs our extensions
            fair_share=cfg.fair_share if self.extensions else None,
            group_separator=cfg.group_separator if self.extensions else None,
        )
        self.window_start = 0
        self.counts: FloatArray = np.zeros(len(self.keys), dtype=np.float64)
        self.uncached_sums: FloatArray = np.zeros(len(self.keys), dtype=np.float64)
        self.plan_unit = (
            (cfg.work_unit_tokens or DEFAULT_UNIT_TOKENS)
            if (cfg.plan_on_work and self.extensions)
            else None
        )
        """Plan on work (`planner.work_rates`, this many tokens a unit); None: on request counts."""
        self.reported_cost = cfg.reported_cost and self.plan_unit is not None
        """Weigh keys by the uncached tokens the engines reported (`report_usage`)."""
        self.cached_view: IntArray | None = None
        """Per request, the prompt tokens its replica served from cache (the engine's usage
        report; final once the request has finished). Set by the fleet."""
        self.finished: list[int] = []
        """Requests finished since the last plan (their usage reached the planner)."""
        self.reported_counts: FloatArray = np.zeros(len(self.keys), dtype=np.float64)
        self.reported_sums: FloatArray = np.zeros(len(self.keys), dtype=np.float64)
        self.plan: Plan | None = None
        self.history: list[dict[str, float]] = []
        self.homes: IntArray | None = (
            np.full(len(self.keys), -1, dtype=np.int64)
            if cfg.keep_homes and self.extensions
            else None
        )
        """Per key, the destination of its latest routed request (`build_plan(homes=...)`)."""
        self.routed: list[int] = [-1] * q.n if self.homes is not None else []
        """Per request, where it was routed (-1: not heard of), as the gateways' events report it
        to the planner: the fleet hands its leader the routes of all its gateways."""
        if cfg.oracle:
            rates = ctx.requests.key_rates()
            active = np.flatnonzero(rates > 0)
            n = np.bincount(q.key_index, minlength=len(self.keys))[active]
            uncached = q.prompt_tokens - q.prefix_tokens
            sums = np.bincount(q.key_index, weights=uncached, minlength=len(self.keys))
            rates = self._weigh(rates[active], sums[active] / n)
            self.install(self._build([self.keys[k] for k in active.tolist()], rates, 0.0))

    def route(self, i: int, t: float) -> int:
        key = self.keys[self.key_index[i]]
        session = self.sessions[i] if self.sessions is not None else None
        offs = self.block_offsets
        if offs is None:
            d = self.router.route_index(key, session)
        else:  # the gateway hashes the prompt's blocks and remembers where they went
            blocks = self.ctx.requests.block_ids[offs[i] : offs[i + 1]].tolist()
            d = self.router.route_index(key, session, blocks)
            self.router.remember(d, blocks)
        if self.unit_tokens is not None:  # the gateway's weight: uncached prompt + decode
            self.units[i] = self.router.work_units(key, d, self.prompts[i], session)
        self.router.acquire(d, self.units[i])
        return d

    def first_token(self, d: int, i: int) -> None:
        """The prefill is done: keep only the decode unit in flight (as a gateway does)."""
        if self.units[i] > 1:
            self.router.settle(d, self.units[i] - 1)
            self.units[i] = 1

    def release(self, d: int, i: int) -> None:
        self.router.release(d, self.units[i])

    def tick(self, t: float, i: int) -> None:
        table = self.build(t, i)
        if table is not None:
            self.install(table)

    def build(self, t: float, i: int) -> RoutingTable | None:
        """Re-plan from the rates observed in requests [0, i) at time t; None: keep the plan.

        In a fleet only one instance builds (the planner sees every gateway's requests through
        the streams agent); every gateway then `install`s the table after the propagation delay.
        """
        if self.ctx.plan.oracle or i == 0:
            return None
        seen = self.all_key_index[self.window_start : i]
        new = np.bincount(seen, minlength=len(self.keys))
        q = self.ctx.requests
        uncached = q.prompt_tokens[self.window_start : i] - q.prefix_tokens[self.window_start : i]
        new_sums = np.bincount(seen, weights=uncached, minlength=len(self.keys))
        if self.homes is not None:  # the latest destination of each key seen in the window
            routed = np.asarray(self.routed[self.window_start : i], dtype=np.int64)
            last = seen.size - 1 - np.unique(seen[::-1], return_index=True)[1]
            self.homes[seen[last]] = routed[last]
        self.window_start = i
        rep_n, rep_sums = self._reported()
        decay = self.ctx.plan.rate_decay
        keep = decay if decay < 1.0 else 1.0  # the part of the old sums that still counts
        self.counts = self.counts * keep + new
        self.uncached_sums = self.uncached_sums * keep + new_sums
        self.reported_counts = self.reported_counts * keep + rep_n
        self.reported_sums = self.reported_sums * keep + rep_sums
        elapsed = t - float(self.ctx.requests.times[0])
        span = elapsed if decay >= 1.0 else self.ctx.plan.control_interval_s / (1.0 - decay)
        active = np.flatnonzero(self.counts > 0)
        rates = self.counts[active] / max(min(span, elapsed), 1e-9)
        declared = self.uncached_sums[active] / self.counts[active]
        n_rep = self.reported_counts[active]
        # the engines' figure where a key has finished requests, else its declared prefix
        mean_uncached: FloatArray = np.where(
            n_rep > 0, self.reported_sums[active] / np.maximum(n_rep, 1e-300), declared
        ).astype(np.float64)
        rates = self._weigh(rates, mean_uncached)
        homes = None if self.homes is None else self.homes[active]
        return self._build([self.keys[k] for k in active.tolist()], rates, t, homes)

    def _reported(self) -> tuple[FloatArray, FloatArray]:
        """Per key, the finished requests since the last plan and their uncached tokens as the
        engines reported them (zeros without `reported_cost` or usage reports)."""
        n = len(self.keys)
        if not self.finished or self.cached_view is None or not self.reported_cost:
            return np.zeros(n), np.zeros(n)
        idx = np.asarray(self.finished, dtype=np.int64)
        self.finished.clear()
        q = self.ctx.requests
        keys = self.all_key_index[idx]
        uncached = (q.prompt_tokens[idx] - self.cached_view[idx]).astype(np.float64)
        counts: FloatArray = np.bincount(keys, minlength=n).astype(np.float64)
        sums: FloatArray = np.bincount(keys, weights=uncached, minlength=n).astype(np.float64)
        return counts, sums

    def _weigh(self, rates: FloatArray, mean_uncached: FloatArray) -> FloatArray:
        """The rates the planner sees: work rates (as the planner service plans) or requests/s."""
        if self.plan_unit is None:
            return rates.astype(np.float64)
        return work_rates(rates, mean_uncached, self.plan_unit)

    def install(self, table: RoutingTable) -> None:
        """Swap this gateway's routing table (what `Dispatcher.apply_plan` does on a new plan)."""
        self.router.install(table)

    def _build(
        self, keys: list[str], rates: FloatArray, t: float, homes: IntArray | None = None
    ) -> RoutingTable:
        plan = self.make_plan(keys, rates, int(t * 1000), homes)
        assignments = self.assign(plan)
        table = self.table_for(plan, assignments)
        entry = {
            "t": t,
            "admitted_keys": float(plan.n_admitted),
            "admitted_rate_share": plan.admitted_rate / plan.total_rate if plan.total_rate else 0.0,
            "multi_replica_keys": float(np.count_nonzero(plan.replicas() > 1)),
            "expected_max_over_mean": self.expected_max_over_mean(plan, assignments),
        }
        if self.plan is not None:
            entry["moved_rate_share"] = plan_diff(self.plan, plan).changed_rate_fraction
        self.history.append(entry)
        self.plan = plan
        return table

    def make_plan(
        self, keys: list[str], rates: FloatArray, created_ms: int, homes: IntArray | None = None
    ) -> Plan:
        """The plan for these keys and rates; `homes` (cacheroute only): where each goes now."""
        raise NotImplementedError

    def assign(self, plan: Plan) -> list[tuple[str, tuple[int, ...]]]:
        raise NotImplementedError

    def table_for(self, plan: Plan, assignments: list[tuple[str, tuple[int, ...]]]) -> RoutingTable:
        """The gateway's routing table for these assignments (the dispatcher's `build_table`)."""
        names = self.ctx.names
        return build_table(
            plan.version,
            plan.created_ms,
            ((k, [names[d] for d in ds]) for k, ds in assignments),
            plan.destination_names,
            names,
        )

    def expected_max_over_mean(
        self, plan: Plan, assignments: list[tuple[str, tuple[int, ...]]]
    ) -> float:
        """max/mean of the expected loads under these assignments (cold tail spread evenly)."""
        r = self.ctx.destinations
        loads = np.full(r, plan.cold_rate / r)
        for (_, ds), rate in zip(assignments, plan.rates.tolist(), strict=True):
            for d in ds:
                loads[d] += rate / len(ds)
        mean = float(loads.mean())
        return float(loads.max()) / mean if mean > 0 else 1.0

    def hrw(self, plan: Plan) -> IntArray:
        """Rendezvous preference order of the plan's admitted keys."""
        idx = {k: j for j, k in enumerate(self.keys)}
        rows = np.fromiter((idx[k] for k in plan.keys), dtype=np.int64, count=plan.n_admitted)
        return rendezvous_order(self.ctx.hashes[rows], self.ctx.destinations)

    def describe(self) -> dict[str, Any]:
        counts = dict(zip(RouteKind.NAMES, self.router.counts, strict=True))
        out: dict[str, Any] = {"routes": counts, "plans": len(self.history)}
        if self.history:
            last = self.history[-1]
            out.update({k: v for k, v in last.items() if k != "t"})
            moved = [h["moved_rate_share"] for h in self.history if "moved_rate_share" in h]
            if moved:
                out["mean_moved_rate_share"] = float(np.mean(moved))
        return out


class Affinity(_Planned):
    """Pinning: admitted keys (k_b = 1) on one rendezvous-hashed destination each."""

    name = "affinity"

    def make_plan(
        self, keys: list[str], rates: FloatArray, created_ms: int, homes: IntArray | None = None
    ) -> Plan:
        del homes  # the paper's placement: hashing
        params = replace(self.params, q_cap=_HUGE_Q_CAP)
        return build_plan(keys, rates, self.ctx.names, params, created_ms=created_ms)

    def assign(self, plan: Plan) -> list[tuple[str, tuple[int, ...]]]:
        order = self.hrw(plan)
        return [(k, (int(order[j, 0]),)) for j, k in enumerate(plan.keys)]


class AffinityReplication(_Planned):
    """Replication without LPT: k_b rendezvous-hashed destinations per admitted key."""

    name = "affinity+replication"

    def make_plan(
        self, keys: list[str], rates: FloatArray, created_ms: int, homes: IntArray | None = None
    ) -> Plan:
        del homes  # the paper's placement: hashing
        return build_plan(keys, rates, self.ctx.names, self.params, created_ms=created_ms)

    def assign(self, plan: Plan) -> list[tuple[str, tuple[int, ...]]]:
        order = self.hrw(plan)
        k = plan.replicas().tolist()
        return [(key, tuple(order[j, : k[j]].tolist())) for j, key in enumerate(plan.keys)]


class CacheRoute(_Planned):
    """The planner as deployed: Algorithm 1 + fair-share sizing + sibling co-location + churn."""

    name = "cacheroute"
    extensions = True

    def make_plan(
        self, keys: list[str], rates: FloatArray, created_ms: int, homes: IntArray | None = None
    ) -> Plan:
        return build_plan(
            keys,
            rates,
            self.ctx.names,
            self.params,
            prev=self.plan,
            homes=homes,
            created_ms=created_ms,
        )

    def assign(self, plan: Plan) -> list[tuple[str, tuple[int, ...]]]:
        return list(plan.assignments().items())

    def table_for(self, plan: Plan, assignments: list[tuple[str, tuple[int, ...]]]) -> RoutingTable:
        """Exactly what a gateway's Dispatcher.apply_plan builds: `table_from_plan`."""
        del assignments
        return table_from_plan(plan, self.ctx.names)


class PaperLPT(CacheRoute):
    """Algorithm 1 as published (k_b = ceil(rate / q_cap), LPT), with churn-aware re-planning.

    The ablation step between `affinity+replication` and `cacheroute`: it adds LPT placement,
    but none of our extensions (fair-share sizing, sibling co-location, the dispatcher's spill).
    """

    name = "affinity+replication+lpt"
    extensions = False
