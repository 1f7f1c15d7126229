"""Compressed traces read as their plain copies; broken or unreadable ones get a clear error."""

from __future__ import annotations

import bz2
import gzip
import lzma
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from cacheroute.replay.errors import ReplayError
from cacheroute.replay.requestset import RequestSet
from cacheroute.replay.sources import SourceSpec, detect_format, load_source, write_jsonl
from cacheroute.replay.tracefiles import compression, data_suffix

DATA = Path(__file__).resolve().parents[2] / "data" / "traces"

COMPRESSORS: dict[str, Callable[[bytes], bytes]] = {
    ".gz": gzip.compress,
    ".bz2": bz2.compress,
    ".xz": lzma.compress,
}


def _same(a: RequestSet, b: RequestSet) -> None:
    assert a.n == b.n
    assert np.array_equal(a.times, b.times)
    assert np.array_equal(a.prompt_tokens, b.prompt_tokens)
    assert np.array_equal(a.block_ids, b.block_ids)
    assert [a.keys[k] for k in a.key_index.tolist()] == [b.keys[k] for k in b.key_index.tolist()]


@pytest.mark.parametrize("suffix", sorted(COMPRESSORS))
@pytest.mark.parametrize(
    ("name", "fmt"),
    [("mooncake_arxiv_1000.jsonl", "mooncake"), ("azure_llm_2023_conv_3000.csv", "azure")],
)
def test_a_compressed_trace_reads_as_its_plain_copy(
    tmp_path: Path, name: str, fmt: str, suffix: str
) -> None:
    plain = DATA / name
    packed = tmp_path / (name + suffix)
    packed.write_bytes(COMPRESSORS[suffix](plain.read_bytes()))
    assert compression(packed) == {".gz": "gzip", ".bz2": "bzip2", ".xz": "xz"}[suffix]
    assert detect_format(packed) == fmt
    want = load_source(SourceSpec(trace=plain, requests=100, tile=1))
    got = load_source(SourceSpec(trace=packed, requests=100, tile=1))
    _same(got, want)


def test_a_generic_jsonl_is_known_by_its_name_under_the_compression_suffix(
    tmp_path: Path,
) -> None:
    base = load_source(SourceSpec(trace=DATA / "mooncake_arxiv_1000.jsonl", requests=50, tile=1))
    plain = tmp_path / "gen.jsonl"
    write_jsonl(base.head(50), plain)
    packed = tmp_path / "gen.jsonl.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    assert detect_format(packed) == "csv"  # the generic format, JSONL flavour
    _same(
        load_source(SourceSpec(trace=packed, requests=50, tile=1)),
        load_source(SourceSpec(trace=plain, requests=50, tile=1)),
    )


@pytest.mark.parametrize("packer", [None, gzip.compress])
@pytest.mark.parametrize(
    ("name", "fmt"),
    [("mooncake_arxiv_1000.jsonl", "mooncake"), ("azure_llm_2023_conv_3000.csv", "azure")],
)
def test_a_byte_order_mark_is_not_part_of_the_first_record(
    tmp_path: Path, name: str, fmt: str, packer: Callable[[bytes], bytes] | None
) -> None:
    # Windows editors and spreadsheet exports write EF BB BF before the text; it used to make
    # line 1 "not JSON" and the CSV header's first column "\ufeffTIMESTAMP".
    plain = DATA / name
    marked = tmp_path / (name + (".gz" if packer else ""))
    data = b"\xef\xbb\xbf" + plain.read_bytes()
    marked.write_bytes(packer(data) if packer else data)
    assert detect_format(marked) == fmt
    want = load_source(SourceSpec(trace=plain, requests=100, tile=1))
    _same(load_source(SourceSpec(trace=marked, requests=100, tile=1)), want)


def test_a_generic_csv_with_a_byte_order_mark_keeps_its_first_column(tmp_path: Path) -> None:
    rows = "ts,key,prompt_tokens\n0,a,100\n1,b,200\n2,a,300\n"
    plain, marked = tmp_path / "plain.csv", tmp_path / "marked.csv"
    plain.write_text(rows, encoding="utf-8")
    marked.write_bytes(b"\xef\xbb\xbf" + rows.encode())
    got = load_source(SourceSpec(trace=marked, requests=3, tile=1))
    assert got.times.tolist() == [0.0, 1.0, 2.0]
    assert got.prompt_tokens.tolist() == [100, 200, 300]
    _same(got, load_source(SourceSpec(trace=plain, requests=3, tile=1)))


def test_unreadable_compressed_files_say_what_is_wrong(tmp_path: Path) -> None:
    zst = tmp_path / "t.jsonl.zst"
    zst.write_bytes(b"\x28\xb5\x2f\xfd" + b"\x00" * 16)  # a zstd frame's magic number
    with pytest.raises(ReplayError, match=r"t\.jsonl\.zst is zstd-compressed.*zstd -d t\.jsonl"):
        load_source(SourceSpec(trace=zst, requests=10))
    whole = gzip.compress((DATA / "mooncake_arxiv_1000.jsonl").read_bytes())
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(whole[: len(whole) // 2])  # truncated mid-stream
    with pytest.raises(ReplayError, match=r"cannot read trace .*cut\.jsonl\.gz"):
        load_source(SourceSpec(trace=cut, fmt="mooncake", requests=10))


@pytest.mark.parametrize(
    ("name", "suffix"),
    [
        ("a.jsonl", ".jsonl"),
        ("a.jsonl.gz", ".jsonl"),
        ("a.csv.xz", ".csv"),
        ("a.b.csv.bz2", ".csv"),
        ("a.gz", ""),
        ("a", ""),
    ],
)
def test_data_suffix_skips_compression_suffixes(name: str, suffix: str) -> None:
    assert data_suffix(Path(name)) == suffix
