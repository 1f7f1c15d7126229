"""Each policy's routing rule, on hand-made states; plan-based ones through the real Router."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from cacheroute.dispatcher.prefixes import PrefixIndex
from cacheroute.dispatcher.routing import Router, RoutingTable
from cacheroute.planner import Plan
from cacheroute.planner.params import DEFAULT_FAIR_SHARE
from cacheroute.replay.baselines import Chwbl, FlatLB, Sticky
from cacheroute.replay.cacheaware import Preble, SGLang
from cacheroute.replay.errors import ReplayError
from cacheroute.replay.fleet import Fleet, FleetConfig
from cacheroute.replay.planned import (
    Affinity,
    AffinityReplication,
    CacheRoute,
    PaperLPT,
    rendezvous_order,
)
from cacheroute.replay.policies import POLICY_NAMES, make_policy
from cacheroute.replay.policy import PlanConfig, PolicyContext
from cacheroute.replay.requestset import RequestSet, make_request_set
from cacheroute.replay.service import ServiceModel

from .conftest import TinyFactory, WorkloadFactory


def current_table(router: Router) -> RoutingTable | None:
    """The router's live table, read through a call (it changes under the policy's feet)."""
    return router.table


def ctx_for(q: RequestSet, r: int = 4, **plan: float) -> PolicyContext:
    cfg = PlanConfig(**({"q_cap": 5.0, "control_interval_s": 10.0} | plan))  # type: ignore[arg-type]
    return PolicyContext(requests=q, destinations=r, seed=0, service=ServiceModel(), plan=cfg)


def test_registry_has_the_fixed_names(workload_factory: WorkloadFactory) -> None:
    assert POLICY_NAMES == (
        "flat-lb",
        "sticky",
        "chwbl",
        "sglang",
        "preble",
        "affinity",
        "affinity+replication",
        "affinity+replication+lpt",
        "cacheroute",
    )
    ctx = ctx_for(workload_factory("paper", requests=300))
    for name in POLICY_NAMES:
        assert make_policy(name, ctx).name == name
    with pytest.raises(ReplayError):
        make_policy("random", ctx)


def test_flat_lb_is_the_dispatchers_router(workload_factory: WorkloadFactory) -> None:
    p = FlatLB(ctx_for(workload_factory("paper", requests=300)))
    assert current_table(p.router) is None
    p.router.inflight[:] = [9, 0, 9, 9]
    picks: Counter[int] = Counter()
    for i in range(200):
        d = p.route(i, 0.0)
        picks[d] += 1
        p.release(d, i)
    assert picks[1] == pytest.approx(100, abs=30)  # P2C: d1 wins every draw it is in (p = 1/2)
    assert p.router.counts[4] == 200  # all "no plan" routes


def test_sticky_is_deterministic_and_key_stable(workload_factory: WorkloadFactory) -> None:
    q = workload_factory("paper", requests=500)
    a, b = Sticky(ctx_for(q, 8)), Sticky(ctx_for(q, 8))
    first: dict[int, int] = {}
    for i in range(q.n):
        d = a.route(i, 0.0)
        assert d == b.route(i, 0.0)
        assert first.setdefault(int(q.key_index[i]), d) == d


def test_chwbl_never_exceeds_its_bound(workload_factory: WorkloadFactory) -> None:
    q = workload_factory("whale", requests=2000)
    p = Chwbl(ctx_for(q, 6))
    for i in range(q.n):
        total_before = p.total
        d = p.route(i, 0.0)
        assert p.inflight[d] <= np.ceil(1.25 * (total_before + 1) / 6)
    assert p.spilled > 0
    assert sum(p.inflight) == q.n


def test_prefix_index_matches_per_destination() -> None:
    idx = PrefixIndex(3, capacity_blocks=10)
    idx.insert(0, [1, 2, 3])
    idx.insert(2, [1, 2])
    assert idx.match([1, 2, 3, 4]) == [3, 0, 2]
    assert idx.match([5]) == [0, 0, 0]
    for b in range(100, 110):
        idx.insert(0, [b])
    assert idx.size(0) == 10
    assert idx.match([1]) == [0, 0, 1]


def test_sglang_follows_the_cache_then_the_queue(tiny_factory: TinyFactory) -> None:
    q = tiny_factory([[1, 2, 3], [1, 2, 3, 4], [9], [1, 2, 3]])
    p = SGLang(ctx_for(q, 3))
    d0 = p.route(0, 0.0)
    assert p.route(1, 0.0) == d0  # > 50% of the prompt matched there
    assert p.route(2, 0.0) != d0  # no match: the smallest tree
    p.inflight[:] = [40, 40, 40]
    p.inflight[d0] = 80  # imbalanced beyond 32 requests: shortest queue
    assert p.route(3, 0.0) != d0
    assert p.counts == {"balance": 1, "cache_hit": 1, "smallest_tree": 2}


def test_preble_exploits_then_rebalances(tiny_factory: TinyFactory) -> None:
    """40 requests for one 49-token prompt (3 blocks of 16 + 1), all at t = 0 (no decay).

    Every output is 128 tokens, the prior, so the expected output stays 128. With the default
    ServiceModel: decode seconds per token (0.006 + 16 * 5e-5) / 16 = 0.000425, x 128 = 0.0544;
    prefill(49 new, 0 cached) = 0.002 + 49 * 4e-5 + 1.3e-9 * 49^2 / 2 = 0.00396156;
    prefill(1 new, 48 cached) = 0.002 + 4e-5 + 1.3e-9 * (48 + 0.5) = 0.00204006.
    Request 0 explores (no match; equal costs: d0) and charges 0.05836156; each next one exploits
    d0 (the whole prefix is there) for 0.05644006 until d0's load exceeds 1.5 x the mean AND the
    mean by 1 s: 2/3 load > 1 s, i.e. load > 1.5 s, after 1 + 26 requests (0.05836156 + 26 x
    0.05644006 = 1.52580; 25 would give 1.469). Request 27 is rebalanced: it explores, and d1
    (load 0 + 0.00396) beats d0 (1.5258 + 0.00204). Requests 28-39 then exploit the less loaded of
    the two holders, d1, whose load (<= 0.6792 before request 39) never exceeds 1.5 x the mean
    (>= 0.735): 12 more on d1, none on d2.
    """
    q = tiny_factory([[1, 2, 3]] * 40, output=[128] * 40)
    p = Preble(ctx_for(q, 3))
    assert p.route(0, 0.0) == 0
    assert p.route(1, 0.0) == 0  # exploit: the whole prefix is there
    routes = [p.route(i, 0.0) for i in range(2, 40)]
    assert routes == [0] * 25 + [1] * 13
    assert p.counts == {"exploit": 38, "explore": 2, "rebalanced": 1}
    assert p.inflight == [27, 13, 0]
    assert p.index.match(p.blocks(0)) == [3, 3, 0]  # held where it was sent (dense block ids)
    assert p.load == pytest.approx([0.05836156 + 26 * 0.05644006, 0.05836156 + 12 * 0.05644006, 0])


def test_preble_charges_the_expected_output_not_the_true_one(tiny_factory: TinyFactory) -> None:
    """The decode charge uses the running mean of outputs routed before, never the request's own.

    Three one-block prompts (17 tokens), no shared prefix, all at t = 0; prefill(17, 0) = 0.002 +
    17 * 4e-5 + 1.3e-9 * 17^2 / 2 = 0.00268018785. Request 0 (true output 100,000) is charged the
    prior: 128 x 0.000425 = 0.0544 (the old rule charged 42.5 s). The mean then moves by the weight
    0.05: 128 + 0.05 x (100,000 - 128) = 5121.6 tokens, which request 1 is charged (2.17668 s, on
    d1: the empty replica is cheaper than d0); then 5121.6 + 0.05 x (128 - 5121.6) = 4871.92.
    """
    q = tiny_factory([[1], [2], [3]], output=[100_000, 128, 128])
    p = Preble(ctx_for(q, 3))
    prefill = 0.00268018785
    assert p.route(0, 0.0) == 0
    assert p.load == pytest.approx([prefill + 128 * 0.000425, 0, 0])
    assert p.describe()["mean_output_tokens"] == pytest.approx(5121.6)
    assert p.route(1, 0.0) == 1
    assert p.load[1] == pytest.approx(prefill + 5121.6 * 0.000425)
    assert p.describe()["mean_output_tokens"] == pytest.approx(4871.92)


def test_rendezvous_order_is_a_permutation_and_stable() -> None:
    h = np.array([1, 2, 3, 2**63 + 5], dtype=np.uint64)
    order = rendezvous_order(h, 5)
    assert order.shape == (4, 5)
    assert all(sorted(row) == list(range(5)) for row in order.tolist())
    assert np.array_equal(order, rendezvous_order(h, 5))
    assert np.array_equal(order[:, :3], rendezvous_order(h, 5)[:, :3])


def test_plans_arrive_at_the_first_tick_and_route_through_the_router(
    workload_factory: WorkloadFactory,
) -> None:
    q = workload_factory("whale", requests=3000)
    for cls in (Affinity, AffinityReplication, CacheRoute):
        p = cls(ctx_for(q, 8, q_cap=q.rate / 30))
        assert p.route(0, 0.0) in range(8)
        assert current_table(p.router) is None
        for i in range(1, 1500):
            p.route(i, float(q.times[i]))
        p.tick(float(q.times[1500]), 1500)
        table = current_table(p.router)
        assert table is not None
        assert len(table) > 0
        sizes = Counter(len(table.targets(k)) for k in q.keys if k in table)
        if cls is Affinity:
            assert set(sizes) == {1}
        else:
            assert max(sizes) > 1  # whales are replicated
        for i in range(1500, 2000):
            key = q.keys[int(q.key_index[i])]
            d = p.route(i, float(q.times[i]))
            if key in table:
                assert d in table.targets(key)
        info = p.describe()
        assert info["plans"] == 1
        assert info["routes"]["plan"] > 0


def test_cacheroute_replans_from_its_previous_plan(workload_factory: WorkloadFactory) -> None:
    q = workload_factory("paper", requests=3000)
    p = CacheRoute(ctx_for(q, 8, q_cap=q.rate / 30))
    for t, i in ((10.0, 1000), (20.0, 2000)):
        for j in range(i - 1000, i):
            p.route(j, float(q.times[j]))
        p.tick(t, i)
    assert p.plan is not None
    assert p.plan.version == 2
    assert p.describe()["mean_moved_rate_share"] < 0.5


def test_oracle_plans_up_front(workload_factory: WorkloadFactory) -> None:
    q = workload_factory("paper", requests=1000)
    p = CacheRoute(ctx_for(q, 4, oracle=True))
    assert p.router.table is not None
    p.tick(5.0, 500)
    assert p.plan is not None
    assert p.plan.version == 1


def test_cacheroute_adds_fair_share_and_siblings_to_algorithm_1(
    workload_factory: WorkloadFactory,
) -> None:
    """`affinity+replication+lpt` is the paper's planner; `cacheroute` adds our two extensions."""
    q = workload_factory("whale", requests=3000, keys=300)
    r = 16
    mean = q.rate / r
    paper = PaperLPT(ctx_for(q, r, oracle=True, q_cap=10 * q.rate))  # the knee never binds
    ours = CacheRoute(ctx_for(q, r, oracle=True, q_cap=10 * q.rate))
    assert paper.plan is not None
    assert ours.plan is not None
    assert paper.plan.params.fair_share is None
    assert paper.plan.params.group_separator is None
    assert ours.plan.params.fair_share == DEFAULT_FAIR_SHARE == 0.5
    assert ours.plan.params.group_separator == "/"
    # The biggest whale (~9% of the rate, > the mean load of one of 16 destinations) is split only
    # by fair-share sizing.
    top = int(np.argmax(paper.plan.rates))
    assert paper.plan.rates[top] > mean
    assert paper.plan.replicas()[top] == 1
    assert ours.plan.replicas()[ours.plan.keys.index(paper.plan.keys[top])] > 1
    assert ours.plan.max_over_mean() < paper.plan.max_over_mean()

    def tenants_per_destination(plan: Plan) -> int:
        seen = {(d, k.rpartition("/")[0]) for k, ts in plan.assignments().items() for d in ts}
        return len(seen)

    assert tenants_per_destination(ours.plan) < tenants_per_destination(paper.plan)


