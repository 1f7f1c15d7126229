"""Capacity search, knee and auto SLO against answers known in closed form.

The cluster: replicas that each run ONE sequence at a time (max_running = 1: a single-server FIFO
queue), every request the same 1000-token prompt with no cacheable block (no reuse) and 1 output
token (the request is done at its first token: no decode steps), arrivals evenly spaced. Service
time per request, from the ServiceModel formula (service.py), with u = 1000 uncached tokens and
c = 0 cached ones:

    S = prefill_fixed_s + prefill_per_token_s * u + attention_per_pair_s * (u * c + u * u / 2)
      = 0.4 + 3.2e-3 * 1000 + 8e-7 * 500_000 = 0.4 + 3.2 + 0.4 = 4.0 s.

One chunk covers the prompt (chunk_tokens = 1024 >= 1000); with nothing decoding a step is just
the chunk, so prefill proceeds at one second of work per second and TTFT = S = 4 s exactly.

Evenly spaced arrivals at rate L per replica: below L = 1/S every request finds its replica empty
(TTFT = S); above it request k waits k * (S - 1/L), so p99 grows with the replay's length. With R
replicas and Flat-LB (P2C over two *distinct* replicas, i.e. join-the-shortest-queue for R = 2)
the capacity is R / S = R * 0.25 req/s. Precisely, with n = 500 requests (the last 400 measured),
the measured p99 is about request k = 495 (numpy's interpolation: 100 + 0.99 * 399); at a
10 s SLO, R = 1 fails once 4 + 495 * (4 - 1/L) > 10, i.e. above L = 1 / (4 - 6/495) = 1.00304 / S.
So the true capacity lies in [1/S, 1.0031/S], and the search must land there within its
resolution. Idle p99 = S = 4000 ms > 2000 ms, so the auto SLO is 2.5 x 4000 = 10,000 ms.
"""

from __future__ import annotations

import numpy as np
import pytest

from cacheroute.replay.errors import ReplayError
from cacheroute.replay.evaluate import (
    AUTO_SLO_MULTIPLE,
    DESCEND_STEPS,
    EvalConfig,
    _capacity,
    _choose_slo,
    _cluster_sweep,
    _Runner,
    _Silent,
    _sweep,
    auto_slo_ms,
    evaluate,
    find_knee,
    knee_slice_by,
)
from cacheroute.replay.requestset import RequestSet, make_request_set
from cacheroute.replay.service import ServiceModel
from cacheroute.replay.simulator import SimConfig
from cacheroute.replay.traces import session_hints

S = 4.0  # seconds: the service time derived in the module docstring
N = 500
SINGLE = ServiceModel(
    prefill_fixed_s=0.4,
    prefill_per_token_s=3.2e-3,
    attention_per_pair_s=8e-7,
    chunk_tokens=1024,
    max_running=1,
)


def evenly_spaced(n: int = N, prompt: int = 1000) -> RequestSet:
    """n requests, one a second, each its own key (`t<j>/k<i>`), no cacheable block, 1 token out."""
    return make_request_set(
        times=[float(i) for i in range(n)],
        keys=[f"t{i % 7}/k{i}" for i in range(n)],
        prompt_tokens=[prompt] * n,
        output_tokens=[1] * n,
        block_lists=[[] for _ in range(n)],
        block_tokens=16,
        source="closed-form",
    )


def config(r: int, *, service: ServiceModel = SINGLE, **kw: object) -> EvalConfig:
    opts: dict[str, object] = {
        "policies": ("flat-lb", "cacheroute"),
        "sim": SimConfig(destinations=r, service=service),
        "slo_ms": 10_000.0,
        "slo_auto": False,
        "refine_steps": 6,
    }
    return EvalConfig(**(opts | kw))  # type: ignore[arg-type]


def test_the_service_time_is_the_hand_computed_one() -> None:
    u = np.array([1000.0])
    assert SINGLE.prefill_seconds(u, np.zeros(1))[0] == pytest.approx(S)
    runner = _Runner(evenly_spaced(), config(1), _Silent())
    m = runner.run("flat-lb", 0.1 / S)  # one request every 10 S: always an empty replica
    assert m.ttft_p50_ms == pytest.approx(1000 * S)
    assert m.ttft_p99_ms == pytest.approx(1000 * S)


@pytest.mark.parametrize("r", [1, 2])
def test_capacity_search_finds_r_over_s(r: int) -> None:
    runner = _Runner(evenly_spaced(), config(r), _Silent())
    loads = [f * r / S for f in (0.5, 0.9, 1.1)]
    sweep, _ = _sweep(runner, "flat-lb", loads, 0)
    assert [runner.passes(m) for m in sweep] == [True, True, False]
    assert sweep[0].ttft_p99_ms == pytest.approx(1000 * S)  # below capacity: no queueing at all
    cap = _capacity(runner, "flat-lb", sweep, 6)
    # 6 geometric bisections of [0.9, 1.1] x R/S leave a bracket of (1.1/0.9)^(1/64) = 1.0031
    assert r / S / 1.0032 <= cap <= 1.0031 * r / S


