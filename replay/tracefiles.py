"""Opening trace files as published: plain, or compressed with gzip, bzip2 or xz.

Public request traces are often shipped compressed (`.jsonl.gz`, `.csv.xz`), and a reader that
took their bytes for text used to fail with an error about CSV columns that said nothing about
compression. The compression is found from the file's first bytes (its magic number), not its
name, and the name's compression suffix is ignored when the format is guessed from the name
(`data_suffix`). Zstandard is recognised but not read: the standard library has no decoder, so
the error says how to decompress the file first. A UTF-8 byte order mark, which Windows editors
and spreadsheet exports put in front of text, is skipped: it is not part of the first record.
"""

from __future__ import annotations

import bz2
import gzip
import lzma
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, Literal, cast, overload

from cacheroute.replay.errors import ReplayError

__all__ = ["COMPRESSED_SUFFIXES", "READ_ERRORS", "compression", "data_suffix", "open_trace"]

_MAGIC: tuple[tuple[bytes, str], ...] = (
    (b"\x1f\x8b", "gzip"),
    (b"BZh", "bzip2"),
    (b"\xfd7zXZ\x00", "xz"),
    (b"\x28\xb5\x2f\xfd", "zstd"),
)
_OPENERS: dict[str, Callable[..., IO[Any]]] = {
    "gzip": gzip.open,
    "bzip2": bz2.open,
    "xz": lzma.open,
}
"""Per compression read here, its module's `open` (same signature as the built-in's)."""
COMPRESSED_SUFFIXES = (".gz", ".bz2", ".xz", ".zst")
_BOM = b"\xef\xbb\xbf"
READ_ERRORS: tuple[type[Exception], ...] = (OSError, EOFError, lzma.LZMAError, UnicodeDecodeError)
"""What reading a trace file can raise below the format: a missing file, a truncated or corrupt
compressed stream (gzip raises OSError or EOFError, xz LZMAError), bytes that are not UTF-8."""


def compression(path: Path) -> str | None:
    """`gzip`, `bzip2`, `xz` or `zstd` from the file's first bytes; None for anything else."""
    try:
        with path.open("rb") as fh:
            head = fh.read(6)
    except OSError as exc:
        raise ReplayError(f"cannot read trace {path}: {exc}") from None
    return next((name for magic, name in _MAGIC if head.startswith(magic)), None)


def data_suffix(path: Path) -> str:
    """The suffix that names the data format: `.jsonl` for `x.jsonl.gz` as for `x.jsonl`."""
    suffixes = [s.lower() for s in path.suffixes]
    while suffixes and suffixes[-1] in COMPRESSED_SUFFIXES:
        suffixes.pop()
    return suffixes[-1] if suffixes else ""


@overload
def open_trace(path: Path, text: Literal[False]) -> IO[bytes]: ...
@overload
def open_trace(path: Path, text: Literal[True]) -> IO[str]: ...
def open_trace(path: Path, text: bool) -> IO[bytes] | IO[str]:
    """`path` opened for reading, decompressed if it is compressed, past a leading byte order
    mark; text as UTF-8 with the newline handling `csv` wants. Raises `ReplayError` for a file
    it cannot open or decode."""
    kind = compression(path)
    if kind == "zstd":
        raise ReplayError(
            f"{path} is zstd-compressed, which this reader does not decode; decompress it first "
            f"(zstd -d {path.name}) and pass the result"
        )
    opener = _OPENERS.get(kind or "", open)
    try:
        if text:
            return cast(IO[str], opener(path, "rt", encoding="utf-8-sig", newline=""))
        fh = cast(IO[bytes], opener(path, "rb"))
        try:
            if fh.read(len(_BOM)) != _BOM:
                fh.seek(0)
        except READ_ERRORS:
            fh.close()
            raise
        return fh
    except READ_ERRORS as exc:
        raise ReplayError(f"cannot read trace {path}: {exc}") from None