def test_cacheroute_plans_on_uncached_work_as_the_planner_service_does() -> None:
    """Two keys at 1 req/s each: `light` declares its whole 1,024-token prompt reusable (cost 1),
    `heavy` declares none of it (cost 1 + 1,024 / 512 = 3). Planned on work their rates are
    2 r * 1/4 and 2 r * 3/4; on request counts r and r. With 4 destinations and the knee out of
    the way, fair-share sizing at the whole mean (no replica above the mean load, 2 r / 4; the
    default half of it would give `heavy` all 4 destinations either way) gives `heavy` 3 replicas
    on work and 2 on request counts."""
    n = 20
    q = make_request_set(
        times=[i / 2 for i in range(n)],
        keys=["light", "heavy"] * (n // 2),
        prompt_tokens=[1024] * n,
        output_tokens=[4] * n,
        prefix_tokens=[1024, 0] * (n // 2),
        block_lists=[[i] for i in range(n)],
        block_tokens=16,
        source="hand",
    )
    rates = {}
    for on_work in (True, False):
        p = CacheRoute(
            ctx_for(q, 4, q_cap=100.0, oracle=True, plan_on_work=on_work, fair_share=1.0)
        )
        assert p.plan is not None
        rates[on_work] = dict(zip(p.plan.keys, p.plan.rates.tolist(), strict=True))
        replicas = dict(zip(p.plan.keys, p.plan.replicas().tolist(), strict=True))
        assert replicas["heavy"] == (3 if on_work else 2)
    each = float(q.key_rates()[0])  # both keys: n / 2 requests over the same span
    assert rates[False] == pytest.approx({"heavy": each, "light": each})
    assert rates[True] == pytest.approx({"heavy": 2 * each * 3 / 4, "light": 2 * each / 4})


def test_keep_homes_plans_new_keys_where_their_traffic_went() -> None:
    """Eight keys at equal rates on 4 destinations, routed before any plan (the cold path: each
    key to its ring home, nothing left in flight). Every share (r) fits under the bound
    1.05 x the mean (2 r) on a destination holding at most two homes, so with `keep_homes` the
    first plan puts every key where its requests went; LPT alone ignores that."""
    keys = [f"tenant-{j}" for j in range(7, 15)]  # ring homes 3 3 1 0 0 2 2 1 on d0..d3
    n = 80
    q = make_request_set(
        times=[i / 8 for i in range(n)],
        keys=keys * (n // 8),
        prompt_tokens=[64] * n,
        output_tokens=[4] * n,
        prefix_tokens=[64] * n,
        block_lists=[[i] for i in range(n)],
        block_tokens=16,
        source="hand",
    )
    targets = {}
    for homes in (True, False):
        fleet = Fleet("cacheroute", ctx_for(q, 4, q_cap=100.0, keep_homes=homes), FleetConfig())
        went: dict[str, int] = {}
        for i in range(n):
            d = fleet.route(i, float(q.times[i]))
            fleet.release(i)
            went[q.keys[q.key_index[i]]] = d
        assert Counter(went.values()).most_common(1)[0][1] <= 2  # the premise: <= 2 homes each
        fleet.tick(float(q.times[-1]), n)  # the planner hears of the routes through the fleet
        assert fleet.planner is not None
        assert fleet.planner.plan is not None
        targets[homes] = {k: ds[0] for k, ds in fleet.planner.plan.assignments().items()}
        if homes:
            assert targets[homes] == went
        else:
            assert targets[homes] != went


def _two_requests() -> RequestSet:
    return make_request_set(
        times=[0.0, 1.0],
        keys=["a", "b"],
        prompt_tokens=[64, 64],
        output_tokens=[4, 4],
        block_lists=[[1], [2]],
        block_tokens=16,
        source="hand",
    )


@pytest.mark.parametrize("rule", ["spill_home", "context_home"])
def test_sole_gateway_homes_reach_cacheroutes_gateways_only_where_asked(rule: str) -> None:
    """The evaluator turns spill and context homes on at one gateway (its counts are the real
    loads) and off in a fleet, unless told; only cacheroute's Router gets them (the ablation
    steps run the paper's dispatch)."""
    from cacheroute.replay.evaluate import EvalConfig  # noqa: PLC0415

    def resolved(**kw: object) -> object:
        return getattr(EvalConfig(**kw), f"resolved_{rule}")  # type: ignore[arg-type]

    assert resolved() is True
    assert resolved(fleet=FleetConfig(gateways=4)) is False
    assert resolved(fleet=FleetConfig(gateways=4), **{rule: True}) is True
    assert resolved(**{rule: False}) is False
    q = _two_requests()
    ctx = ctx_for(q, **{rule: True})
    assert getattr(CacheRoute(ctx).router, rule) is True
    assert getattr(PaperLPT(ctx).router, rule) is False
    assert getattr(CacheRoute(ctx_for(q)).router, rule) is False


def test_cache_awareness_reaches_cacheroutes_gateways_only_where_asked() -> None:
    """As spill homes: on at one gateway (its counts are every insert into each replica's
    cache), off in a fleet unless told; the Router then gets the replica's KV capacity."""
    from cacheroute.replay.evaluate import EvalConfig  # noqa: PLC0415

    assert EvalConfig().resolved_cache_aware is True
    assert EvalConfig(fleet=FleetConfig(gateways=4)).resolved_cache_aware is False
    assert EvalConfig(fleet=FleetConfig(gateways=4), cache_aware=True).resolved_cache_aware
    assert EvalConfig(cache_aware=False).resolved_cache_aware is False
    q = _two_requests()
    ctx = ctx_for(q, cache_aware=True)
    assert CacheRoute(ctx).router.cache_tokens == ctx.service.cache_tokens
    assert PaperLPT(ctx).router.cache_tokens is None
    assert CacheRoute(ctx_for(q)).router.cache_tokens is None


def test_cacheroute_plans_on_the_uncached_tokens_the_engines_reported() -> None:
    """Keys a and b: 10 requests each of 5,120 prompt tokens, all declared reusable, so by the
    declaration both cost 1 unit (the decode). The engines report a's prompts computed in full
    (1 + 5120 / 512 = 11 units) and b's served from cache (1 unit): planned on the reports, a
    weighs 11x b; on the declaration, the same; before any request finished, the declaration."""
    n = 20
    q = make_request_set(
        times=[float(i) for i in range(n)],
        keys=["a", "b"] * (n // 2),
        prompt_tokens=[5120] * n,
        output_tokens=[4] * n,
        prefix_tokens=[5120] * n,
        block_lists=[[i] for i in range(n)],
        block_tokens=16,
        source="hand",
    )
    cached = np.array([0, 5120] * (n // 2), dtype=np.int64)

    def planned_rates(reported: bool, finished: bool) -> dict[str, float]:
        pol = CacheRoute(ctx_for(q, q_cap=100.0, reported_cost=reported))
        pol.cached_view = cached
        if finished:
            pol.finished.extend(range(n))
        pol.build(float(n), n)
        assert pol.plan is not None
        return dict(zip(pol.plan.keys, pol.plan.rates.tolist(), strict=True))

    rates = planned_rates(reported=True, finished=True)
    assert rates["a"] / rates["b"] == pytest.approx(11.0)
    assert rates["a"] + rates["b"] == pytest.approx(1.0)  # 20 requests in the 20 s since the first
    declared = planned_rates(reported=False, finished=True)
    assert declared["a"] == pytest.approx(declared["b"])
    early = planned_rates(reported=True, finished=False)
    assert early["a"] == pytest.approx(early["b"])
