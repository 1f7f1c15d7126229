"""Markdown reports: one per evaluation, and the evidence document built from several.

Every number is read from the Evaluation; the evidence checks are computed, never written in.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cacheroute.replay.evaluate import PLANNER_INTERVAL_S, EvalConfig, Evaluation, PolicyReport

__all__ = [
    "Check",
    "EvidenceRun",
    "evidence_checks",
    "fleet_capacities",
    "not_winning",
    "peak_at_middle",
    "relative",
    "render_agreement",
    "render_evidence",
    "render_fleet",
    "render_run",
]


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _ms(x: float) -> str:
    if math.isnan(x):
        return "n/a"
    return f"{x / 1e3:.2f} s" if x >= 1000 else f"{x:.0f} ms"


def _qps(x: float) -> str:
    return "inf" if math.isinf(x) else f"{x:.0f}"


def _ratio(x: float) -> str:
    """A ratio as `1.23x`; three decimals near the 0.90 / 1.10 verdict bounds (1.096 is a tie)."""
    two = f"{x:.2f}"
    return f"{x:.3f}x" if two in ("0.90", "1.10") and x not in (0.9, 1.1) else f"{two}x"


def _cap(p: PolicyReport) -> str:
    """SLO capacity; `>= x` when the policy still served the highest load that was run."""
    return f"{'>= ' if p.capacity_is_lower_bound else ''}{_qps(p.slo_capacity_qps)}"


def _row_cap(side: Mapping[str, Any]) -> str:
    """A cluster-size row's capacity; `>= x` when it is a lower bound."""
    lower = bool(side.get("slo_capacity_is_lower_bound", False))
    return f"{'>= ' if lower else ''}{_qps(side['slo_capacity_qps'])}"


_RATIO_MARK = {"exact": "", "lower bound": ">= ", "upper bound": "<= ", "undetermined": "? "}


def _row_ratio(row: Mapping[str, Any]) -> str:
    return f"{_RATIO_MARK[row.get('capacity_ratio_is', 'exact')]}{row['capacity_ratio']:.2f}x"


def _top(p: PolicyReport) -> str:
    top = p.at_capacity
    return "n/a" if top is None else f"{top.max_over_mean:.2f} @ {top.offered_qps:.0f}"


def _replanning(cfg: EvalConfig) -> str:
    """How the plan-based policies re-plan, in words."""
    every = f"{cfg.intervals} times per replay"
    if cfg.control_interval_s is not None:
        every = (
            f"every {cfg.control_interval_s:g} s of replay time or {every}, whichever is more often"
        )
    window = (
        f"counts halving every {PLANNER_INTERVAL_S:g} s (the planner service's EWMA)"
        if cfg.rate_decay is None
        else "all counts so far"
        if cfg.rate_decay >= 1.0
        else f"counts decayed by {cfg.rate_decay:g} per interval"
    )
    return f"observed rates ({window}), re-planned {every}"


def _slo_source(ev: Evaluation) -> str:
    """Whether the SLO was given, kept as the default or derived from an idle replica."""
    return "given" if ev.slo is None else ev.slo.rule


def _knee_source(ev: Evaluation) -> str:
    where = (
        f"on {ev.knee_held_out}"
        if ev.knee_held_out is not None
        else "on the evaluated requests, not held out"
    )
    if ev.knee_slice_by != "key":
        where += f"; its affinity slice cut by {ev.knee_slice_by}, the keys being too coarse"
    return where


