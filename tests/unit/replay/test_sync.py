"""Gossip between a fleet's gateways (`FleetConfig.sync_s`): prefix indexes and loads merge."""

from __future__ import annotations

import math

import numpy as np
import pytest

from cacheroute.replay.baselines import Chwbl, FlatLB
from cacheroute.replay.cacheaware import Preble, SGLang
from cacheroute.replay.errors import ReplayError
from cacheroute.replay.fleet import Fleet, FleetConfig
from cacheroute.replay.planned import _Planned
from cacheroute.replay.policy import PlanConfig, PolicyContext
from cacheroute.replay.requestset import RequestSet
from cacheroute.replay.service import ServiceModel
from cacheroute.replay.simulator import SimConfig, simulate

from .conftest import TinyFactory, WorkloadFactory


def ctx_for(q: RequestSet, r: int = 4) -> PolicyContext:
    cfg = PlanConfig(q_cap=5.0, control_interval_s=5.0)
    return PolicyContext(requests=q, destinations=r, seed=0, service=ServiceModel(), plan=cfg)


@pytest.mark.parametrize("name", ["sglang", "preble"])
def test_after_a_sync_both_gateways_match_a_prompt_only_one_routed(
    tiny_factory: TinyFactory, name: str
) -> None:
    # request 0 -> gateway 0 at t=0; request 1 -> gateway 1 at t=0.5; the sync (every 2 s) comes
    # before request 2 (gateway 0, t=2)
    q = tiny_factory([[11, 12, 13, 14], [21, 22], [31, 32, 33]], times=[0.0, 0.5, 2.0])
    fleet = Fleet(name, ctx_for(q), FleetConfig(gateways=2, sync_s=2.0, sync_load=True))
    a, b = fleet.members
    assert isinstance(a, SGLang | Preble)
    assert isinstance(b, SGLang | Preble)
    prompt, other = a.blocks(0), a.blocks(1)  # the request set's block ids
    d0 = fleet.route(0, 0.0)
    fleet.route(1, 0.5)
    want = [4 if d == d0 else 0 for d in range(4)]
    assert a.index.match(prompt) == want
    assert b.index.match(prompt) == [0, 0, 0, 0]  # before the sync: gateway 1 never saw it
    fleet.route(2, 2.0)
    assert fleet.syncs == 1
    assert b.index.match(prompt) == want
    assert a.index.match(other) == b.index.match(other)
    assert max(a.index.match(other)) == 2


def test_a_load_sent_by_one_gateway_steers_the_other_after_a_sync(
    tiny_factory: TinyFactory,
) -> None:
    # chwbl: one key; gateway 0 sends request 0 to the key's ring owner. Gateway 1's request at
    # t=2 sees it only after a sync: its bound ceil(1.25 * (0 + 1 remote + 1) / 4) = 1 then
    # excludes the owner (0 own + 1 remote), so it spills to the next destination on the ring.
    q = tiny_factory([[1], [1]], times=[0.0, 2.0], keys=["k", "k"])
    alone = Fleet("chwbl", ctx_for(q), FleetConfig(gateways=2))
    synced = Fleet("chwbl", ctx_for(q), FleetConfig(gateways=2, sync_s=1.0, sync_load=True))
    owner = alone.route(0, 0.0)
    assert synced.route(0, 0.0) == owner
    assert alone.route(1, 2.0) == owner  # no gossip: gateway 1 thinks the owner is idle
    b = synced.members[1]
    assert isinstance(b, Chwbl)
    spilled = synced.route(1, 2.0)
    assert b.remote is not None
    assert b.remote[owner] == 1.0
    assert spilled == b.walks[int(q.key_index[1])][1] != owner
    assert b.inflight[spilled] == 1  # own counts stay live; remote is the peers' snapshot


def test_preble_explores_away_from_a_peer_s_load_and_the_remote_load_decays(
    tiny_factory: TinyFactory,
) -> None:
    # two unrelated prompts: with nothing matched, Preble explores to the least loaded
    # destination, d0 first on ties. After the sync gateway 1 sees gateway 0's charge on d0.
    q = tiny_factory([[1, 2, 3], [7, 8, 9]], times=[0.0, 3.0])
    alone = Fleet("preble", ctx_for(q), FleetConfig(gateways=2))
    synced = Fleet("preble", ctx_for(q), FleetConfig(gateways=2, sync_s=1.0, sync_load=True))
    assert alone.route(0, 0.0) == synced.route(0, 0.0) == 0
    assert alone.route(1, 3.0) == 0
    assert synced.route(1, 3.0) == 1
    a, b = synced.members
    assert isinstance(a, Preble)
    assert isinstance(b, Preble)
    assert b.remote is not None
    assert b.remote[0] == pytest.approx(a.load[0])  # both aged to t=3 by the same decay
    assert b.remote[0] > 0
    assert b.load[0] == 0.0  # gateway 1 charged its own request to d1 only


def test_flat_lb_never_picks_a_destination_its_peers_loaded(
    workload_factory: WorkloadFactory,
) -> None:
    q = workload_factory("paper", requests=200)
    fleet = Fleet("flat-lb", ctx_for(q), FleetConfig(gateways=2, sync_s=1.0, sync_load=True))
    b = fleet.members[1]
    assert isinstance(b, FlatLB)
    b.remote = [100.0, 0.0, 0.0, 0.0]  # what a sync would report after a peer's burst on d0
    assert 0 not in {b.route(i, 0.0) for i in range(50)}


