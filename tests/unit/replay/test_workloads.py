"""Synthetic workloads: seeded, the paper's skew, whales, low reuse, prefixes that grow."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

from cacheroute.replay.errors import ReplayError
from cacheroute.replay.requestset import RequestSet
from cacheroute.replay.sources import detect_format, write_mooncake
from cacheroute.replay.traces import read_mooncake
from cacheroute.replay.workloads import generate, spec_for

from .conftest import WorkloadFactory


def test_same_seed_same_stream_other_seed_other_stream() -> None:
    spec = spec_for("paper", requests=2000, keys=200)
    a = generate(spec, np.random.default_rng(1))
    b = generate(spec, np.random.default_rng(1))
    c = generate(spec, np.random.default_rng(2))
    assert np.array_equal(a.times, b.times)
    assert np.array_equal(a.block_ids, b.block_ids)
    assert a.keys == b.keys
    assert not np.array_equal(a.times, c.times)


def test_rate_and_gamma_burstiness() -> None:
    poisson = generate(spec_for("paper", requests=20_000, rate=50.0), np.random.default_rng(0))
    bursty = generate(
        spec_for("paper", requests=20_000, rate=50.0, arrival="gamma", cv=2.0),
        np.random.default_rng(0),
    )
    assert poisson.rate == pytest.approx(50.0, rel=0.05)
    gaps = np.diff(bursty.times)
    assert float(gaps.std() / gaps.mean()) == pytest.approx(2.0, rel=0.1)


def test_whales_take_their_share(workload_factory: WorkloadFactory) -> None:
    q = workload_factory("whale", requests=20_000, keys=500)
    share = q.key_counts() / q.n
    top = sorted(share.tolist(), reverse=True)[:4]
    assert top == pytest.approx([0.09, 0.06, 0.045, 0.03], abs=0.01)
    assert q.keys[int(np.argmax(share))].startswith("app-")


def test_low_reuse_is_mostly_one_off_prompts(workload_factory: WorkloadFactory) -> None:
    q = workload_factory("low-reuse", requests=5000)
    counts = q.key_counts()
    assert float(counts[counts == 1].sum()) / q.n > 0.6
    assert q.stats()["declared_prefix_share"] < 0.3


def test_a_session_turn_extends_the_previous_turn(workload_factory: WorkloadFactory) -> None:
    q = workload_factory("paper")
    assert np.all(np.diff(q.block_offsets) * q.block_tokens <= q.prompt_tokens)
    assert np.all(q.prefix_tokens < q.prompt_tokens)
    # somewhere a request's blocks start with all blocks of an earlier request of its key
    extended = 0
    last: dict[int, list[int]] = {}
    for i in range(q.n):
        k = int(q.key_index[i])
        blocks = q.blocks_of(i).tolist()
        prev = last.get(k)
        if prev and len(blocks) > len(prev) and blocks[: len(prev)] == prev:
            extended += 1
        last[k] = blocks
    assert extended > q.n // 10


def test_keys_of_a_tenant_share_the_tenant_prompt(workload_factory: WorkloadFactory) -> None:
    q = workload_factory("paper")
    first_block: dict[str, set[int]] = {}
    for i in range(q.n):
        key = q.keys[int(q.key_index[i])]
        blocks = q.blocks_of(i)
        if blocks.size:
            first_block.setdefault(key.split("/")[0], set()).add(int(blocks[0]))
    assert all(len(v) == 1 for v in first_block.values())  # one tenant, one first block


def test_spec_validation() -> None:
    with pytest.raises(ReplayError):
        spec_for("whale", whale_shares=(0.5, 0.5))
    with pytest.raises(ReplayError):
        spec_for("paper", reuse_fraction=0.0)
    with pytest.raises(ReplayError):
        spec_for("conversation", document_share=1.0)
    with pytest.raises(ReplayError):
        spec_for("conversation", think_time=0.0)


# ------------------------------------------------------------------------------- conversation
def _by_key(q: RequestSet) -> dict[int, list[int]]:
    """Request indices of each key, in arrival order."""
    out: dict[int, list[int]] = {}
    for i, k in enumerate(q.key_index.tolist()):
        out.setdefault(k, []).append(i)
    return out


def test_conversation_turn_is_the_previous_turn_plus_answer_plus_message() -> None:
    # 20 minutes at 5 req/s: most sessions are seen over several turns
    q = generate(spec_for("conversation", requests=6000, rate=5.0), np.random.default_rng(0))
    assert q.block_tokens == 512
    multi = 0
    for reqs in _by_key(q).values():
        for a, b in itertools.pairwise(reqs):
            multi += 1
            earlier, later = q.blocks_of(a).tolist(), q.blocks_of(b).tolist()
            assert later[: len(earlier)] == earlier  # the whole earlier prompt is a prefix
            # the reusable part of a turn is exactly the earlier prompt and its answer
            assert q.prefix_tokens[b] == q.prompt_tokens[a] + q.output_tokens[a]
            assert q.prompt_tokens[b] > q.prefix_tokens[b]
    assert multi > q.n // 2


def test_conversation_blocks_are_shared_only_within_a_tenant(
    workload_factory: WorkloadFactory,
) -> None:
    q = workload_factory("conversation", requests=6000, keys=2000)
    tenant_of = [k.split("/")[0] for k in q.keys]
    assert all(k.startswith("tenant-") and "/conv-" in k for k in q.keys)
    users: dict[int, set[int]] = {}
    for i in range(q.n):
        for blk in q.blocks_of(i).tolist():
            users.setdefault(blk, set()).add(int(q.key_index[i]))
    shared = {blk: keys for blk, keys in users.items() if len(keys) > 1}
    # a block used by two sessions is a tenant prompt block: never across tenants
    assert all(len({tenant_of[k] for k in keys}) == 1 for keys in shared.values())
    # within a tenant, every session starts with the same blocks (or none are shared at all:
    # a tenant prompt shorter than one block)
    first: dict[str, set[int]] = {}
    sessions: dict[str, set[int]] = {}
    for i in range(q.n):
        blocks = q.blocks_of(i)
        if blocks.size:
            k = int(q.key_index[i])
            first.setdefault(tenant_of[k], set()).add(int(blocks[0]))
            sessions.setdefault(tenant_of[k], set()).add(k)
    several = [t for t in first if len(sessions[t]) > 1]
    assert all(len(first[t]) in (1, len(sessions[t])) for t in several)
    assert sum(1 for t in several if len(first[t]) == 1) >= 0.8 * len(several)
    # most cross-session sharing is the tenant prompt of the popular tenants: a lot of it
    assert len(shared) > 50


def test_conversation_is_reproducible(workload_factory: WorkloadFactory) -> None:
    a = workload_factory("conversation", requests=3000, keys=2000, seed=4)
    b = generate(spec_for("conversation", requests=3000, keys=2000), np.random.default_rng(4))
    c = workload_factory("conversation", requests=3000, keys=2000, seed=5)
    assert a.keys == b.keys
    assert np.array_equal(a.times, b.times)
    assert np.array_equal(a.prompt_tokens, b.prompt_tokens)
    assert np.array_equal(a.block_ids, b.block_ids)
    assert not np.array_equal(a.prompt_tokens, c.prompt_tokens)


@pytest.mark.parametrize("seed", [0, 1])
def test_conversation_has_mooncake_like_shape(seed: int) -> None:
    spec = spec_for("conversation", requests=30_000, keys=2000, rate=100.0)
    q = generate(spec, np.random.default_rng(seed))
    p50, p90, p99 = np.percentile(q.prompt_tokens, [50, 90, 99])
    assert 4_000 <= p50 <= 11_000  # Mooncake conversation trace: ~7k
    assert 15_000 <= p90 <= 45_000  # ~27k
    assert 50_000 <= p99 <= 130_000  # ~85k
    assert int(q.prompt_tokens.max()) <= spec.max_context
    assert 200 <= float(q.output_tokens.mean()) <= 500  # Mooncake: 343
    assert q.n == 30_000
    assert q.rate == pytest.approx(100.0, rel=0.1)
    counts = q.key_counts()
    assert np.median(counts) <= 5  # sessions are keys: most are cold
    assert counts.max() >= 15  # and a long tail of long sessions
    # many sessions at once: at mid-run, thousands of sessions are between two turns
    first = np.full(len(q.keys), np.inf)
    last = np.full(len(q.keys), -np.inf)
    np.minimum.at(first, q.key_index, q.times)
    np.maximum.at(last, q.key_index, q.times)
    mid = float(q.times[q.n // 2])
    assert int(np.count_nonzero((first < mid) & (last > mid))) > 1000


def test_conversation_think_times_and_rate() -> None:
    spec = spec_for("conversation", requests=12_000, keys=2000, rate=12_000 / 3600)
    q = generate(spec, np.random.default_rng(0))
    assert q.n == 12_000
    assert q.rate == pytest.approx(spec.rate, rel=0.1)
    assert 3000 <= q.duration <= 4000  # about an hour, as Mooncake's trace
    gaps = np.concatenate([np.diff(q.times[r]) for r in _by_key(q).values() if len(r) > 1])
    assert 15.0 <= float(gaps.mean()) <= 45.0  # think_time 30 s (short gaps are likelier seen)


def test_conversation_round_trips_through_a_mooncake_trace(tmp_path: Path) -> None:
    q = generate(spec_for("conversation", requests=2000, keys=400), np.random.default_rng(3))
    path = tmp_path / "conversation.jsonl"
    assert write_mooncake(q, path) == q.n
    assert detect_format(path) == "mooncake"
    back = read_mooncake(path, key_blocks=4)
    assert back.n == q.n
    assert np.array_equal(back.prompt_tokens, q.prompt_tokens)
    assert np.array_equal(back.output_tokens, q.output_tokens)
    assert np.allclose(back.times, q.times, atol=0.0006)
    assert np.array_equal(back.block_offsets, q.block_offsets)
    # same block structure: the ids map one to one
    pairs = set(zip(q.block_ids.tolist(), back.block_ids.tolist(), strict=True))
    assert len(pairs) == q.n_blocks == back.n_blocks
    # what the trace reader sees as reused is what the workload declared, where seen before
    assert np.all(back.prefix_tokens <= q.prefix_tokens + q.block_tokens)
    assert int(np.count_nonzero(back.prefix_tokens)) > q.n // 2


def test_write_mooncake_needs_512_token_blocks(
    workload_factory: WorkloadFactory, tmp_path: Path
) -> None:
    q = workload_factory("paper", requests=500, keys=50)
    with pytest.raises(ReplayError, match="512"):
        write_mooncake(q, tmp_path / "paper.jsonl")
