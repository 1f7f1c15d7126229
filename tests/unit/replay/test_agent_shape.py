"""The agent-shaped trace is what its generator writes, and has the shape it claims."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from cacheroute.replay.traces import read_mooncake

from .trace_scripts import load_script

TRACES = Path(__file__).resolve().parents[2] / "data" / "traces"
NAME = "agent_shape_6000.jsonl"


def _generator() -> ModuleType:
    return load_script("make_agent_shape")


def _rows() -> list[dict[str, Any]]:
    return [json.loads(line) for line in (TRACES / NAME).read_text().splitlines()]


def test_the_committed_trace_is_the_generators_output() -> None:
    rows = _rows()
    made = _generator().generate(6000, 2026)
    t0 = made[0][0]
    assert [(r["input_length"], r["output_length"], r["hash_ids"]) for r in rows] == [
        (p, a, b) for _, p, a, b in made
    ]
    assert [r["timestamp"] for r in rows] == [round((t - t0) * 1000) for t, *_ in made]


def test_it_has_the_shape_it_claims() -> None:
    rows = _rows()
    # one id per 512-token block, the partial last one included
    assert all(len(r["hash_ids"]) == -(-r["input_length"] // 512) for r in rows)
    prompts = np.array([r["input_length"] for r in rows])
    answers = np.array([r["output_length"] for r in rows])
    assert 8000 < prompts.mean() < 11000  # the published tool&agent mean is ~8.6k
    assert 150 < answers.mean() < 250  # ~180 published
    # the first 2 blocks name one of 40 applications: a handful of heavy keys
    q = read_mooncake(TRACES / NAME)
    counts = Counter(q.key_index.tolist())
    assert len(q.keys) <= 40
    assert 0.2 < max(counts.values()) / q.n < 0.4
    # a step extends an earlier step's whole blocks beyond any system prompt (12 blocks at
    # most), seconds later: the latest earlier request whose full blocks this one starts with
    last: dict[tuple[int, ...], float] = {}
    gaps = []
    for r in rows:
        full = tuple(r["hash_ids"][: r["input_length"] // 512])
        t = r["timestamp"] / 1000
        for j in range(len(full) - 1, 12, -1):
            if full[:j] in last:
                gaps.append(t - last[full[:j]])
                break
        last[full] = t
    assert len(gaps) > 0.4 * len(rows)
    assert min(gaps) >= 1.0  # the model's and the tool's latency: at least a second
    assert 2.0 < float(np.median(gaps)) < 10.0  # not human think times
