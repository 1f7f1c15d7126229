"""The evaluation driver on a tiny configuration: structure, verdict values, reports, plots."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cacheroute.replay import evaluate as evaluate_module
from cacheroute.replay.diagnostic import Verdict
from cacheroute.replay.errors import ReplayError
from cacheroute.replay.evaluate import EvalConfig, Evaluation, calibrate, evaluate
from cacheroute.replay.metrics import RunMetrics
from cacheroute.replay.report import (
    EvidenceRun,
    evidence_checks,
    not_winning,
    peak_at_middle,
    render_evidence,
    render_run,
)
from cacheroute.replay.requestset import make_request_set
from cacheroute.replay.service import ServiceModel
from cacheroute.replay.simulator import SimConfig

from .conftest import WorkloadFactory


@pytest.fixture(scope="module")
def small_eval(workload_factory: WorkloadFactory) -> Evaluation:
    q = workload_factory("whale", requests=3000, keys=300)
    cfg = EvalConfig(
        policies=("flat-lb", "affinity", "affinity+replication", "cacheroute"),
        sim=SimConfig(destinations=5),
        load_factors=(0.4, 0.8, 1.2),
        refine_steps=1,
        cluster_sizes=(3, 5),
    )
    return evaluate(q, cfg)


def test_result_has_the_documented_json_shape(small_eval: Evaluation) -> None:
    d = small_eval.to_dict()
    for name in ("flat-lb", "affinity", "affinity+replication", "cacheroute"):
        p = d["policies"][name]
        for field in ("hit_rate", "max_over_mean", "p99_ms", "slo_capacity_qps", "sweep"):
            assert field in p
        assert 0 <= p["hit_rate"] <= 1
    assert d["diagnostic"]["verdict"] in ("win", "tie", "lose")
    assert d["simulation"]["verdict"] in ("win", "tie", "lose")
    assert d["recommendation"] in ("deploy", "keep flat-lb")
    assert d["knee_qps_per_replica"] > 0
    assert d["plan"]["q_cap"] == d["knee_qps_per_replica"]
    assert d["plan"]["q_cap_source"] == (
        "1 x the knee measured on the evaluated requests (not held out)"
    )
    assert d["plan"]["knee_held_out"] is False
    assert d["reference_qps"] in d["loads_qps"]
    assert [row["destinations"] for row in d["cluster_sweep"]] == [3, 5]
    for row in d["cluster_sweep"]:
        for name in ("flat-lb", "cacheroute"):
            assert isinstance(row[name]["slo_capacity_is_lower_bound"], bool)
        assert row["capacity_ratio_is"] in ("exact", "lower bound", "upper bound", "undetermined")
    assert d["sim_requests"] > 3000
    # auto SLO (the default): these 3k-token prompts meet 2 s on an idle replica with room
    c = d["cluster"]
    assert (c["slo_ms"], c["slo_auto"], c["slo_derived"]) == (2000.0, True, False)
    assert 0 < 2.5 * c["slo_idle_p99_ms"] <= 2000.0
    assert 0 < 2.5 * c["slo_knee_slice_idle_p99_ms"] <= 2000.0
    assert c["slo_rule"].startswith("auto, default kept: 2.5 x the idle replica's p99 ")
    assert c["slo_rule"].endswith(" ms fits in 2000 ms")


def _metrics(policy: str, load: float, p99_ms: float) -> RunMetrics:
    return RunMetrics(
        policy=policy,
        offered_qps=load,
        destinations=5,
        measured_requests=100,
        hit_rate=0.5,
        max_over_mean=1.0,
        max_over_mean_prefill=1.0,
        ttft_p50_ms=p99_ms / 2,
        ttft_p99_ms=p99_ms,
        e2e_p50_ms=p99_ms,
        e2e_p99_ms=p99_ms,
        queue_p99_ms=0.0,
        hot_ttft_p99_ms=p99_ms,
        cold_ttft_p99_ms=p99_ms,
        hot_keys=1,
        load=(20, 20, 20, 20, 20),
    )


@pytest.mark.parametrize(
    "case",
    [
        # Flat-LB: capacity 10 req/s, p99 1000 ms at the reference load
        (12.0, 800.0, "win", "deploy"),  # 1.2x capacity, 0.8x p99
        (12.0, 950.0, "win", "keep flat-lb"),  # more capacity but p99 only 0.95x
        (11.0, 900.0, "win", "deploy"),  # exactly 1.10x and 0.90x: both bounds included
        (10.9, 500.0, "tie", "keep flat-lb"),  # 1.09x: a tie, however good the p99
        (10.0, 100.0, "tie", "keep flat-lb"),
        (9.0, 500.0, "lose", "keep flat-lb"),  # exactly 0.90x
        (5.0, 2000.0, "lose", "keep flat-lb"),
    ],
)
def test_verdicts_follow_hand_set_capacities(
    workload_factory: WorkloadFactory,
    monkeypatch: pytest.MonkeyPatch,
    case: tuple[float, float, str, str],
) -> None:
    cap, p99, verdict, recommendation = case
    caps = {"flat-lb": 10.0, "cacheroute": cap}
    p99s = {"flat-lb": 1000.0, "cacheroute": p99}

    def knee(*_: Any, **__: Any) -> tuple[float, int]:
        return 2.0, 0

    def sweep(
        _runner: Any, name: str, loads: Sequence[float], _extend: int
    ) -> tuple[list[RunMetrics], dict[str, Any]]:
        return [_metrics(name, loads[0], p99s[name])], {}

    def capacity(_runner: Any, name: str, *_: Any) -> float:
        return caps[name]

    monkeypatch.setattr(evaluate_module, "find_knee", knee)
    monkeypatch.setattr(evaluate_module, "_sweep", sweep)
    monkeypatch.setattr(evaluate_module, "_capacity", capacity)
    q = workload_factory("whale", requests=3000, keys=300)
    cfg = EvalConfig(
        policies=("flat-lb", "cacheroute"),
        sim=SimConfig(destinations=5),
        slo_auto=False,
        load_factors=(0.5,),
    )
    ev = evaluate(q, cfg)
    assert ev.reference_qps == 0.5 * 5 * 2.0
    assert ev.capacity_ratio == pytest.approx(cap / 10.0)
    assert ev.p99_ratio == pytest.approx(p99 / 1000.0)
    assert ev.simulation_verdict == verdict
    assert ev.recommendation == recommendation


def test_report_and_checks_are_computed(small_eval: Evaluation, tmp_path: Path) -> None:
    md = render_run(small_eval, {"p99": "p99.png"}, title="Tiny")
    assert "| cacheroute |" in md
    assert "![p99](p99.png)" in md
    assert "Recommendation" in md
    assert "SLO: p99 TTFT <= 2.00 s (auto, default kept: 2.5 x the idle replica's p99 " in md
    assert "(on the evaluated requests, not held out)" in md
    checks = evidence_checks(small_eval, None)
    assert {c.claim.split(":")[0] for c in checks} == {"whale"}
    cr = small_eval.policies["cacheroute"]
    for value, holds in ((1.10, True), (1.15, True), (1.1503, False), (1.30, False)):
        ref = dataclasses.replace(cr.at_reference, max_over_mean_prefill=value)
        ev = dataclasses.replace(
            small_eval,
            policies={
                **small_eval.policies,
                "cacheroute": dataclasses.replace(cr, at_reference=ref),
            },
        )
        prefill = next(c for c in evidence_checks(ev, None) if "prefill max/mean" in c.claim)
        assert prefill.holds is holds
        assert prefill.measured.startswith(f"{value:.3f} at the reference load")
    doc = render_evidence(
        [EvidenceRun("Tiny", small_eval, {}, "cacheroute evaluate ...")],
        checks,
        header="# Doc",
        timing={"wall_s": 1.0, "sim_requests": 10, "sim_requests_per_s": 10.0},
    )
    assert doc.startswith("# Doc")
    assert "| criterion | measured | holds |" in doc


def test_plots_are_written(small_eval: Evaluation, tmp_path: Path) -> None:
    from cacheroute.replay.plots import save_plots  # noqa: PLC0415 - matplotlib is slow

    files = save_plots(small_eval, tmp_path, "t_")
    assert set(files) == {"hit_vs_load", "p99_vs_load", "load_bars", "cluster_sweep"}
    for f in files.values():
        assert f.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_config_needs_the_baseline_and_ours() -> None:
    with pytest.raises(ReplayError):
        EvalConfig(policies=("flat-lb", "sticky"))
    with pytest.raises(ReplayError):
        EvalConfig(policies=("flat-lb", "cacheroute", "nope"))


def test_where_cacheroute_does_not_win_is_computed(small_eval: Evaluation) -> None:
    checks = evidence_checks(small_eval, None)
    failing = [c for c in checks if not c.holds]
    cases: tuple[tuple[Verdict, bool], ...] = (("win", False), ("tie", True), ("lose", True))
    for verdict, listed in cases:
        ev = dataclasses.replace(small_eval, simulation_verdict=verdict)
        items = not_winning([EvidenceRun("Tiny", ev, {}, "cmd")], checks)
        assert sum(i.startswith("Criterion not met") for i in items) == len(failing)
        assert any(f"simulation says **{verdict}**" in i for i in items) == listed, verdict


def _row(
    r: int, ratio: float, ours_lower: bool = False, flat_lower: bool = False
) -> dict[str, Any]:
    kind = evaluate_module._ratio_kind(ours_lower, flat_lower)
    return {"destinations": r, "capacity_ratio": ratio, "capacity_ratio_is": kind}


def test_cluster_criterion_holds_only_for_a_measured_peak() -> None:
    assert peak_at_middle([_row(8, 1.2), _row(30, 1.5), _row(60, 1.1)]) == 30
    assert peak_at_middle([_row(60, 1.1), _row(8, 1.2), _row(30, 1.5)]) == 30  # any order
    assert peak_at_middle([_row(8, 1.2), _row(30, 1.24), _row(60, 1.1)]) is None  # within 5%
    assert peak_at_middle([_row(8, 1.0), _row(30, 1.2), _row(60, 1.4)]) is None  # monotone
    # a lower-bound neighbour may be higher than the middle: no peak can be claimed
    assert peak_at_middle([_row(8, 1.2), _row(30, 1.5), _row(60, 1.1, ours_lower=True)]) is None
    # a lower-bound middle only helps it; an undetermined one proves nothing
    assert peak_at_middle([_row(8, 1.2), _row(30, 1.5, ours_lower=True), _row(60, 1.1)]) == 30
    assert (
        peak_at_middle([_row(8, 1.2), _row(30, 1.5, ours_lower=True, flat_lower=True), _row(60, 1)])
        is None
    )
    assert peak_at_middle([_row(8, 1.2), _row(30, 1.5)]) is None


def test_cluster_check_reports_the_ratios_and_the_effect(small_eval: Evaluation) -> None:
    def check(rows: list[dict[str, Any]]) -> tuple[str, bool]:
        ev = dataclasses.replace(small_eval, cluster_sweep=rows)
        (c,) = [c for c in evidence_checks(ev, None) if "cluster size" in c.claim]
        return c.measured, c.holds

    measured, holds = check([_row(8, 1.2), _row(30, 1.5), _row(60, 1.1)])
    assert holds
    assert measured.startswith("R=8: 1.20x, R=30: 1.50x, R=60: 1.10x; the gain peaks at R=30")
    measured, holds = check([_row(8, 1.0), _row(30, 1.2), _row(60, 1.4, ours_lower=True)])
    assert not holds  # three ratios alone do not make the criterion hold
    assert "R=60: >= 1.40x" in measured
    assert "does not appear" in measured
    measured, holds = check([_row(8, 1.0), _row(30, 1.2)])
    assert not holds
    assert "three cluster sizes" in measured


def test_a_policy_serving_the_top_load_is_swept_further(workload_factory: WorkloadFactory) -> None:
    q = workload_factory("whale", requests=3000, keys=300)
    low = (0.05, 0.1)  # far below the knee: every policy passes both loads
    capped = evaluate(
        q,
        EvalConfig(
            policies=("flat-lb", "cacheroute"),
            sim=SimConfig(destinations=5),
            load_factors=low,
            refine_steps=1,
            extend_steps=0,
        ),
    )
    for p in capped.policies.values():
        assert len(p.sweep) == 2
        assert p.capacity_is_lower_bound
        assert p.slo_capacity_qps == pytest.approx(p.sweep[-1].offered_qps)
    extended = evaluate(
        q,
        EvalConfig(
            policies=("flat-lb", "cacheroute"),
            sim=SimConfig(destinations=5),
            load_factors=low,
            refine_steps=1,
            extend_steps=2,
        ),
    )
    for name, p in extended.policies.items():
        loads = [m.offered_qps for m in p.sweep]
        assert len(loads) == 4  # two x1.2 steps past the top
        assert loads[2] == pytest.approx(1.2 * loads[1])
        assert p.slo_capacity_qps >= capped.policies[name].slo_capacity_qps
        assert (
            p.to_dict(extended.config.slo_metric, extended.config.slo_ms)[
                "slo_capacity_is_lower_bound"
            ]
            == p.capacity_is_lower_bound
        )


def test_bad_extension_settings_are_refused() -> None:
    with pytest.raises(ReplayError, match="spill_factor"):
        EvalConfig(spill_factor=0.5)
    with pytest.raises(ReplayError, match="fair_share"):
        EvalConfig(fair_share=0.0)
    with pytest.raises(ReplayError, match="intervals"):
        EvalConfig(intervals=0)
    with pytest.raises(ReplayError, match="control_interval_s"):
        EvalConfig(control_interval_s=0.0)
    with pytest.raises(ReplayError, match="rate_decay"):
        EvalConfig(rate_decay=1.5)


def test_worker_processes_give_the_same_evaluation(
    small_eval: Evaluation, workload_factory: WorkloadFactory
) -> None:
    q = workload_factory("whale", requests=3000, keys=300)
    cfg = EvalConfig(
        policies=("flat-lb", "affinity", "affinity+replication", "cacheroute"),
        sim=SimConfig(destinations=5),
        load_factors=(0.4, 0.8, 1.2),
        refine_steps=1,
        jobs=2,
    )
    parallel = evaluate(q, cfg)
    for name, p in small_eval.policies.items():
        other = parallel.policies[name]
        assert other.slo_capacity_qps == p.slo_capacity_qps
        assert [m.to_dict() for m in other.sweep] == [m.to_dict() for m in p.sweep]
        assert other.at_reference.to_dict() == p.at_reference.to_dict()
    with pytest.raises(ReplayError, match="jobs"):
        EvalConfig(jobs=0)


def test_replay_replans_at_the_planner_services_cadence(tiny_factory: Any) -> None:
    """Hand-derived: a 3,000 s trace re-plans every 60 s (50 intervals, more than 15) with
    counts halving per interval; a 150 s replay every 10 s (15 intervals), where counts halve
    every 6 intervals: 0.5 ** (10 / 60)."""
    long = tiny_factory([[1]] * 2, times=[0.0, 3000.0])
    short = tiny_factory([[1]] * 2, times=[0.0, 150.0])
    cfg = EvalConfig()
    assert cfg.interval_s(long) == 60.0
    assert cfg.intervals_for(long) == 50
    assert cfg.rate_decay_for(long) == pytest.approx(0.5)
    assert cfg.interval_s(short) == pytest.approx(10.0)
    assert cfg.intervals_for(short) == 15
    assert cfg.rate_decay_for(short) == pytest.approx(0.8908987, rel=1e-6)
    # a replay stretched to days re-plans at most 256 times
    days = tiny_factory([[1]] * 2, times=[0.0, 86_400.0 * 10])
    assert cfg.intervals_for(days) == 256
    assert cfg.rate_decay_for(days) == pytest.approx(0.5 ** (86_400.0 * 10 / 256 / 60))
    # the old behaviour on request: 15 plans per replay from all counts so far
    old = EvalConfig(control_interval_s=None, rate_decay=1.0)
    assert old.interval_s(long) == 200.0
    assert old.intervals_for(long) == 15
    assert old.rate_decay_for(long) == 1.0


def test_a_prompt_no_replica_can_hold_is_left_out_not_simulated(
    workload_factory: WorkloadFactory,
) -> None:
    # the reference: the same evaluation without the record. Simulated, one 10M-token prompt
    # held its replica for hours and took every policy's capacity to 0
    q = workload_factory("whale", requests=1500, keys=150)
    sizes = np.diff(q.block_offsets).tolist()
    ids = q.block_ids.tolist()
    lists = [ids[o : o + s] for o, s in zip(q.block_offsets.tolist(), sizes, strict=False)]
    middle = float(q.times[q.n // 2])
    with_huge = make_request_set(
        times=[*q.times.tolist(), middle],
        keys=[*(q.keys[k] for k in q.key_index.tolist()), "huge"],
        prompt_tokens=[*q.prompt_tokens.tolist(), 10_000_000],
        output_tokens=[*q.output_tokens.tolist(), 10],
        block_lists=[*lists, [10**9 + j for j in range(10_000_000 // q.block_tokens)]],
        prefix_tokens=[*q.prefix_tokens.tolist(), 0],
        block_tokens=q.block_tokens,
        source=q.source,
    )
    cfg = EvalConfig(
        policies=("flat-lb", "cacheroute"),
        sim=SimConfig(destinations=5),
        load_factors=(0.4, 0.8, 1.2),
        refine_steps=1,
    )
    ref, got = evaluate(q, cfg), evaluate(with_huge, cfg)
    for name in cfg.policies:
        assert got.policies[name].slo_capacity_qps > 0
        assert got.policies[name].slo_capacity_qps == ref.policies[name].slo_capacity_qps
    notes = got.workload["notes"]
    assert notes[-1].startswith("left out 1 of 1,501 requests whose prompt exceeds")


def test_calibration_leaves_out_what_no_modelled_replica_could_hold(
    workload_factory: WorkloadFactory,
) -> None:
    q = workload_factory("whale", requests=400, keys=40)
    cap = int(q.prompt_tokens.max())
    big = int(np.argmax(q.prompt_tokens))
    cfg = EvalConfig(policies=("flat-lb", "cacheroute"), sim=SimConfig(destinations=5))
    small = dataclasses.replace(
        cfg, sim=SimConfig(destinations=5, service=ServiceModel(cache_tokens=cap - 1))
    )
    got = calibrate(q, small, q_cap=1.0, destinations=5, gateways=1)
    rest = q.subset(np.arange(q.n) != big, "reference")
    want = calibrate(rest, small, q_cap=1.0, destinations=5, gateways=1)
    assert got.left_out == 1
    assert want.left_out == 0
    assert got.requests == q.n - 1
    assert got.simulated_hit_rate == want.simulated_hit_rate
    assert calibrate(q, cfg, q_cap=1.0, destinations=5, gateways=1).left_out == 0
