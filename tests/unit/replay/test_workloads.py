"""Synthetic workloads: seeded, the paper's skew, whales, low reuse, prefixes that grow."""

from __future__ import annotations

import numpy as np
import pytest

from cacheroute.replay.errors import ReplayError
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
