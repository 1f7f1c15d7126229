"""The chat-shaped evidence trace is what its generator writes, and has the shape it claims."""

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


def _generator() -> ModuleType:
    return load_script("make_chat_shape")


def _rows(name: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (TRACES / name).read_text().splitlines()]


def test_the_committed_trace_is_the_generators_output() -> None:
    rows = _rows("chat_shape_6000.jsonl")
    made = _generator().generate(6000, 2026)
    t0 = made[0][0]
    assert [(r["input_length"], r["output_length"], r["hash_ids"]) for r in rows] == [
        (p, a, b) for _, p, a, b in made
    ]
    assert [r["timestamp"] for r in rows] == [int((t - t0) // 3.0 * 3000) for t, *_ in made]


def test_it_has_the_shape_it_claims() -> None:
    rows = _rows("chat_shape_6000.jsonl")
    assert all(r["hash_ids"][0] == 0 for r in rows)  # one shared system-prompt block
    assert all(r["timestamp"] % 3000 == 0 for r in rows)  # 3 s steps
    assert all(len(r["hash_ids"]) == r["input_length"] // 512 for r in rows)  # full blocks
    prompts = np.array([r["input_length"] for r in rows])
    assert 6000 < np.percentile(prompts, 50) < 12000
    assert np.percentile(prompts, 99) > 50_000
    # the default key (first 2 blocks) names a conversation: many keys, many of one request
    q = read_mooncake(TRACES / "chat_shape_6000.jsonl")
    counts = Counter(q.key_index.tolist())
    assert len(q.keys) > 1500
    assert sum(1 for c in counts.values() if c == 1) > 0.2 * len(q.keys)
    # a later turn extends an earlier one's blocks: some request's blocks start with another's
    by_first = {tuple(r["hash_ids"][:2]): r["hash_ids"] for r in rows if len(r["hash_ids"]) >= 2}
    extended = sum(
        1
        for r in rows
        if len(r["hash_ids"]) >= 2
        and len(by_first[tuple(r["hash_ids"][:2])]) >= len(r["hash_ids"])
        and by_first[tuple(r["hash_ids"][:2])][: len(r["hash_ids"])] == r["hash_ids"]
        and by_first[tuple(r["hash_ids"][:2])] is not r["hash_ids"]
    )
    assert extended > 500


def test_the_committed_sampled_trace_is_the_generators_output() -> None:
    rows = _rows("chat_sampled_6000.jsonl")
    made = _generator().generate_sampled(6000, 7)
    t0 = made[0][0]
    assert [(r["input_length"], r["output_length"], r["hash_ids"]) for r in rows] == [
        (p, a, b) for _, p, a, b in made
    ]
    assert [r["timestamp"] for r in rows] == [int((t - t0) // 3.0 * 3000) for t, *_ in made]


def test_the_sampled_trace_has_the_shape_it_claims() -> None:
    rows = _rows("chat_sampled_6000.jsonl")
    blocks = [list(r["hash_ids"]) for r in rows]
    lengths = [int(r["input_length"]) for r in rows]
    assert all(b[0] == 0 for b in blocks)  # one shared system-prompt block
    # block hashing gives a partial last block an id of its own: ceil(tokens / 512) ids
    assert all(len(b) == -(-n // 512) for b, n in zip(blocks, lengths, strict=True))
    partial = [b[-1] for b, n in zip(blocks, lengths, strict=True) if n % 512]
    assert len(set(partial)) == len(partial)  # never reused
    # about a third of requests continue a conversation: their first 2 blocks were seen before
    seen: set[tuple[int, ...]] = set()
    follow_ups = 0
    for b in blocks:
        follow_ups += tuple(b[:2]) in seen
        seen.add(tuple(b[:2]))
    assert 0.25 < follow_ups / len(blocks) < 0.45
    p50, p99 = np.percentile(lengths, [50, 99])
    assert 4000 < p50 < 9000
    assert p99 > 50_000
