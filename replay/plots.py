"""PNG plots of an evaluation (matplotlib, headless Agg backend).

* `hit_vs_load`   - token-weighted KV hit rate against offered load, per policy;
* `p99_vs_load`   - p99 latency (the SLO metric) against offered load, log scale, SLO line;
* `load_bars`     - requests per destination at the reference load, one panel per policy,
                    sorted, relative to the mean (1.0 = perfectly even);
* `cluster_sweep` - CacheRoute / Flat-LB capacity and p99 ratios against R (if swept).
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib as mpl

mpl.use("Agg")

import matplotlib.pyplot as plt
import numpy as np

from cacheroute.replay.evaluate import Evaluation

__all__ = ["save_plots"]

_STYLE = {
    "flat-lb": ("#444444", "o", "-"),
    "sticky": ("#8c564b", "v", ":"),
    "chwbl": ("#9467bd", "^", ":"),
    "sglang": ("#17becf", "s", ":"),
    "preble": ("#2ca02c", "D", ":"),
    "affinity": ("#ff7f0e", "<", "--"),
    "affinity+replication": ("#d62728", ">", "--"),
    "cacheroute": ("#1f77b4", "*", "-"),
}


def _style(name: str) -> tuple[str, str, str]:
    return _STYLE.get(name, ("#7f7f7f", ".", "-"))


def save_plots(ev: Evaluation, out: Path, prefix: str = "") -> dict[str, Path]:
    """Write the plots into `out`; returns name -> file."""
    out.mkdir(parents=True, exist_ok=True)
    files = {
        "hit_vs_load": out / f"{prefix}hit_vs_load.png",
        "p99_vs_load": out / f"{prefix}p99_vs_load.png",
        "load_bars": out / f"{prefix}load_bars.png",
    }
    _hit(ev, files["hit_vs_load"])
    _p99(ev, files["p99_vs_load"])
    _bars(ev, files["load_bars"])
    if ev.cluster_sweep:
        files["cluster_sweep"] = out / f"{prefix}cluster_sweep.png"
        _cluster(ev, files["cluster_sweep"])
    return files


def _hit(ev: Evaluation, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for name, rep in ev.policies.items():
        color, marker, line = _style(name)
        xs = [m.offered_qps for m in rep.sweep]
        ys = [100 * m.hit_rate for m in rep.sweep]
        ax.plot(xs, ys, color=color, marker=marker, linestyle=line, label=name)
    ax.set_xlabel("offered load (requests/s)")
    ax.set_ylabel("served KV hit rate (% of prompt tokens)")
    ax.set_title("Hit rate vs load")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _p99(ev: Evaluation, path: Path) -> None:
    metric = ev.config.slo_metric
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for name, rep in ev.policies.items():
        color, marker, line = _style(name)
        xs = [m.offered_qps for m in rep.sweep]
        ys = [max(1.0, m.p99_ms(metric)) / 1e3 for m in rep.sweep]
        ax.plot(xs, ys, color=color, marker=marker, linestyle=line, label=name)
    ax.axhline(ev.config.slo_ms / 1e3, color="red", linewidth=1, label="SLO")
    ax.axvline(ev.reference_qps, color="grey", linewidth=0.8, linestyle="--")
    ax.set_yscale("log")
    ax.set_xlabel("offered load (requests/s)")
    ax.set_ylabel(f"p99 {metric.upper()} (s)")
    ax.set_title(f"p99 {metric.upper()} vs load (dashed: reference load)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _bars(ev: Evaluation, path: Path) -> None:
    names = list(ev.policies)
    cols = min(4, len(names))
    rows = math.ceil(len(names) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.4 * rows), squeeze=False)
    top = max(
        float(np.max(np.asarray(p.at_reference.load) / max(1e-9, np.mean(p.at_reference.load))))
        for p in ev.policies.values()
    )
    for ax, name in zip(axes.flat, names, strict=False):
        load = np.asarray(ev.policies[name].at_reference.load, dtype=np.float64)
        rel = np.sort(load / max(1e-9, float(load.mean())))[::-1]
        ax.bar(np.arange(rel.size), rel, color=_style(name)[0])
        ax.axhline(1.0, color="black", linewidth=0.7)
        ax.set_ylim(0, top * 1.05)
        ax.set_title(f"{name} (max/mean {rel.max():.2f})", fontsize=9)
        ax.set_xticks([])
    for ax in list(axes.flat)[len(names) :]:
        ax.axis("off")
    fig.suptitle(f"Requests per destination at {ev.reference_qps:.0f} req/s (sorted, / mean)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _cluster(ev: Evaluation, path: Path) -> None:
    rs = [row["destinations"] for row in ev.cluster_sweep]
    cap = [row["capacity_ratio"] for row in ev.cluster_sweep]
    p99 = [row["p99_ratio"] for row in ev.cluster_sweep]
    fig, ax = plt.subplots(figsize=(6, 3.8))
    ax.plot(rs, cap, marker="o", label="SLO capacity: CacheRoute / Flat-LB")
    ax.plot(rs, p99, marker="s", label="p99 at fixed load: Flat-LB / CacheRoute")
    ax.axhline(1.0, color="black", linewidth=0.7)
    ax.set_xlabel("destinations R")
    ax.set_ylabel("ratio (> 1: CacheRoute better)")
    ax.set_yscale("log")
    ax.set_title(f"Cluster size at {ev.cluster_sweep[0]['offered_qps']:.0f} req/s offered")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def save_fleet_plot(title: str, capacities: dict[str, dict[int, float]], path: Path) -> Path:
    """SLO capacity against the number of gateways, one line per policy (one source)."""
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for name, by_g in capacities.items():
        color, marker, line = _style(name)
        gs = sorted(by_g)
        ax.plot(gs, [by_g[g] for g in gs], color=color, marker=marker, linestyle=line, label=name)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("gateways G (each with only its own state; plans shared)")
    ax.set_ylabel("SLO capacity (req/s)")
    ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
