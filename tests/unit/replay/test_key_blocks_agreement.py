"""`--key-blocks auto` and the evidence document's diagnostic-vs-simulation agreement section."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import cast

import click
import orjson
import pytest

from cacheroute.cli.evaluate import _key_blocks
from cacheroute.replay.evaluate import Evaluation
from cacheroute.replay.report import EvidenceRun, render_agreement
from cacheroute.replay.sources import SourceSpec, choose_key_blocks, load_source, resolve_key_blocks

DATA = Path(__file__).resolve().parents[2] / "data" / "traces"


def _conversations(path: Path, conversations: int = 20, turns: int = 30) -> None:
    """A Mooncake trace of one shared system block, then four blocks of the conversation, then
    two blocks new to each request: keys of 2-5 blocks are the conversations, 1 block lumps every
    conversation into one key, 6 blocks makes every request its own key."""
    unique = 10_000
    with path.open("wb") as fh:
        for t in range(turns):
            for c in range(conversations):
                conv = [100 + 10 * c + j for j in range(4)]
                ids = [0, *conv, unique, unique + 1]
                unique += 2
                row = {
                    "timestamp": (t * conversations + c) * 100,
                    "input_length": 512 * len(ids),
                    "output_length": 16,
                    "hash_ids": ids,
                }
                fh.write(orjson.dumps(row) + b"\n")


def test_auto_picks_the_conversation_key(tmp_path: Path) -> None:
    trace = tmp_path / "conv.jsonl"
    _conversations(trace)
    spec = SourceSpec(trace=trace, requests=600, key_blocks="auto")
    gains = dict(choose_key_blocks(spec, destinations=8))
    assert sorted(gains) == [0, 1, 2, 3, 4, 5, 6]  # 0: session keys
    # 2-5 blocks group the requests alike (the estimates differ only by the names' hashed
    # homes); one lumped key (spread over every replica by fair-share sizing) and per-request
    # keys (nothing recurs) both expect clearly less
    for kb in (0, 3, 4, 5):  # session keys find the conversations too
        assert gains[kb] == pytest.approx(gains[2], abs=0.01)
    assert gains[2] > gains[1] + 0.05
    assert gains[2] > gains[6] + 0.05
    chosen = resolve_key_blocks(spec, destinations=8)
    assert chosen.key_blocks_chosen == 0  # within AUTO_TOLERANCE: session keys, then fewest
    info = chosen.describe()
    assert info["key_blocks"] == "auto"
    assert info["key_blocks_chosen"] == 0
    assert set(info["key_blocks_gains"]) == {"0", "1", "2", "3", "4", "5", "6"}
    q = load_source(chosen)
    assert len(q.keys) == 20
    assert any("key_blocks auto: chose session" in n for n in q.notes)


def test_given_key_blocks_and_other_formats_are_left_alone() -> None:
    assert resolve_key_blocks(SourceSpec(trace=DATA / "x.jsonl", key_blocks=3)).key_blocks == 3
    azure = SourceSpec(trace=DATA / "azure_llm_2023_conv_3000.csv", key_blocks="auto")
    assert resolve_key_blocks(azure) is azure
    assert azure.key_blocks_chosen == 2
    ties = SourceSpec(key_blocks="auto", key_blocks_gains=((1, 1.1), (3, 1.2), (2, 1.195)))
    assert ties.key_blocks_chosen == 2
    clear = SourceSpec(key_blocks="auto", key_blocks_gains=((1, 1.1), (3, 1.2), (2, 1.18)))
    assert clear.key_blocks_chosen == 3


def test_key_blocks_option() -> None:
    assert _key_blocks("auto") == "auto"
    assert _key_blocks(" AUTO ") == "auto"
    assert _key_blocks("3") == 3
    assert _key_blocks(4) == 4
    for bad in ("0", "two", "-1"):
        with pytest.raises(click.BadParameter):
            _key_blocks(bad)


def _run(title: str, diagnostic: str, simulation: str, ratio: float, g: int = 1) -> EvidenceRun:
    ev = SimpleNamespace(
        diagnostic=SimpleNamespace(verdict=diagnostic, predicted_gain=1.2),
        simulation_verdict=simulation,
        capacity_ratio=ratio,
        agree=diagnostic == simulation,
        config=SimpleNamespace(fleet=SimpleNamespace(gateways=g)),
    )
    return EvidenceRun(title, cast(Evaluation, ev), {}, "")


def test_agreement_counts_lists_and_flags() -> None:
    runs = [
        _run("whale", "win", "win", 2.1),
        _run("mooncake", "tie", "win", 1.15, g=4),
        _run("bad", "win", "lose", 0.8),
    ]
    text = "\n".join(render_agreement(runs))
    assert "agrees with the simulation's verdict in 1 of 3 runs" in text
    assert "| mooncake | 4 | tie (1.20x) | win (1.15x) |" in text
    assert "| bad | 1 | win (1.20x) | lose (0.80x) **win vs lose** |" in text
    assert "Warning" in text
    assert "in 1 run(s): bad" in text
    assert "whale |" not in text
    clean = "\n".join(render_agreement(runs[:1]))
    assert "in 1 of 1 runs" in clean
    assert "never predicts `win` where the simulation says `lose`" in clean
