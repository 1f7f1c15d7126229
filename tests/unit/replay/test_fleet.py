"""A fleet of gateways: the deal, per-gateway state, completions back to their sender, shared plans."""

from __future__ import annotations

import math

import numpy as np
import pytest

from cacheroute.replay.baselines import Chwbl
from cacheroute.replay.engine import Engine
from cacheroute.replay.errors import ReplayError
from cacheroute.replay.fleet import Fleet, FleetConfig, deal_requests
from cacheroute.replay.planned import CacheRoute
from cacheroute.replay.policies import make_policy
from cacheroute.replay.policy import PlanConfig, PolicyContext
from cacheroute.replay.requestset import RequestSet
from cacheroute.replay.service import ServiceModel
from cacheroute.replay.simulator import SimConfig, simulate

from .conftest import WorkloadFactory


def ctx_for(q: RequestSet, r: int = 6) -> PolicyContext:
    cfg = PlanConfig(q_cap=5.0, control_interval_s=5.0)
    return PolicyContext(requests=q, destinations=r, seed=0, service=ServiceModel(), plan=cfg)


def test_round_robin_deals_request_i_to_gateway_i_mod_g(workload_factory: WorkloadFactory) -> None:
    q = workload_factory("paper", requests=300)
    gw = deal_requests(ctx_for(q), FleetConfig(gateways=4))
    assert gw[:9].tolist() == [0, 1, 2, 3, 0, 1, 2, 3, 0]
    assert np.bincount(gw).tolist() == [75, 75, 75, 75]


def test_client_deal_keeps_every_request_of_a_key_on_one_gateway(
    workload_factory: WorkloadFactory,
) -> None:
    q = workload_factory("paper", requests=2000)
    gw = deal_requests(ctx_for(q), FleetConfig(gateways=4, deal="client"))
    for k in np.unique(q.key_index)[:200].tolist():
        assert np.unique(gw[q.key_index == k]).size == 1
    assert set(gw.tolist()) == {0, 1, 2, 3}


def test_one_gateway_routes_exactly_as_the_policy_alone(workload_factory: WorkloadFactory) -> None:
    # Reference: drive one policy instance by hand, as the single-gateway simulator used to.
    q = workload_factory("whale", requests=1500)
    sim = SimConfig(destinations=6)
    plan = PlanConfig(q_cap=5.0, control_interval_s=q.duration / 10)
    fleet = simulate(q, "cacheroute", sim, plan, fleet=FleetConfig(gateways=1))
    ctx = PolicyContext(requests=q, destinations=6, seed=0, service=sim.service, plan=plan)
    pol = make_policy("cacheroute", ctx)
    eng = Engine.create(q, sim.service, 6)
    assert isinstance(pol, CacheRoute)
    pol.cached_view = eng.out_i[:, 1]  # the engines' usage reports reach the planner
    times = q.times.tolist()
    next_tick = times[0] + plan.control_interval_s
    dest = []
    for i, t in enumerate(times):
        while t >= next_tick:
            pol.tick(next_tick, i)
            next_tick += plan.control_interval_s
        d = pol.route(i, t)
        dest.append(d)
        done = eng.step(i, d, times[i + 1] if i + 1 < len(times) else math.inf)
        for c in eng.first_tokens():  # the first streamed token comes before the end
            pol.first_token(dest[c], c)
        for c in eng.comp[:done].tolist():
            pol.release(dest[c], c)
            pol.finished.append(c)  # ...with each finished request's event
    assert fleet.dest.tolist() == dest


def test_each_gateway_keeps_its_own_counts_and_gets_its_own_completions(
    workload_factory: WorkloadFactory,
) -> None:
    q = workload_factory("paper", requests=200)
    fleet = Fleet("chwbl", ctx_for(q), FleetConfig(gateways=2))
    a, b = fleet.members
    assert isinstance(a, Chwbl)
    assert isinstance(b, Chwbl)
    d0 = fleet.route(0, 0.0)  # gateway 0
    d1 = fleet.route(1, 0.0)  # gateway 1
    d2 = fleet.route(2, 0.0)  # gateway 0
    assert (sum(a.inflight), a.total) == (2, 2)
    assert (sum(b.inflight), b.total) == (1, 1)
    fleet.release(1)  # request 1 finished: only gateway 1 learns it
    assert (b.inflight, b.total) == ([0] * 6, 0)
    assert sum(a.inflight) == 2
    fleet.release(0)
    fleet.release(2)
    assert a.inflight == [0] * 6
    assert {d0, d1, d2} <= set(range(6))


def test_a_whole_replay_leaves_no_request_in_flight_on_any_gateway(
    workload_factory: WorkloadFactory,
) -> None:
    q = workload_factory("whale", requests=1500)
    plan = PlanConfig(q_cap=5.0, control_interval_s=q.duration / 10)
    ctx = PolicyContext(requests=q, destinations=6, seed=0, service=ServiceModel(), plan=plan)
    fleet = Fleet("chwbl", ctx, FleetConfig(gateways=3))
    eng = Engine.create(q, ctx.service, 6)
    times = q.times.tolist()
    for i, t in enumerate(times):
        d = fleet.route(i, t)
        done = eng.step(i, d, times[i + 1] if i + 1 < len(times) else math.inf)
        for c in eng.first_tokens():
            fleet.first_token(c)
        for c in eng.comp[:done].tolist():
            fleet.release(c)
    # Chwbl does not clamp at zero: a completion released on the wrong gateway would show here
    for m in fleet.members:
        assert isinstance(m, Chwbl)
        assert m.inflight == [0] * 6
        assert m.total == 0


def test_plans_are_shared_and_reach_every_gateway_after_the_delay(
    workload_factory: WorkloadFactory,
) -> None:
    q = workload_factory("whale", requests=1500)
    fleet = Fleet("cacheroute", ctx_for(q), FleetConfig(gateways=3, plan_delay_s=2.0))
    members = [m for m in fleet.members if isinstance(m, CacheRoute)]
    assert len(members) == 3
    for i in range(600):
        fleet.route(i, float(q.times[i]))
    t = float(q.times[600])
    fleet.tick(t, 600)
    assert all(m.router.table is None for m in members)
    fleet.route(600, t + 1.9)
    assert all(m.router.table is None for m in members)
    fleet.route(601, t + 2.0)
    first = members[0].router.table
    assert first is not None
    assert all(m.router.table is first for m in members)
    # one planner: only the first gateway's instance keeps plan history
    assert len(members[0].history) == 1
    assert all(len(m.history) == 0 for m in members[1:])
    # each gateway has its own Router (its own in-flight counts and random stream)
    assert len({id(m.router) for m in members}) == 3


@pytest.mark.parametrize(
    "bad",
    [{"gateways": 0}, {"deal": "random"}, {"plan_delay_s": -1.0}, {"plan_delay_s": math.inf}],
)
def test_bad_fleet_settings_are_refused(bad: dict[str, object]) -> None:
    with pytest.raises(ReplayError):
        FleetConfig(**bad)  # type: ignore[arg-type]
