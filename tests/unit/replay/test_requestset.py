"""RequestSet: construction, sorting, dense block ids, time compression, tiling."""

from __future__ import annotations

import numpy as np
import pytest

from cacheroute.replay.errors import ReplayError
from cacheroute.replay.evaluate import servable
from cacheroute.replay.requestset import make_request_set
from cacheroute.replay.service import ServiceModel

from .conftest import TinyFactory


def test_requests_are_sorted_by_time_with_their_blocks_and_ids_made_dense() -> None:
    q = make_request_set(
        times=[3.0, 1.0, 2.0],
        keys=["b", "a", "b"],
        prompt_tokens=[40, 20, 33],
        output_tokens=[1, 0, 5],
        block_lists=[[900, 901], [7], [900]],
        block_tokens=16,
        source="t",
    )
    assert q.times.tolist() == [1.0, 2.0, 3.0]
    assert [q.keys[k] for k in q.key_index] == ["a", "b", "b"]
    assert q.prompt_tokens.tolist() == [20, 33, 40]
    assert q.output_tokens.tolist() == [1, 5, 1]  # at least one output token
    assert [q.blocks_of(i).tolist() for i in range(3)] == [[0], [1], [1, 2]]
    assert q.n_blocks == 3
    assert q.rate == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"keys": ["a"]}, "keys for"),
        ({"prompt_tokens": [0, 5]}, ">= 1"),
        ({"block_lists": [[1, 2, 3], []]}, "more full blocks"),
        ({"keys": ["a", ""]}, "non-empty"),
    ],
)
def test_bad_input_is_rejected(kwargs: dict[str, object], message: str) -> None:
    base: dict[str, object] = {
        "times": [0.0, 1.0],
        "keys": ["a", "b"],
        "prompt_tokens": [20, 20],
        "output_tokens": [1, 1],
        "block_lists": [[1], [2]],
        "block_tokens": 16,
        "source": "t",
    }
    with pytest.raises(ReplayError, match=message):
        make_request_set(**(base | kwargs))  # type: ignore[arg-type]


def test_compression_scales_the_rate_and_keeps_the_requests(tiny_factory: TinyFactory) -> None:
    q = tiny_factory([[1], [2], [1, 3], [4]])
    fast = q.compressed(4.0)
    assert fast.rate == pytest.approx(4 * q.rate)
    assert np.array_equal(fast.block_ids, q.block_ids)
    assert fast.notes[-1] == "time-compressed x4"
    with pytest.raises(ReplayError):
        q.compressed(0.0)


def test_tiling_overlays_copies_with_disjoint_keys_and_blocks(tiny_factory: TinyFactory) -> None:
    q = tiny_factory([[1, 2], [1], [3]], keys=["a", "a", "b"])
    t = q.tiled(3, np.random.default_rng(0))
    assert t.n == 9
    assert len(t.keys) == 6
    assert {"a#1", "b#2"} <= set(t.keys)
    assert t.n_blocks == 3 * q.n_blocks
    assert np.all(np.diff(t.times) >= 0)
    assert t.times.min() >= q.times.min()
    assert t.times.max() <= q.times.max() + 1
    # a copy's key only ever uses its own copy's blocks
    for i in range(t.n):
        copy = t.keys[t.key_index[i]].partition("#")[2] or "0"
        assert {int(b) // q.n_blocks for b in t.blocks_of(i)} <= {int(copy)}
    assert "tiled x3" in t.notes[-1]


def test_head_and_stats(tiny_factory: TinyFactory) -> None:
    q = tiny_factory([[1], [1, 2], [1, 2, 3], [9]])
    h = q.head(2)
    assert h.n == 2
    assert h.block_offsets.tolist() == [0, 1, 3]
    s = q.stats()
    assert s["requests"] == 4
    assert s["keys"] == 3
    assert 0.0 <= s["gini"] <= 1.0


def test_subset_keeps_each_chosen_request_with_its_own_blocks(tiny_factory: TinyFactory) -> None:
    # blocks are renumbered densely in order of first sight: [1]->0, [1,2]->0,1, [9]->3
    q = tiny_factory([[1], [1, 2], [1, 2, 3], [9]], output=[5, 6, 7, 8])
    s = q.subset(np.array([False, True, False, True]), "why")
    assert s.n == 2
    assert s.times.tolist() == [1.0, 3.0]
    assert s.output_tokens.tolist() == [6, 8]
    assert s.block_offsets.tolist() == [0, 2, 3]
    assert s.block_ids.tolist() == [0, 1, 3]
    assert [s.keys[k] for k in s.key_index.tolist()] == ["k1", "k0"]
    assert s.notes[-1] == "why"


def test_servable_leaves_out_prompts_no_replica_can_hold(tiny_factory: TinyFactory) -> None:
    q = tiny_factory([[1], [2], [3], [4]], prompt=[100, 1000, 1001, 300], output=[2000, 4, 4, 4])
    service = ServiceModel(cache_tokens=1000)
    kept = servable(q, service)
    # a prompt of exactly the capacity fits; one token more does not
    assert kept.prompt_tokens.tolist() == [100, 1000, 300]
    assert kept.notes[-2].startswith("left out 1 of 4 requests whose prompt exceeds")
    assert "(1,000 tokens, --cache-tokens; the longest 1,001)" in kept.notes[-2]
    # an engine stops generating at the capacity: 1000 - 100 = 900 tokens; a prompt that fills
    # it still produces its first token
    assert kept.output_tokens.tolist() == [900, 1, 4]
    assert kept.notes[-1].startswith("cut 2 outputs where prompt + output reaches")
    assert "the longest asked 2,000" in kept.notes[-1]
    assert servable(kept, service) is kept  # nothing to leave out or cut: the same set
    with pytest.raises(ReplayError, match="every request's prompt is longer"):
        servable(q, ServiceModel(cache_tokens=99))
