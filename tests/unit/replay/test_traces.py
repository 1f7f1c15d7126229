"""Trace readers on the bundled sample traces, and the generic format's round trip."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cacheroute.replay.errors import ReplayError
from cacheroute.replay.requestset import RequestSet, make_request_set
from cacheroute.replay.sources import SourceSpec, detect_format, load_source, write_jsonl
from cacheroute.replay.traces import (
    SESSION_KEYS,
    read_azure,
    read_generic,
    read_mooncake,
    session_hints,
    session_keys,
)

DATA = Path(__file__).resolve().parents[2] / "data" / "traces"


def test_mooncake_arxiv_sample_has_the_documented_shape() -> None:
    q = read_mooncake(DATA / "mooncake_arxiv_1000.jsonl", key_blocks=2)
    s = q.stats()
    assert s["requests"] == 1000
    assert s["keys"] == 403
    assert s["max_key_share"] == pytest.approx(0.36, abs=0.01)
    assert s["gini"] == pytest.approx(0.58, abs=0.01)
    assert s["declared_prefix_share"] == pytest.approx(0.38, abs=0.02)  # infinite-cache ceiling
    assert q.block_tokens == 512
    assert np.all(np.diff(q.block_offsets) * 512 <= q.prompt_tokens)


def test_mooncake_key_blocks_changes_the_key() -> None:
    one = read_mooncake(DATA / "mooncake_arxiv_1000.jsonl", key_blocks=1)
    assert len(one.keys) <= 5  # a handful of shared system prompts


def test_azure_has_synthetic_keys_and_prefixes() -> None:
    q = read_azure(DATA / "azure_llm_2023_conv_3000.csv", np.random.default_rng(0), keys=100)
    assert q.n == 3000
    assert len(q.keys) <= 100
    assert q.keys[0].startswith("azure-key-")
    assert 0 < q.stats()["declared_prefix_share"] < 1
    assert "synthetic keys" in q.notes[0]
    assert q.times[0] == 0.0
    assert q.duration > 0


def test_generic_jsonl_round_trip(tmp_path: Path) -> None:
    src = load_source(SourceSpec(workload="whale", requests=500, keys=50))
    path = tmp_path / "w.jsonl"
    write_jsonl(src, path)
    assert detect_format(path) == "csv"
    back = read_generic(path)
    assert back.n == src.n
    assert back.block_tokens == src.block_tokens
    assert np.allclose(back.times, src.times, atol=1e-6)
    assert np.array_equal(back.prompt_tokens, src.prompt_tokens)
    assert np.array_equal(np.diff(back.block_offsets), np.diff(src.block_offsets))
    assert [back.keys[k] for k in back.key_index] == [src.keys[k] for k in src.key_index]


def test_generic_csv_without_hashes_shares_a_keys_prefix(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text(
        "ts,key,prompt_tokens,prefix_tokens\n0.0,a,1200,1024\n0.5,b,700,0\n1.0,a,1500,1024\n",
        encoding="utf-8",
    )
    q = read_generic(path, block_tokens=512)
    assert q.blocks_of(0).tolist()[:2] == q.blocks_of(2).tolist()[:2]
    assert not set(q.blocks_of(1).tolist()) & set(q.blocks_of(0).tolist())
    assert q.output_tokens.tolist() == [128, 128, 128]


def test_formats_are_detected() -> None:
    assert detect_format(DATA / "mooncake_arxiv_1000.jsonl") == "mooncake"
    assert detect_format(DATA / "azure_llm_2023_conv_3000.csv") == "azure"


def test_small_traces_are_tiled_to_the_size_asked_for() -> None:
    q = load_source(
        SourceSpec(trace=DATA / "mooncake_synthetic_600.jsonl", fmt="mooncake", requests=1500)
    )
    assert q.n == 1800
    assert "tiled x3" in q.notes[0]


def test_bad_lines_name_the_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 10, "output_length": 1}\n', encoding="utf-8")
    with pytest.raises(ReplayError, match=r"bad\.jsonl:1: Mooncake record without 'hash_ids'"):
        read_mooncake(path)


def test_an_azure_row_without_a_column_names_it(tmp_path: Path) -> None:
    path = tmp_path / "az.csv"
    path.write_text("TIMESTAMP,ContextTokens\n2023-11-16 18:15:46.6805900,374\n", encoding="utf-8")
    with pytest.raises(ReplayError, match=r"az\.csv:2: Azure row without 'GeneratedTokens'"):
        read_azure(path, np.random.default_rng(0), keys=10)


def test_azure_rows_with_negative_token_counts_are_refused_by_line(tmp_path: Path) -> None:
    # an empty prompt still counts as one token (a step), but a negative count is no count
    head = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
    ok = "2023-11-16 18:15:46.6805900,374,44\n"
    for bad, counts in (
        ("2023-11-16 18:15:47.0,-5,44\n", "-5, 44"),
        ("2023-11-16 18:15:47.0,5,-1\n", "5, -1"),
    ):
        path = tmp_path / "neg.csv"
        path.write_text(head + ok + bad, encoding="utf-8")
        with pytest.raises(ReplayError, match=rf"neg\.csv:3: .*negative token count \({counts}\)"):
            read_azure(path, np.random.default_rng(0), keys=10)


def test_azure_timestamps_with_a_zone_are_read_in_that_zone(tmp_path: Path) -> None:
    # The published trace has no zone and 7 fractional digits. An export that states a zone must
    # keep it: 19:15:50 at +01:00 is 18:15:50 UTC, 2.5 s after the first request (it used to be
    # cut off with the 7th digit, then read as 19:15:50, an hour off).
    head = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
    rows = (
        "2023-11-16 18:15:48.4951690,374,44\n"
        "2023-11-16 19:15:50.9951690+01:00,396,109\n"
        "2023-11-16T18:15:53.4951690Z,400,10\n"
    )
    path = tmp_path / "zones.csv"
    path.write_text(head + rows, encoding="utf-8")
    q = read_azure(path, np.random.default_rng(0), keys=10)
    assert q.times.tolist() == pytest.approx([0.0, 2.5, 5.0])


@pytest.mark.parametrize(
    ("row", "what"),
    [
        ("0.2,b,-100,0", "prompt_tokens -100"),  # was numpy's "repeats may not contain negative"
        ("0.2,b,0,0", "prompt_tokens 0"),
        ("0.2,b,100,-50", "prefix_tokens -50"),  # was read silently
        ("0.2,,100,0", "key ''"),
        ("0.2,b,100,0,-5", "output_tokens -5"),  # was read as 1
    ],
)
def test_generic_rows_with_impossible_values_are_named_by_row(
    tmp_path: Path, row: str, what: str
) -> None:
    path = tmp_path / "gen.csv"
    path.write_text(
        f"ts,key,prompt_tokens,prefix_tokens,output_tokens\n0.1,a,100,0,5\n{row}\n", "utf-8"
    )
    with pytest.raises(ReplayError, match=rf"gen\.csv: row 2: .*{what}"):
        read_generic(path)


def test_a_generic_zero_output_is_zero_in_jsonl_as_in_csv(tmp_path: Path) -> None:
    # `or default` made a JSON 0 the default 128 while the CSV text "0" stayed 0
    csv_path, jsonl_path = tmp_path / "g.csv", tmp_path / "g.jsonl"
    csv_path.write_text("ts,key,prompt_tokens,output_tokens\n0,a,100,0\n1,a,100,\n", "utf-8")
    jsonl_path.write_text(
        '{"ts": 0, "key": "a", "prompt_tokens": 100, "output_tokens": 0}\n'
        '{"ts": 1, "key": "a", "prompt_tokens": 100}\n',
        "utf-8",
    )
    a, b = read_generic(csv_path), read_generic(jsonl_path)
    assert a.output_tokens.tolist() == b.output_tokens.tolist()
    assert b.output_tokens[1] == 128  # absent: the default


def test_a_generic_row_that_cannot_be_read_is_named_by_its_number(tmp_path: Path) -> None:
    path = tmp_path / "gen.csv"
    path.write_text("ts,key,prompt_tokens\n0.1,a,100\n0.2,b,x\n", encoding="utf-8")
    with pytest.raises(ReplayError, match=r"gen\.csv: row 2: every row needs ts"):
        read_generic(path)


def test_a_trace_longer_than_the_requests_asked_for_is_cut_to_its_first_ones() -> None:
    # `evaluate --quick` says 20,000 requests; a million-request trace was replayed whole
    path = DATA / "mooncake_arxiv_1000.jsonl"
    whole = load_source(SourceSpec(trace=path, requests=1000))
    cut = load_source(SourceSpec(trace=path, requests=300))
    assert (whole.n, cut.n) == (1000, 300)
    assert np.array_equal(cut.times, whole.times[:300])
    assert np.array_equal(cut.prompt_tokens, whole.prompt_tokens[:300])
    assert cut.notes[-1] == "first 300 of the 1,000 requests (--requests for more)"
    assert load_source(SourceSpec(trace=path, requests=300, tile=1)).n == 1000  # asked for


def test_a_trace_without_an_arrival_process_is_refused_by_name(tmp_path: Path) -> None:
    # every request at the same instant: no rate to rescale, so no load sweep can mean anything
    line = '{"timestamp": 5, "input_length": 600, "output_length": 1, "hash_ids": [0, 1]}\n'
    same = tmp_path / "same.jsonl"
    same.write_text(line * 3, encoding="utf-8")
    with pytest.raises(ReplayError, match=r"same\.jsonl: all 3 requests have the same timestamp"):
        load_source(SourceSpec(trace=same, fmt="mooncake", requests=3))
    # one request is not an arrival process either: read alone it is fine, but tiling it would
    # invent one (copies at uniform times over a made-up second; `evaluate --quick` said
    # `deploy` for one 7k-token request), so that is refused
    one = tmp_path / "one.jsonl"
    one.write_text(line, encoding="utf-8")
    assert load_source(SourceSpec(trace=one, fmt="mooncake", requests=1)).n == 1
    assert load_source(SourceSpec(trace=one, fmt="mooncake", requests=500, tile=1)).n == 1
    with pytest.raises(ReplayError, match=r"one\.jsonl: one request, so there is no arrival"):
        load_source(SourceSpec(trace=one, fmt="mooncake", requests=500))
    # coarse times that differ at least once are a real trace
    coarse = tmp_path / "coarse.jsonl"
    coarse.write_text(line * 2 + line.replace('"timestamp": 5', '"timestamp": 3005'), "utf-8")
    q = load_source(SourceSpec(trace=coarse, fmt="mooncake", requests=3))
    assert q.duration == pytest.approx(3.0)


def _recorded(times: np.ndarray[Any, np.dtype[np.float64]]) -> RequestSet:
    """Recorded requests of one key at `times`, as `evaluate --topic` reads them back."""
    n = len(times)
    return make_request_set(
        times=times,
        keys=["k"] * n,
        prompt_tokens=[100] * n,
        output_tokens=[1] * n,
        block_lists=[[1, 2]] * n,
        block_tokens=16,
        source="recorded",
    )


def test_recorded_requests_all_at_one_instant_are_refused() -> None:
    with pytest.raises(ReplayError, match="the recorded requests: all 4 requests"):
        load_source(SourceSpec(recorded=_recorded(np.zeros(4)), requests=4))
    with pytest.raises(ReplayError, match="the recorded requests: one request"):
        load_source(SourceSpec(recorded=_recorded(np.zeros(1)), requests=100))


def test_session_keys_follow_conversations_and_group_them_by_shared_prefix() -> None:
    # tenant A: system prompt blocks 1, 2; conversations X (own blocks 10..) and Y (20..)
    # tenant B: system prompt block 5; conversations Z (30..), V (40) and W, whose first turn is
    # shorter than a block; a lone request; a request with no full block (first, partial id 777)
    lists = [
        [1, 2, 10],  # X turn 1
        [1, 2, 20, 21],  # Y turn 1
        [5, 30],  # Z turn 1
        [5],  # W turn 1 (its message is in the dropped partial block)
        [1, 2, 10, 11, 12],  # X turn 2
        [1, 2, 20, 21, 22],  # Y turn 2
        [5, 30, 31],  # Z turn 2
        [99, 98],  # alone
        [],  # no full block
        [5, 40],  # V turn 1
    ]
    firsts = [1, 1, 5, 5, 1, 1, 5, 99, 777, 5]
    k = session_keys(lists, firsts)
    x1, y1, z1, w1, x2, y2, z2, lone, short, v1 = k
    # every turn of a conversation has one key
    assert x1 == x2
    assert y1 == y2
    assert z1 == z2
    assert v1 == w1  # one-off requests (V's block never recurs) key on their group alone
    assert len({x1, y1, z1, w1, lone, short}) == 6
    group = [key.rpartition("/")[0] for key in (x1, y1, z1, w1)]
    assert group[0] == group[1] != group[2] == group[3]  # tenant = the group
    assert all((x1.endswith("/10"), y1.endswith("/20"), z1.endswith("/30"), w1.endswith("/")))
    assert (lone, short) == ("mc-99", "mc-777")


def test_session_keys_from_a_mooncake_file(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    rows = [
        (0, 1100, [1, 2, 3]),  # A: system 1, 2 (1024 tokens) + 76 tokens (partial id 3)
        (10, 1600, [1, 2, 4, 5]),  # B: 1, 2 + full block 4 + partial 5
        (20, 2100, [1, 2, 4, 6, 7]),  # B turn 2: 1, 2, 4, 6 + partial 7
        (30, 1600, [1, 2, 8, 9]),  # C: 1, 2 + full block 8 + partial 9 (one-off)
    ]
    path.write_text(
        "".join(
            f'{{"timestamp": {t}, "input_length": {n}, "output_length": 8, "hash_ids": {ids}}}\n'
            for t, n, ids in rows
        )
    )
    q = read_mooncake(path, key_blocks=SESSION_KEYS)
    keys = [q.keys[i] for i in q.key_index.tolist()]
    assert keys[1] == keys[2] != keys[0]
    assert keys[0] == keys[3]  # A and C: one-off requests on the shared prefix
    assert keys[0].endswith("/")
    assert keys[1].endswith("/4")
    assert "session keys" in q.source


def test_session_hints_name_each_requests_conversation_under_a_coarse_key() -> None:
    # keyed by tenant (first block), as `--key-blocks 1` would: two conversations of tenant 1
    q = make_request_set(
        times=[0.0, 1.0, 2.0, 3.0, 4.0],
        keys=["t1", "t1", "t1", "t1", "t2"],
        prompt_tokens=[1536, 1536, 2560, 2560, 100],
        output_tokens=[1] * 5,
        block_lists=[[1, 10, 11], [1, 20, 21], [1, 10, 11, 12, 13], [1, 20, 21, 22, 23], []],
        block_tokens=512,
        source="test",
    )
    x1, y1, x2, y2, short = session_hints(q)
    assert x1 == x2  # one conversation: every turn has the same hint
    assert y1 == y2
    assert x1 != y1  # two conversations of one key: two hints
    assert short not in (x1, y1)  # no full block: its own session


def _mooncake_lines(times_ms: list[float]) -> str:
    return "".join(
        f'{{"timestamp": {t!r}, "input_length": 600, "output_length": 1, "hash_ids": [{i}, 9]}}\n'
        for i, t in enumerate(times_ms)
    )


def test_one_record_whose_clock_is_off_is_refused_with_its_time(tmp_path: Path) -> None:
    # 200 requests one second apart (199 s), plus one dated a day later: the replay would
    # rescale by a mean rate of 201 requests over a day and run everything else as one burst
    times = [1000.0 * i for i in range(200)] + [86_400_000.0 + 199_000.0]
    path = tmp_path / "late.jsonl"
    path.write_text(_mooncake_lines(times), encoding="utf-8")
    with pytest.raises(ReplayError) as err:
        load_source(SourceSpec(trace=path, fmt="mooncake", requests=201))
    text = str(err.value)
    assert "late.jsonl: 1 record(s) up to 86599 s, up to 1 days after the rest" in text
    # the other requests: all but the first and last 2 (1% of 201 -> 2 each side), so from
    # 2 s to 198 s: 196 s = 3.27 min
    assert "the other requests span 3.27 min" in text
    assert "fix or remove them" in text


def test_records_off_on_both_sides_are_all_named(tmp_path: Path) -> None:
    # two records 30 years early and 3 a year late around 300 requests 1 s apart: the largest
    # single pause is under half the span, so a one-pause rule would miss this
    year_ms = 365.25 * 86_400_000
    body = [30 * year_ms + 1000.0 * i for i in range(300)]
    times = [0.0, 1.0, *body, *(31 * year_ms + 1000.0 * j for j in range(3))]
    path = tmp_path / "both.jsonl"
    path.write_text(_mooncake_lines(times), encoding="utf-8")
    with pytest.raises(
        ReplayError,
        match=r"2 record\(s\) from 0 s, up to 30 years before the "
        r"rest and 3 record\(s\) up to .* after the rest",
    ):
        load_source(SourceSpec(trace=path, fmt="mooncake", requests=len(times)))


def test_real_pauses_and_short_traces_are_kept(tmp_path: Path) -> None:
    # two busy halves with a quiet hour between them: the central 98% spans the pause too
    times = [1000.0 * i for i in range(100)] + [3_700_000.0 + 1000.0 * i for i in range(100)]
    path = tmp_path / "halves.jsonl"
    path.write_text(_mooncake_lines(times), encoding="utf-8")
    assert load_source(SourceSpec(trace=path, fmt="mooncake", requests=200)).n == 200
    # under 20 requests there is no "rest" to judge a record by
    few = [1000.0 * i for i in range(18)] + [1e12]
    short = tmp_path / "short.jsonl"
    short.write_text(_mooncake_lines(few), encoding="utf-8")
    assert load_source(SourceSpec(trace=short, fmt="mooncake", requests=19)).n == 19


def test_recorded_requests_with_a_clock_off_are_refused() -> None:
    rs = _recorded(np.concatenate([np.arange(50.0), [1e9]]))
    with pytest.raises(ReplayError, match=r"the recorded requests: 1 record\(s\) up to 1e\+09 s"):
        load_source(SourceSpec(recorded=rs, requests=51))


@pytest.mark.parametrize(
    "name", sorted(p.name for p in DATA.iterdir() if p.suffix in (".jsonl", ".csv"))
)
def test_every_bundled_trace_passes_the_clock_check(name: str) -> None:
    assert load_source(SourceSpec(trace=DATA / name, requests=100, tile=1)).n > 0


def test_a_timestamp_that_is_not_a_finite_number_is_named_by_its_line(tmp_path: Path) -> None:
    good = '{"timestamp": 5, "input_length": 600, "output_length": 1, "hash_ids": [0, 1]}\n'
    path = tmp_path / "nan.jsonl"
    path.write_text(good + good.replace("5", '"nan"', 1), encoding="utf-8")
    with pytest.raises(ReplayError, match=r"nan\.jsonl:2: timestamp 'nan' is not a finite number"):
        read_mooncake(path)
    gen = tmp_path / "inf.csv"
    gen.write_text("ts,key,prompt_tokens\n0.1,a,100\ninf,b,100\n", encoding="utf-8")
    with pytest.raises(ReplayError, match=r"inf\.csv: row 2: .*ts 'inf' is not a finite number"):
        read_generic(gen)
