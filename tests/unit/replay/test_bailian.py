"""Block-hash traces at a finer block: the block size found, fine ids merged, Bailian's format read.

Every expected value is derived by hand in the comments (16-token fine blocks, 512-token replay
blocks: 32 fine ids a block), or compared with the Mooncake reader on the same trace.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import orjson
import pytest

from cacheroute.replay import traces
from cacheroute.replay.blockhash import BlockMerger, infer_block_tokens
from cacheroute.replay.errors import ReplayError
from cacheroute.replay.sources import SourceSpec, detect_format, load_source
from cacheroute.replay.traces import SESSION_KEYS, read_bailian, read_mooncake, session_hints

DATA = Path(__file__).resolve().parents[2] / "data" / "traces"


def test_the_block_size_is_the_one_whose_id_counts_fit() -> None:
    # ceil(33/16) = 3, 16/16 = 1, ceil(100/16) = 7; at 32 tokens: 2, 1, 4 - no
    assert infer_block_tokens([33, 16, 100], [3, 1, 7]) == 16
    # Mooncake: ceil(1000/512) = 2, 2048/512 = 4; full blocks only (floor) fits too
    assert infer_block_tokens([1000, 2048], [2, 4]) == 512
    assert infer_block_tokens([1000, 2048], [1, 4]) == 512
    # prompts shorter than every size listed with one id: the smallest size
    assert infer_block_tokens([1], [1]) == 1


def test_ids_that_fit_no_block_size_are_refused() -> None:
    with pytest.raises(ReplayError, match="fit no block size"):
        infer_block_tokens([1000, 1000, 1000], [5000, 3, 900])


def test_fine_ids_merge_into_coarse_blocks_by_their_whole_prefix() -> None:
    # 16-token ids into 64-token blocks: 4 fine ids a block
    fine = [
        [1, 2, 3, 4, 5, 6, 7],  # p = 100: groups (1-4) (5-7); full fine 6 -> 1 full block
        [1, 2, 3, 4],  # p = 64: the same first group; 4 full fine -> 1 full block
        [9, 2, 3, 4, 5],  # p = 70: another first id, so another block though 2-4 agree
        [9, 2, 3, 4, 5, 6, 7, 8],  # p = 128: first group as the third's, then its own
        [1, 2, 3, 4, 5, 6, 7, 8],  # p = 128: (5-8) after (1-4) is not (5-8) after (9,2-4)
    ]
    merger = BlockMerger(16, 64)
    merged = [merger.add(ids, p) for ids, p in zip(fine, [100, 64, 70, 128, 128], strict=True)]
    coarse, full = [row for row, _ in merged], [n for _, n in merged]
    assert coarse == [[0, 1], [0], [2, 3], [2, 4], [0, 5]]
    assert full == [1, 1, 1, 2, 2]
    with pytest.raises(ReplayError, match="does not divide"):
        BlockMerger(48, 512)


def _bailian_conversations(path: Path) -> None:
    """Two conversations behind one 1024-token system prompt (fine ids 1-64), 16-token ids.

    A1 (t = 0 s): system + 600 tokens: p = 1624, ids 1-64 then 101-138 (37 full + a partial);
    B  (t = 2.5 s): system + 600 other tokens: p = 1624, ids 1-64 then 301-338;
    A2 (t = 4 s): A1's prompt + answer + question: p = 2124, ids 1-64, 101-137 (A1's partial
    block is now full, with other content), 201-232 (ceil(2124/16) = 133 ids in all).
    """
    system = list(range(1, 65))
    rows = [
        {"chat_id": 0, "parent_chat_id": -1, "timestamp": 0.0, "input_length": 1624,
         "output_length": 200, "type": "text", "turn": 1,
         "hash_ids": system + list(range(101, 139))},
        {"chat_id": 1, "parent_chat_id": -1, "timestamp": 2.5, "input_length": 1624,
         "output_length": 50, "type": "text", "turn": 1,
         "hash_ids": system + list(range(301, 339))},
        {"chat_id": 2, "parent_chat_id": 0, "timestamp": 4.0, "input_length": 2124,
         "output_length": 80, "type": "text", "turn": 2,
         "hash_ids": system + list(range(101, 138)) + list(range(201, 233))},
    ]  # fmt: skip
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))


def test_a_bailian_trace_reads_in_seconds_and_512_token_blocks(tmp_path: Path) -> None:
    path = tmp_path / "qwen_blksz_16.jsonl"
    _bailian_conversations(path)
    assert detect_format(path) == "bailian"
    q = read_bailian(path, key_blocks=2)
    assert q.times.tolist() == [0.0, 2.5, 4.0]  # seconds, not milliseconds
    assert q.block_tokens == 512
    assert q.prompt_tokens.tolist() == [1624, 1624, 2124]
    assert q.output_tokens.tolist() == [200, 50, 80]
    # A1: 101 full fine blocks -> 3 full blocks (system x2, 101-132); B: 3 (system x2, 301-332);
    # A2: 132 -> 4 (system x2, 101-132, then 133-137 + 201-227: not A1's partial block)
    a1, b, a2 = (q.blocks_of(i).tolist() for i in range(3))
    assert (len(a1), len(b), len(a2)) == (3, 3, 4)
    assert a1[:2] == b[:2] == a2[:2]
    assert b[2] != a1[2] == a2[2]
    assert a2[3] not in a1
    # declared prefix: nothing before A1; B has the system prompt; A2 A1's three blocks
    assert q.prefix_tokens.tolist() == [0, 1024, 1536]
    # key = the first two 512-token blocks: the system prompt, the same for all three
    assert len(q.keys) == 1
    assert "16-token hash ids merged into 512-token blocks" in q.source


def test_session_keys_of_a_bailian_trace_follow_its_conversations(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    _bailian_conversations(path)
    q = read_bailian(path, key_blocks=SESSION_KEYS)
    keys = [q.keys[k] for k in q.key_index.tolist()]
    # the system prompt's two blocks are where A and B part; A's next block recurs (A1, A2):
    # A's key is its conversation; B's own block does not recur, so B keys on the system prompt
    assert keys[0] == keys[2] != keys[1]


def test_a_bailian_trace_with_ids_of_no_block_size_is_refused_by_name(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    row = {"chat_id": 0, "parent_chat_id": -1, "timestamp": 0.0, "input_length": 5000,
           "output_length": 1, "hash_ids": [1, 2, 3]}  # fmt: skip
    path.write_bytes(orjson.dumps(row) + b"\n")
    with pytest.raises(ReplayError, match=r"bad\.jsonl: hash_ids fit no block size"):
        read_bailian(path)


def test_a_bailian_record_without_its_fields_is_named(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_bytes(b'{"chat_id": 0, "timestamp": 1.0, "input_length": 10}\n')
    with pytest.raises(ReplayError, match=r"t\.jsonl:1: Bailian record without 'output_length'"):
        read_bailian(path)


def _first_use(labels: np.ndarray) -> np.ndarray:
    """Labels renamed 0, 1, 2 ... in order of first appearance (the partition they make)."""
    seen: dict[int, int] = {}
    return np.asarray([seen.setdefault(int(x), len(seen)) for x in labels])


@pytest.mark.parametrize(("key_blocks", "sample"), [(2, None), (SESSION_KEYS, None), (2, 10)])
def test_a_mooncake_trace_split_into_16_token_ids_reads_as_the_original(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, key_blocks: int, sample: int | None
) -> None:
    """The bundled conversation trace, each 512-token id written as 32 ids of 16 tokens (a
    partial last block as ceil(rest / 16) ids) and times in seconds: the Bailian reader gives
    what the Mooncake reader gives on the original - the reference it is checked against.
    `sample`: the block size found on the first 10 requests, the rest merged as they stream."""
    if sample is not None:
        monkeypatch.setattr(traces, "_SIZE_SAMPLE", sample)
    original = DATA / "conversation_mooncake_6000.jsonl"
    lines = original.read_bytes().splitlines()[:1500]
    fine_path = tmp_path / "fine.jsonl"
    with fine_path.open("wb") as fh:
        for n, line in enumerate(lines):
            r = orjson.loads(line)
            p, ids = r["input_length"], r["hash_ids"]
            fine = [x * 32 + j for x in ids[: p // 512] for j in range(32)]
            if p % 512:
                fine += [ids[-1] * 32 + j for j in range(-(-(p % 512) // 16))]
            assert len(fine) == -(-p // 16)
            row = {"chat_id": n, "parent_chat_id": -1, "timestamp": r["timestamp"] / 1000,
                   "input_length": p, "output_length": r["output_length"], "hash_ids": fine}  # fmt: skip
            fh.write(orjson.dumps(row) + b"\n")
    short = tmp_path / "original.jsonl"
    short.write_bytes(b"\n".join(lines) + b"\n")
    want = read_mooncake(short, key_blocks=key_blocks)
    got = read_bailian(fine_path, key_blocks=key_blocks)
    assert np.allclose(got.times, want.times)
    for col in ("prompt_tokens", "output_tokens", "prefix_tokens", "block_offsets"):
        assert np.array_equal(getattr(got, col), getattr(want, col)), col
    # key strings name coarse ids, so compare which requests share a key
    assert np.array_equal(_first_use(got.key_index), _first_use(want.key_index))
    # the same blocks: equal ids where the original's are equal (ids themselves are labels)
    assert np.array_equal(_first_use(got.block_ids), _first_use(want.block_ids))
    # the generic loader finds the format by itself and reads the same
    auto = load_source(SourceSpec(trace=fine_path, key_blocks=key_blocks, tile=1))
    assert np.array_equal(_first_use(auto.block_ids), _first_use(want.block_ids))


def test_chat_id_chains_name_each_requests_conversation(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    _bailian_conversations(path)  # A1 (chat 0), B (chat 1), A2 (chat 2, parent 0)
    q = read_bailian(path)
    assert q.conversations == ("chat-0", "chat-1", "chat-0")
    assert session_hints(q) == q.conversations  # given, not guessed from the blocks
    # copies of a tiled trace are other conversations; a head keeps its requests' own
    tiled = q.tiled(2, np.random.default_rng(0))
    assert tiled.conversations is not None
    assert Counter(tiled.conversations) == {"chat-0": 2, "chat-1": 1, "chat-0#1": 2, "chat-1#1": 1}
    assert q.head(2).conversations == ("chat-0", "chat-1")
    # Mooncake's format has no chat ids: conversations are left to the blocks
    assert read_mooncake(DATA / "mooncake_arxiv_1000.jsonl").conversations is None


def test_a_chain_whose_first_turn_is_cut_off_still_holds_together(tmp_path: Path) -> None:
    # chat 7's parent 3 is before the trace's window: 7, its child 8 and grandchild 9 are one
    # conversation (named by the missing parent), 10 starts its own; ids as text work too
    rows = [
        (7, 3, 0.0), (10, -1, 1.0), (8, 7, 2.0), ("9", 8, 3.0),
    ]  # fmt: skip
    path = tmp_path / "cut.jsonl"
    path.write_bytes(
        b"".join(
            orjson.dumps(
                {"chat_id": c, "parent_chat_id": p, "timestamp": t, "input_length": 600,
                 "output_length": 10, "hash_ids": list(range(k * 100, k * 100 + 38))}
            ) + b"\n"
            for k, (c, p, t) in enumerate(rows)
        )
    )  # fmt: skip
    assert read_bailian(path).conversations == ("chat-3", "chat-10", "chat-3", "chat-3")
