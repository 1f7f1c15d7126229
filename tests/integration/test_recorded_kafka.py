"""Shadow evaluation from what gateways recorded, on the real broker.

- A trace pushed through the gateway emitter with its block hashes reads back from the topic as
  exactly the requests of the trace file (times, keys, prompts, blocks, declared prefixes), also
  between two event times, and `cacheroute evaluate --topic` evaluates it with its calibration.
- A real `cacheroute gateway --hash-blocks` in front of a real engine records each prompt's
  chained block hashes: a conversation's next turn repeats its previous turn's hashes, two
  conversations behind one system prompt share exactly its full blocks, and the recorded served
  hit rate is what the engine reported in its answers.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson
import pytest
from click.testing import CliRunner

from cacheroute.cli.main import cli
from cacheroute.dispatcher.emitter.emitter import Emitter
from cacheroute.replay.live import push, read_recorded
from cacheroute.replay.requestset import RequestSet
from cacheroute.replay.traces import read_mooncake
from cacheroute.settings import Settings
from cacheroute.topics import ensure_topics
from tests.integration.gateway_support import MODEL, engine, gateway, post_chat

pytestmark = pytest.mark.kafka

REPO = Path(__file__).resolve().parents[2]
TRACE = REPO / "tests" / "data" / "traces" / "conversation_mooncake_6000.jsonl"
N = 1500
"""Requests read from TRACE: all of them at distinct times but one pair."""
START_MS = 1_700_000_000_000


def _pushed(settings: Settings) -> None:
    ensure_topics(settings)
    with Emitter(settings, "recorder") as emitter:
        stats = push(
            read_mooncake(TRACE, limit=N), emitter, speed=0, start_ms=START_MS, block_hashes=True
        )
    assert stats.accepted == stats.requests == N
    assert stats.flushed


def test_a_pushed_trace_reads_back_as_the_trace_file(settings: Settings) -> None:
    _pushed(settings)
    expected = read_mooncake(TRACE, limit=N)
    traffic = read_recorded(settings, settings.topics["requests"])
    got = traffic.request_set(block_tokens=512)
    assert got.n == expected.n == N
    assert np.allclose(got.times, expected.times - expected.times[0], rtol=0, atol=1e-9)

    def rows(q: RequestSet) -> list[tuple[float, str, int, tuple[int, ...]]]:
        return sorted(
            (
                round(float(q.times[i] - q.times[0]), 3),
                q.keys[int(q.key_index[i])],
                int(q.prompt_tokens[i]),
                tuple(q.blocks_of(i).tolist()),
            )
            for i in range(q.n)
        )

    # block ids are renumbered by value, so equal blocks have equal ids in both
    assert rows(got) == rows(expected)
    # requests of the same millisecond may come back in another order (partitions); the others
    # see exactly the blocks before them that the file's requests saw
    _, first, counts = np.unique(expected.times, return_index=True, return_counts=True)
    alone = first[counts == 1]
    assert np.array_equal(got.prefix_tokens[alone], expected.prefix_tokens[alone])
    assert len(alone) == N - 2
    assert traffic.served().gateways == ("recorder",)
    assert traffic.served().hit_rate is None  # a replay reports no usage

    # the event-time range: [60 s, 120 s) of the trace
    window = read_recorded(
        settings, settings.topics["requests"], from_ms=START_MS + 60_000, to_ms=START_MS + 120_000
    )
    rel = expected.times - expected.times[0]
    assert len(window) == int(((rel >= 60.0) & (rel < 120.0)).sum())
    assert len(window) + window.outside >= len(window) > 0


def test_evaluate_topic_evaluates_the_recorded_traffic_with_its_calibration(
    settings: Settings, tmp_path: Path
) -> None:
    _pushed(settings)
    out = tmp_path / "eval"
    result = CliRunner().invoke(
        cli,
        [
            "--bootstrap",
            settings.bootstrap,
            "--topic-prefix",
            settings.topic_prefix,
            "evaluate",
            "--topic",
            "requests",
            "--requests",
            str(2 * N),
            "--quick",
            "--policies",
            "flat-lb,cacheroute",
            "--jobs",
            "1",
            "--out",
            str(out),
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    data = orjson.loads(result.stdout.strip().splitlines()[-1])
    assert data["workload"]["recorded"] == f"topic {settings.topics['requests']}"
    assert data["workload"]["requests_recorded"] == N
    assert data["workload"]["requests"] == 2 * N  # tiled as a trace is
    cal = data["calibration"]
    assert cal["requests"] == N
    assert cal["policy"] == "cacheroute"
    assert cal["served_hit_rate"] is None
    assert cal["served_requests_reporting"] == 0
    assert cal["gateways"] == 1
    assert 0.0 < cal["simulated_hit_rate"] < 1.0
    assert (out / "recorded.jsonl").read_bytes().count(b"\n") == N
    assert "Calibration on the recorded traffic" in (out / "report.md").read_text()


SYSTEM = "You answer questions about caches. " * 4  # 140 characters
Q3 = "How big is one KV block of a long prompt, counted in tokens?"


def _chat(*turns: tuple[str, str]) -> bytes:
    messages = [{"role": "system", "content": SYSTEM}]
    messages += [{"role": role, "content": text} for role, text in turns]
    return orjson.dumps({"model": MODEL, "messages": messages, "max_tokens": 2, "stream": False})


def test_a_gateway_with_hash_blocks_records_the_prompts_block_identity(
    settings: Settings, tmp_path: Path
) -> None:
    ensure_topics(settings)
    q1 = "What is a prefix cache, and why does a router care where it lives?"
    answer = "It holds the KV of prompts seen before; send a prompt where its prefix is."
    q2 = "And what happens when the replica evicts it?"
    bodies = {
        "c1-turn1": (_chat(("user", q1)), "c1"),
        "c1-turn2": (_chat(("user", q1), ("assistant", answer), ("user", q2)), "c1"),
        "c2": (_chat(("user", Q3)), "c2"),
    }
    with engine("d0", tmp_path, "--zero-delay") as eng:
        with gateway(
            "gw-hash", tmp_path, {"d0": eng.port}, "--hash-blocks", "16", settings=settings
        ) as gw:
            replies = {name: post_chat(gw.port, body, key) for name, (body, key) in bodies.items()}
        assert gw.proc.returncode == 0
    assert all(r.status == 200 for r in replies.values())
    traffic = read_recorded(settings, settings.topics["requests"])
    assert len(traffic) == 3
    by_order = sorted(range(3), key=traffic.times_ms.__getitem__)
    hashes = [traffic.hashes[i] for i in by_order]
    # the prompt text an engine sees: one "role: content" line per message; 16 tokens = 64 chars
    texts = [
        f"system: {SYSTEM}\nuser: {q1}\n",
        f"system: {SYSTEM}\nuser: {q1}\nassistant: {answer}\nuser: {q2}\n",
        f"system: {SYSTEM}\nuser: {Q3}\n",
    ]
    assert [len(h) for h in hashes] == [len(t) // 64 for t in texts]
    turn1, turn2, other = hashes
    assert turn2[: len(turn1)] == turn1  # the next turn repeats the previous turn's blocks
    # both conversations start with the same 148 characters: 2 full blocks, not 3
    assert other[:2] == turn1[:2]
    assert other[2] != turn1[2]
    usage = [replies[n].json()["usage"] for n in ("c1-turn1", "c1-turn2", "c2")]
    cached = [u["prompt_tokens_details"]["cached_tokens"] for u in usage]
    prompt = [u["prompt_tokens"] for u in usage]
    served = traffic.served()
    assert served.reported == 3
    assert served.hit_rate == pytest.approx(sum(cached) / sum(prompt))
    assert cached[1] > 0  # the engine found turn 1 in its cache
    q = traffic.request_set(block_tokens=16)
    assert q.prefix_tokens.tolist() == [0, 16 * len(turn1), 16 * 2]