def render_run(ev: Evaluation, plots: Mapping[str, str], *, title: str, level: int = 2) -> str:
    """Markdown for one evaluation; `plots` maps plot name -> relative path."""
    h = "#" * level
    cfg = ev.config
    w = ev.workload
    metric = cfg.slo_metric.upper()
    flat_cap = ev.policies["flat-lb"].slo_capacity_qps
    lines = [
        f"{h} {title}",
        "",
        f"Workload: {w['source']}; {w['requests']:,} requests over {w['keys']:,} keys "
        f"(Gini of request counts {w['gini']:.2f}, top 4% of keys {_pct(w['top4_share'])}, "
        f"largest key {_pct(w['max_key_share'])}), mean prompt {w['mean_prompt_tokens']:.0f} "
        f"tokens, mean output {w['mean_output_tokens']:.0f}.",
        f"Scaling: {'; '.join(w['notes']) or 'none'}; every load point time-compresses this "
        f"replay (base {w['base_rate_qps']:.1f} req/s) to the offered load.",
        f"Cluster: R = {cfg.sim.destinations}, prefix cache {cfg.sim.service.cache_tokens:,} "
        f"tokens and {cfg.sim.service.max_running} running sequences per replica; SLO: p99 "
        f"{metric} <= {_ms(cfg.slo_ms)} ({_slo_source(ev)}). Measured knee of one replica "
        f"{ev.knee_qps:.1f} req/s ({_knee_source(ev)}); "
        f"q_cap = {ev.q_cap:.1f} req/s; W = {cfg.warm_slots}; cacheroute: fair share "
        f"{'off' if cfg.fair_share is None else f'{cfg.fair_share:g} x mean'}, sibling "
        f"co-location {'off' if cfg.group_separator is None else repr(cfg.group_separator)}, "
        f"spill {'off' if cfg.spill_factor is None else f'at {cfg.spill_factor:g} x mean'}; "
        f"{'oracle rates' if cfg.oracle else _replanning(cfg)}.",
        f"Reference (matched) load: {ev.reference_qps:.0f} req/s, the highest sweep load "
        "Flat-LB still serves within the SLO. Hit rate, imbalance and p99 below are at that load.",
        "",
        f"| policy | KV hit | max/mean (requests) | max/mean (prefill) | p99 {metric} | "
        f"p99 E2E | SLO capacity (req/s) | vs Flat-LB | p99 {metric} hot keys / cold tail | "
        "max/mean at own top load |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, p in ev.policies.items():
        ref = p.at_reference
        vs = p.slo_capacity_qps / flat_cap if flat_cap > 0 else math.inf
        lines.append(
            f"| {name} | {_pct(ref.hit_rate)} | {ref.max_over_mean:.2f} | "
            f"{ref.max_over_mean_prefill:.2f} | {_ms(ref.p99_ms(cfg.slo_metric))} | "
            f"{_ms(ref.e2e_p99_ms)} | {_cap(p)} | {'>= ' if p.capacity_is_lower_bound else ''}"
            f"{vs:.2f}x | "
            f"{_ms(ref.hot_ttft_p99_ms)} / {_ms(ref.cold_ttft_p99_ms)} | {_top(p)} |"
        )
    d = ev.diagnostic
    lines += [
        "",
        f"Diagnostic (workload only, no simulation): **{d.verdict}** - {d.reason}. Expected hit "
        f"rate with affinity {_pct(d.hit_affinity)} vs spreading {_pct(d.hit_spread)} "
        f"(eviction horizons {d.horizon_affinity_s:.0f} s / {d.horizon_spread_s:.0f} s), "
        f"predicted capacity gain {d.predicted_gain:.2f}x, {_pct(d.pinned_share)} of requests "
        "from recurring keys.",
        f"Simulation: CacheRoute / Flat-LB capacity {_ratio(ev.capacity_ratio)}, p99 at the "
        f"reference load {ev.p99_ratio:.2f}x -> **{ev.simulation_verdict}**. The diagnostic "
        f"{'agrees' if ev.agree else 'DISAGREES'} with the simulation.",
        f"Recommendation: **{ev.recommendation}** (deploy only if capacity and p99 both beat "
        f"Flat-LB by at least {_pct(cfg.margin)}; hit rate does not count).",
    ]
    if ev.cluster_sweep:
        lines += [
            "",
            f"Cluster size at a fixed offered load of {ev.cluster_sweep[0]['offered_qps']:.0f} "
            "req/s (capacities from a sweep at each R):",
            "",
            "| R | hit Flat-LB | hit CacheRoute | p99 Flat-LB | p99 CacheRoute | capacity "
            "Flat-LB | capacity CacheRoute | capacity ratio |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for row in ev.cluster_sweep:
            f, c = row["flat-lb"], row["cacheroute"]
            lines.append(
                f"| {row['destinations']} | {_pct(f['hit_rate'])} | {_pct(c['hit_rate'])} | "
                f"{_ms(f['p99_ms'])} | {_ms(c['p99_ms'])} | {_row_cap(f)} | {_row_cap(c)} | "
                f"{_row_ratio(row)} |"
            )
        lines += [
            "",
            "`>=`: still within the SLO at the highest load run (a lower bound); a ratio with "
            "`>=`/`<=` is bounded on one side only, `?` where both capacities are lower bounds.",
        ]
    if plots:
        lines.append("")
        lines += [f"![{name}]({path})" for name, path in plots.items()]
    return "\n".join(lines) + "\n"


@dataclass(frozen=True, slots=True)
class Check:
    """One criterion of the issue's evidence section, with what was measured."""

    claim: str
    measured: str
    holds: bool


def evidence_checks(whale: Evaluation | None, low: Evaluation | None) -> list[Check]:
    """The issue's evidence criteria, evaluated on the runs."""
    out: list[Check] = []
    if whale is not None:
        p = whale.policies
        fl, aff, rep, cr = (
            p.get("flat-lb"),
            p.get("affinity"),
            p.get("affinity+replication"),
            p["cacheroute"],
        )
        if fl and aff:
            a, f = aff.at_reference, fl.at_reference
            out.append(
                Check(
                    "whale: `affinity` has a high hit rate and high imbalance",
                    f"hit {_pct(a.hit_rate)} (Flat-LB {_pct(f.hit_rate)}), max/mean "
                    f"{a.max_over_mean:.2f}",
                    a.hit_rate >= f.hit_rate + 0.10 and a.max_over_mean >= 2.0,
                )
            )
        if aff and rep:
            out.append(
                Check(
                    "whale: `affinity+replication` lowers imbalance",
                    f"max/mean {rep.at_reference.max_over_mean:.2f} vs "
                    f"{aff.at_reference.max_over_mean:.2f}",
                    rep.at_reference.max_over_mean < aff.at_reference.max_over_mean,
                )
            )
        if aff:
            gap = aff.at_reference.hit_rate - cr.at_reference.hit_rate
            out.append(
                Check(
                    "whale: `cacheroute` hit rate within 3 points of `affinity`",
                    f"{_pct(cr.at_reference.hit_rate)} vs {_pct(aff.at_reference.hit_rate)} "
                    f"({-100 * gap:+.1f} points against `affinity`)",
                    gap <= 0.03,
                )
            )
        top = cr.at_capacity
        out.append(
            Check(
                "whale: `cacheroute` max/mean <= 1.3",
                f"{cr.at_reference.max_over_mean:.2f} at the reference load; "
                + (
                    "n/a"
                    if top is None
                    else f"{top.max_over_mean:.2f} at {top.offered_qps:.0f} req/s (its top load)"
                ),
                cr.at_reference.max_over_mean <= 1.3,
            )
        )
        out.append(
            Check(
                "whale: `cacheroute` prefill max/mean <= 1.15",
                # three decimals: a value that rounds to the bound must not read as meeting it
                f"{cr.at_reference.max_over_mean_prefill:.3f} at the reference load (requests "
                f"{cr.at_reference.max_over_mean:.2f})",
                cr.at_reference.max_over_mean_prefill <= 1.15,
            )
        )
        if fl:
            ratio = cr.slo_capacity_qps / fl.slo_capacity_qps if fl.slo_capacity_qps else math.inf
            out.append(
                Check(
                    "whale: `cacheroute` SLO capacity >= 2x `flat-lb`",
                    f"{_qps(cr.slo_capacity_qps)} vs {_qps(fl.slo_capacity_qps)} req/s "
                    f"({ratio:.2f}x)",
                    ratio >= 2.0,
                )
            )
        if whale.cluster_sweep:
            out.append(_cluster_check(whale.cluster_sweep))
    if low is not None:
        out.append(
            Check(
                "low-reuse: diagnostic says `tie` or `lose`",
                f"{low.diagnostic.verdict} (predicted gain {low.diagnostic.predicted_gain:.2f}x)",
                low.diagnostic.verdict in ("tie", "lose"),
            )
        )
        out.append(
            Check(
                "low-reuse: recommendation is `keep flat-lb`",
                f"{low.recommendation} (capacity ratio {_ratio(low.capacity_ratio)})",
                low.recommendation == "keep flat-lb",
            )
        )
    return out


PEAK_MARGIN = 0.05
"""A middle R shows the non-monotone effect only if its capacity gain beats both neighbours' by
more than this (5%, about the resolution of the bisected capacities)."""


def _ratio_interval(row: Mapping[str, Any]) -> tuple[float, float]:
    """What a cluster row's capacity ratio can be, given which capacities are lower bounds."""
    x = float(row["capacity_ratio"])
    kind = row.get("capacity_ratio_is", "exact")
    if kind == "lower bound":
        return x, math.inf
    if kind == "upper bound":
        return 0.0, x
    if kind == "undetermined":
        return 0.0, math.inf
    return x, x


def peak_at_middle(rows: Sequence[Mapping[str, Any]]) -> int | None:
    """R of a middle cluster size whose gain surely beats both neighbours' by > PEAK_MARGIN.

    Rows in order of R; a ratio known only as a bound counts at its unfavourable end (the peak's
    lowest possible value against the neighbours' highest). None: no such peak.
    """
    rows = sorted(rows, key=lambda r: int(r["destinations"]))
    iv = [_ratio_interval(r) for r in rows]
    for i in range(1, len(rows) - 1):
        low = iv[i][0]
        if low > (1 + PEAK_MARGIN) * max(iv[i - 1][1], iv[i + 1][1]):
            return int(rows[i]["destinations"])
    return None


def _cluster_check(sweep: Sequence[Mapping[str, Any]]) -> Check:
    """The cluster-size criterion: holds only if the paper's peak at a middle R is measured."""
    rows = sorted(sweep, key=lambda r: int(r["destinations"]))
    figures = ", ".join(f"R={r['destinations']}: {_row_ratio(r)}" for r in rows)
    if len(rows) < 3:
        return Check(
            _CLUSTER_CLAIM, f"{figures}: needs at least three cluster sizes to show a peak", False
        )
    peak = peak_at_middle(rows)
    verdict = (
        f"the gain peaks at R={peak}: the non-monotone effect appears"
        if peak is not None
        else f"no middle R beats both neighbours by more than {_pct(PEAK_MARGIN)}: the "
        "non-monotone effect does not appear"
    )
    return Check(_CLUSTER_CLAIM, f"{figures}; {verdict}", peak is not None)


_CLUSTER_CLAIM = (
    "whale: at a fixed load, CacheRoute's capacity gain over Flat-LB peaks at a middle cluster "
    f"size (the paper's non-monotone effect of R; > {100 * PEAK_MARGIN:.0f}% above both "
    "neighbours)"
)


@dataclass(frozen=True, slots=True)
class EvidenceRun:
    """One evaluation in the evidence document: its title, result, plots and the command."""

    title: str
    evaluation: Evaluation
    plots: Mapping[str, str]
    command: str
    fleet_group: str | None = None
    """Runs of one source that differ only in G share a group (the capacity-vs-G tables)."""


def not_winning(runs: Sequence[EvidenceRun], checks: Sequence[Check]) -> list[str]:
    """Computed list: runs without a win, policies with more capacity, criteria that fail."""
    items: list[str] = []
    for run in runs:
        ev = run.evaluation
        cr = ev.policies["cacheroute"].slo_capacity_qps
        if ev.simulation_verdict != "win":
            items.append(
                f"{run.title}: simulation says **{ev.simulation_verdict}** (capacity "
                f"{_ratio(ev.capacity_ratio)} Flat-LB); recommendation `{ev.recommendation}`."
            )
        better = [
            f"`{n}` ({_cap(p)} vs {_qps(cr)} req/s)"
            for n, p in ev.policies.items()
            if n != "cacheroute" and p.slo_capacity_qps > cr * 1.02
        ]
        if better:
            items.append(f"{run.title}: more SLO capacity than CacheRoute: {', '.join(better)}.")
        if not ev.agree:
            items.append(
                f"{run.title}: the diagnostic ({ev.diagnostic.verdict}, predicted "
                f"{ev.diagnostic.predicted_gain:.2f}x) disagrees with the simulation "
                f"({ev.simulation_verdict}, {_ratio(ev.capacity_ratio)})."
            )
    items += [f"Criterion not met - {c.claim}: {c.measured}." for c in checks if not c.holds]
    return items


def fleet_capacities(runs: Sequence[EvidenceRun]) -> dict[str, dict[str, dict[int, float]]]:
    """source -> policy -> G -> SLO capacity, over the runs that differ only in their gateways."""
    out: dict[str, dict[str, dict[int, float]]] = {}
    for run in runs:
        if run.fleet_group is None:
            continue
        g = run.evaluation.config.fleet.gateways
        group = out.setdefault(run.fleet_group, {})
        for name, p in run.evaluation.policies.items():
            group.setdefault(name, {})[g] = p.slo_capacity_qps
    return out


def render_fleet(
    capacities: Mapping[str, Mapping[str, Mapping[int, float]]], plots: Mapping[str, str]
) -> list[str]:
    """Capacity-vs-G tables: does one shared plan beat routers that each decide alone?"""
    lines = ["## Many gateways: SLO capacity against G", ""]
    lines.append(
        "Each gateway routes the requests dealt to it (round-robin, as an L4 balancer does) with "
        "only its own state; plan-based policies share the plan. `best other` is the best "
        "policy that is not `cacheroute`; the last row says whether `cacheroute` has at least "
        "its capacity (`>=`) or how far below it is."
    )
    lines.append("")
    for source, by_policy in capacities.items():
        gs = sorted({g for caps in by_policy.values() for g in caps})
        lines.append(f"### {source}")
        lines.append("")
        if source in plots:
            lines += [f"![capacity against gateways]({plots[source]})", ""]
        lines.append("| policy | " + " | ".join(f"G = {g}" for g in gs) + " |")
        lines.append("|---|" + "---|" * len(gs))
        for name, caps in by_policy.items():
            cells = [f"{caps[g]:.1f}" if g in caps else "-" for g in gs]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        verdicts = []
        for g in gs:
            others = {n: c[g] for n, c in by_policy.items() if n != "cacheroute" and g in c}
            ours = by_policy.get("cacheroute", {}).get(g)
            if not others or ours is None:
                verdicts.append("-")
                continue
            best = max(others, key=lambda n: others[n])
            ratio = ours / others[best] if others[best] > 0 else math.inf
            verdicts.append(
                f">= {best}" if ratio >= 1.0 else f"{ratio:.2f}x of {best} ({others[best]:.1f})"
            )
        lines.append("| **cacheroute vs best other** | " + " | ".join(verdicts) + " |")
        lines.append("")
    return lines


def render_agreement(runs: Sequence[EvidenceRun]) -> list[str]:
    """Diagnostic vs simulation over all runs: how often they agree, where not, and any `win`
    the diagnostic predicted where the simulation says `lose` (the one error it must not make:
    it would recommend deploying where the deployment loses capacity)."""
    agree = [r for r in runs if r.evaluation.agree]
    lines = [
        "",
        "### Diagnostic vs simulation agreement over all runs",
        "",
        f"The workload-only diagnostic agrees with the simulation's verdict in {len(agree)} of "
        f"{len(runs)} runs.",
    ]
    wrong = [
        r
        for r in runs
        if r.evaluation.diagnostic.verdict == "win" and r.evaluation.simulation_verdict == "lose"
    ]
    if wrong:
        lines.append(
            f"**Warning: the diagnostic predicted `win` where the simulation says `lose` in "
            f"{len(wrong)} run(s): {', '.join(r.title for r in wrong)}.**"
        )
    else:
        lines.append("It never predicts `win` where the simulation says `lose`.")
    missed = [r for r in runs if not r.evaluation.agree]
    if missed:
        lines += [
            "",
            "| run | G | diagnostic (predicted gain) | simulation (capacity ratio) |",
            "|---|---|---|---|",
        ]
        for r in missed:
            ev = r.evaluation
            d = ev.diagnostic
            mark = " **win vs lose**" if r in wrong else ""
            lines.append(
                f"| {r.title} | {ev.config.fleet.gateways} | {d.verdict} "
                f"({d.predicted_gain:.2f}x) | {ev.simulation_verdict} "
                f"({_ratio(ev.capacity_ratio)}){mark} |"
            )
    return lines


def render_evidence(
    runs: Sequence[EvidenceRun],
    checks: Sequence[Check],
    *,
    header: str,
    timing: Mapping[str, Any],
    fleet_plots: Mapping[str, str] | None = None,
) -> str:
    """The whole evidence document (docs/EVALUATION.md)."""
    lines = [header.rstrip(), ""]
    fleet = fleet_capacities(runs)
    if fleet:
        lines += render_fleet(fleet, fleet_plots or {})
    lines += ["## Summary", ""]
    lines += [
        "| run | diagnostic | simulation | agree | capacity CacheRoute / Flat-LB | "
        "recommendation |",
        "|---|---|---|---|---|---|",
    ]
    for run in runs:
        ev = run.evaluation
        lines.append(
            f"| {run.title} | {ev.diagnostic.verdict} | {ev.simulation_verdict} | "
            f"{'yes' if ev.agree else 'no'} | {_ratio(ev.capacity_ratio)} | {ev.recommendation} |"
        )
    lines += render_agreement(runs)
    lines += ["", "### Where CacheRoute does not win", ""]
    lines += [f"- {item}" for item in not_winning(runs, checks)] or ["- nowhere in these runs"]
    lines += ["", "### Evidence criteria of the issue, checked on these runs", ""]
    lines += ["| criterion | measured | holds |", "|---|---|---|"]
    lines += [f"| {c.claim} | {c.measured} | {'yes' if c.holds else '**no**'} |" for c in checks]
    lines += [
        "",
        "Simulator speed over the whole evidence run: "
        f"{timing.get('sim_requests', 0):,} simulated requests in {timing.get('wall_s', 0):.0f} s "
        f"({timing.get('sim_requests_per_s', 0):,.0f} requests/s, routing included).",
        "",
    ]
    for run in runs:
        lines.append(render_run(run.evaluation, run.plots, title=run.title))
        lines.append(f"Command: `{run.command}`")
        lines.append("")
    return "\n".join(lines)


def relative(path: Path, base: Path) -> str:
    """`path` relative to `base` (for links inside a Markdown file)."""
    try:
        return str(path.resolve().relative_to(base.resolve()))
    except ValueError:
        return str(path)