def test_a_policy_failing_the_whole_sweep_is_searched_below_it() -> None:
    # Every sweep load is 8x and more of the capacity R/S = 1/S: the search runs 2/S (fails),
    # then 0.5/S (passes), and bisects [0.5, 2] x 1/S six times: a bracket of 4^(1/64) = 1.0219.
    # It used to assume a quarter of the first load passed, never ran it, and reported 0.
    runner = _Runner(evenly_spaced(), config(1), _Silent())
    loads = [f / S for f in (8.0, 9.0)]
    sweep, _ = _sweep(runner, "flat-lb", loads, 0)
    assert not any(runner.passes(m) for m in sweep)
    cap = _capacity(runner, "flat-lb", sweep, 6)
    assert 1 / S / 1.022 <= cap <= 1 / S
    # and one that fails down to 1/4^DESCEND_STEPS of the sweep is 0
    hopeless = [f / S for f in (4.0**DESCEND_STEPS * 2, 4.0**DESCEND_STEPS * 3)]
    sweep, _ = _sweep(runner, "flat-lb", hopeless, 0)
    assert _capacity(runner, "flat-lb", sweep, 6) == 0.0


def test_cluster_sweep_extends_past_a_passing_top_and_marks_lower_bounds() -> None:
    # fixed load 0.1/S at R = 1: grid top 2.2 x 0.1/S (R = 1) and 2.2 x 0.2/S (R = 2), far below
    # capacity. Six x1.2 steps reach 0.22 x 1.2^6 = 0.657/S and 0.44 x 1.2^6 = 1.314/S: still
    # passing (capacities 1/S and 2/S), so those are lower bounds.
    base = evenly_spaced()
    capped = _Runner(base, config(1, cluster_sizes=(1, 2), extend_steps=6), _Silent())
    rows = _cluster_sweep(capped, capped.cfg, 0.1 / S)
    for row, r in zip(rows, (1, 2), strict=True):
        f, c = row["flat-lb"], row["cacheroute"]
        assert f["slo_capacity_is_lower_bound"]
        assert f["slo_capacity_qps"] == pytest.approx(2.2 * 1.2**6 * 0.1 * r / S)
        ours = c["slo_capacity_is_lower_bound"]
        assert row["capacity_ratio_is"] == ("undetermined" if ours else "upper bound")
    assert rows[0]["capacity_ratio_is"] == "undetermined"  # R = 1: both policies are one queue
    # twelve steps pass R/S (0.22 x 1.2^9 = 1.135/S; 0.44 x 1.2^9 = 2.27/S): exact capacities
    extended = _Runner(base, config(1, cluster_sizes=(1, 2), extend_steps=12), _Silent())
    rows = _cluster_sweep(extended, extended.cfg, 0.1 / S)
    for row, r in zip(rows, (1, 2), strict=True):
        f = row["flat-lb"]
        assert not f["slo_capacity_is_lower_bound"]
        # bisection of one x1.2 step, 6 times: resolution 1.2^(1/64) = 1.0029
        assert r / S / 1.003 <= f["slo_capacity_qps"] <= 1.0031 * r / S


def test_knee_capacity_and_auto_slo_in_closed_form() -> None:
    base = evenly_spaced()
    ev = evaluate(base, config(1, slo_auto=True, slo_ms=2000.0))
    # idle p99 = S = 4000 ms > 2000 ms: SLO = 2.5 x 4000 ms = 10,000 ms (already two figures)
    assert AUTO_SLO_MULTIPLE == 2.5
    assert ev.slo is not None
    assert ev.slo.idle_p99_ms == pytest.approx(1000 * S)
    assert ev.config.slo_ms == 10_000.0
    cluster = ev.to_dict()["cluster"]
    assert cluster["slo_ms"] == 10_000.0
    assert cluster["slo_auto"] is True
    assert cluster["slo_derived"] is True
    assert cluster["slo_idle_p99_ms"] == pytest.approx(4000.0)
    assert cluster["slo_rule"] == (
        "auto, derived: 2.5 x the idle replica's p99 4000 ms, rounded up to two significant figures"
    )
    # R = 1: the knee slice is the whole (evenly spaced) replay on one replica: knee = 1/S, found
    # by doubling/halving then 6 bisections of a x2 bracket (resolution 2^(1/64) = 1.011)
    assert 1 / S / 1.011 <= ev.knee_qps <= 1.0031 / S
    for name in ("flat-lb", "cacheroute"):  # one replica: every policy is the same queue
        cap = ev.policies[name].slo_capacity_qps
        assert 1 / S / 1.003 <= cap <= 1.0031 / S, name
    assert ev.simulation_verdict == "tie"


def test_without_auto_the_same_workload_has_no_knee() -> None:
    with pytest.raises(ReplayError, match="no load meets the SLO"):
        find_knee(evenly_spaced(), config(1, slo_ms=2000.0))


