"""The evaluation driver on a tiny configuration: structure, verdict values, reports, plots."""

from __future__ import annotations

from pathlib import Path

import pytest

from cacheroute.replay.errors import ReplayError
from cacheroute.replay.evaluate import EvalConfig, Evaluation, evaluate
from cacheroute.replay.report import (
    EvidenceRun,
    evidence_checks,
    not_winning,
    render_evidence,
    render_run,
)
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
    assert d["reference_qps"] in d["loads_qps"]
    assert [row["destinations"] for row in d["cluster_sweep"]] == [3, 5]
    assert d["sim_requests"] > 3000


def test_recommendation_needs_both_capacity_and_p99(small_eval: Evaluation) -> None:
    ev = small_eval
    better = ev.capacity_ratio >= 1.10 and ev.p99_ratio <= 0.90
    assert (ev.recommendation == "deploy") == better


def test_report_and_checks_are_computed(small_eval: Evaluation, tmp_path: Path) -> None:
    md = render_run(small_eval, {"p99": "p99.png"}, title="Tiny")
    assert "| cacheroute |" in md
    assert "![p99](p99.png)" in md
    assert "Recommendation" in md
    checks = evidence_checks(small_eval, None)
    assert {c.claim.split(":")[0] for c in checks} == {"whale"}
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
    run = EvidenceRun("Tiny", small_eval, {}, "cmd")
    checks = evidence_checks(small_eval, None)
    items = not_winning([run], checks)
    failing = [c for c in checks if not c.holds]
    assert sum(i.startswith("Criterion not met") for i in items) == len(failing)
    if small_eval.simulation_verdict != "win":
        assert any("simulation says" in i for i in items)


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