@pytest.mark.parametrize("name", ["sglang", "preble", "chwbl", "flat-lb", "cacheroute"])
def test_without_a_sync_in_the_replay_every_route_is_unchanged(
    workload_factory: WorkloadFactory, name: str
) -> None:
    q = workload_factory("whale", requests=1500)
    sim = SimConfig(destinations=6)
    plan = PlanConfig(q_cap=5.0, control_interval_s=q.duration / 10)
    base = simulate(q, name, sim, plan, fleet=FleetConfig(gateways=3))
    never = simulate(q, name, sim, plan, fleet=FleetConfig(gateways=3, sync_s=1e9))
    one = simulate(q, name, sim, plan, fleet=FleetConfig(gateways=1, sync_s=1.0))
    alone = simulate(q, name, sim, plan, fleet=FleetConfig(gateways=1))
    assert never.dest.tolist() == base.dest.tolist()
    assert one.dest.tolist() == alone.dest.tolist()


def test_plan_based_policies_ignore_sync(workload_factory: WorkloadFactory) -> None:
    q = workload_factory("whale", requests=1500)
    sim = SimConfig(destinations=6)
    plan = PlanConfig(q_cap=5.0, control_interval_s=q.duration / 10)
    base = simulate(q, "cacheroute", sim, plan, fleet=FleetConfig(gateways=3))
    synced = simulate(q, "cacheroute", sim, plan, fleet=FleetConfig(gateways=3, sync_s=0.5))
    assert synced.dest.tolist() == base.dest.tolist()
    assert "syncs" not in synced.policy_info


def test_gossip_raises_preble_s_hit_rate_at_four_gateways(
    workload_factory: WorkloadFactory,
) -> None:
    q = workload_factory("whale", requests=3000)
    sim = SimConfig(destinations=6)
    plan = PlanConfig(q_cap=5.0, control_interval_s=q.duration / 10)
    blind = simulate(q, "preble", sim, plan, fleet=FleetConfig(gateways=4))
    synced = simulate(q, "preble", sim, plan, fleet=FleetConfig(gateways=4, sync_s=1.0))
    assert synced.policy_info["syncs"] >= math.floor(q.duration) - 1
    assert synced.metrics.hit_rate > blind.metrics.hit_rate
    assert np.bincount(synced.dest, minlength=6).min() > 0


@pytest.mark.parametrize("bad", [0.0, -1.0, math.inf, math.nan])
def test_bad_sync_periods_are_refused(bad: float) -> None:
    with pytest.raises(ReplayError):
        FleetConfig(gateways=2, sync_s=bad)


def test_sync_period_defaults_to_never() -> None:
    assert FleetConfig().sync_s is None
    assert FleetConfig(sync_s=0.25).sync_s == 0.25


def test_loads_are_shared_only_when_asked(workload_factory: WorkloadFactory) -> None:
    q = workload_factory("paper", requests=200)
    for share in (False, True):
        fleet = Fleet("chwbl", ctx_for(q), FleetConfig(gateways=2, sync_s=1.0, sync_load=share))
        a, b = fleet.members
        assert isinstance(a, Chwbl)
        assert isinstance(b, Chwbl)
        fleet.route(0, 0.0)  # gateway 0 routes one request
        fleet.route(1, 5.0)  # a sync happens before gateway 1 routes
        assert (b.remote is not None) == share


def test_peer_load_reports_reach_the_other_gateways_of_a_planned_fleet(
    tiny_factory: TinyFactory,
) -> None:
    # request 0 -> gateway 0 (t=0), request 1 -> gateway 1 (t=0.5); the report every 1 s comes
    # before request 2 (gateway 0, t=1.0)
    q = tiny_factory([[11, 12, 13, 14], [21, 22], [31, 32, 33]], times=[0.0, 0.5, 1.0])
    fleet = Fleet("cacheroute", ctx_for(q), FleetConfig(gateways=2, peer_loads_s=1.0))
    a, b = fleet.members
    assert isinstance(a, _Planned)
    assert isinstance(b, _Planned)
    d0 = fleet.route(0, 0.0)
    d1 = fleet.route(1, 0.5)
    u0, u1 = a.units[0], b.units[1]
    assert a.router.total_inflight == u0  # before any report: each knows its own only
    assert b.router.total_inflight == u1
    d2 = fleet.route(2, 1.0)
    assert fleet.reports == 1
    u2 = a.units[2]
    want_a = [0] * 4
    want_a[d0] += u0
    want_a[d1] += u1
    want_a[d2] += u2
    assert a.router.inflight == want_a  # its own two requests and gateway 1's
    want_b = [0] * 4
    want_b[d1] += u1
    want_b[d0] += u0
    assert b.router.inflight == want_b  # its own and gateway 0's as of the report
    assert (a.router.total_requests, b.router.total_requests) == (3, 2)
    fleet.release(1)  # gateway 1's request ends: its own count drops, gateway 0 learns later
    assert b.router.own_loads()[1] == 0
    assert a.router.total_requests == 3
    assert fleet.describe()["load_reports"] == 1


def test_peer_loads_need_a_positive_period() -> None:
    with pytest.raises(ReplayError, match="peer_loads_s"):
        FleetConfig(gateways=2, peer_loads_s=0.0)