def test_auto_keeps_the_default_when_an_idle_replica_meets_it_with_headroom() -> None:
    # S = 0.04 + 3.2e-4 * 1000 + 8e-8 * 500_000 = 0.04 + 0.32 + 0.04 = 0.4 s; 2.5 x 400 ms fits
    fast = ServiceModel(
        prefill_fixed_s=0.04,
        prefill_per_token_s=3.2e-4,
        attention_per_pair_s=8e-8,
        chunk_tokens=1024,
        max_running=1,
    )
    base = evenly_spaced()
    cfg = config(1, service=fast, slo_auto=True, slo_ms=2000.0)
    choice, floor, _ = _choose_slo(base, base, cfg, _Silent())
    assert choice.ms == 2000.0
    assert choice.auto
    assert not choice.derived
    assert choice.idle_p99_ms == pytest.approx(400.0)
    assert floor is not None
    given, none, runs = _choose_slo(base, base, config(1, service=fast, slo_ms=700.0), _Silent())
    assert (given.ms, given.auto, given.derived, none, runs) == (700.0, False, False, None, 0)


@pytest.mark.parametrize(
    ("idle", "slo"),
    [
        (400.0, 2000.0),  # 1000 ms fits in the default
        (800.0, 2000.0),  # 2000 ms: exactly the default still fits
        (1000.0, 2500.0),
        (4000.0, 10_000.0),
        (8300.0, 21_000.0),  # 20,750 rounded up to two significant figures
        (8834.3, 23_000.0),  # the Mooncake arXiv trace's knee slice: 22,086 -> 23,000
        (123_456.0, 310_000.0),  # 308,640 -> 310,000
    ],
)
def test_auto_slo_rule(idle: float, slo: float) -> None:
    assert auto_slo_ms(idle) == slo


def _one_key_conversations(keys: list[str] | None = None) -> RequestSet:
    """`evenly_spaced` requests, each its own conversation (its own two blocks of 16 tokens, no
    reuse), under one routing key - a trace keyed by a system prompt every conversation shares -
    or under `keys`."""
    return make_request_set(
        times=[float(i) for i in range(N)],
        keys=keys if keys is not None else ["app/system-prompt"] * N,
        prompt_tokens=[1000] * N,
        output_tokens=[1] * N,
        block_lists=[[2 * i, 2 * i + 1] for i in range(N)],
        block_tokens=16,
        source="one key",
    )


def test_a_workload_with_one_coarse_key_gets_its_knee_by_conversation() -> None:
    # R = 5: the one key carries every request, more than a replica's share, so no key is light
    # enough for the knee's slice; it used to stop with "too small to measure a replica's knee".
    coarse = _one_key_conversations()
    cfg = config(5)
    knee, _ = find_knee(coarse, cfg)
    # the reference: the same trace keyed by conversation (`--key-blocks session`)
    fine = _one_key_conversations(list(session_hints(coarse)))
    assert len(set(fine.keys)) == N
    ref, _ = find_knee(fine, cfg)
    assert knee == ref
    # and it is a replica's capacity: at most 1/S (one sequence at a time, S seconds each)
    assert 0 < knee <= 1.0031 / S


def test_without_blocks_a_coarse_key_is_sliced_by_request() -> None:
    def one_key(n: int, keys: list[str] | None = None) -> RequestSet:
        return make_request_set(
            times=[float(i) for i in range(n)],
            keys=keys if keys is not None else ["app/all"] * n,
            prompt_tokens=[1000] * n,
            output_tokens=[1] * n,
            block_lists=[[] for _ in range(n)],
            block_tokens=16,
            source="one key, no blocks",
        )

    # no blocks, so no conversations to find: the last resort takes each request as its key
    knee, _ = find_knee(one_key(N), config(5))
    ref, _ = find_knee(one_key(N, [f"request-{i}" for i in range(N)]), config(5))
    assert knee == ref
    assert 0 < knee <= 1.0031 / S  # a replica serves one sequence at a time, S seconds each
    # too few requests for any slice: the error says what to do
    with pytest.raises(ReplayError, match=r"too small to measure a replica's knee.*--requests"):
        find_knee(one_key(100), config(5))


def test_the_report_says_how_the_knee_slice_was_cut() -> None:
    coarse = evaluate(_one_key_conversations(), config(5))
    assert coarse.knee_slice_by == "conversation"
    plan = coarse.to_dict()["plan"]
    assert plan["knee_slice_by"] == "conversation"
    assert plan["q_cap_source"].endswith("sliced by conversation (the keys were too coarse)")
    assert knee_slice_by(evenly_spaced(), config(5)) == "key"  # a key per request: the rule
    no_blocks = make_request_set(
        times=[float(i) for i in range(N)],
        keys=["app/all"] * N,
        prompt_tokens=[1000] * N,
        output_tokens=[1] * N,
        block_lists=[[] for _ in range(N)],
        block_tokens=16,
        source="one key, no blocks",
    )
    assert knee_slice_by(no_blocks, config(5)) == "request"
