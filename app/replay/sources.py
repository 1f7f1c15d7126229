"""Where a replay comes from: a synthetic workload or a trace file, scaled to the size asked for.

Shared by `cacheroute evaluate`, `workload generate` and `replay`, so all three read a source the
same way. Traces smaller than `min_requests` are tiled (copies with offset ids, random shifts) to
reach it; the RequestSet's notes record what was done. `write_jsonl` and `write_mooncake` write a
RequestSet back out as a generic or a Mooncake trace.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import orjson

from cacheroute.replay.errors import ReplayError
from cacheroute.replay.requestset import RequestSet
from cacheroute.replay.traces import MOONCAKE_BLOCK_TOKENS, TraceFormat, read_trace
from cacheroute.replay.workloads import WorkloadKind, generate, spec_for

__all__ = ["SourceSpec", "detect_format", "load_source", "write_jsonl", "write_mooncake"]

AutoFormat = TraceFormat | Literal["auto"]


@dataclass(frozen=True, slots=True)
class SourceSpec:
    """A synthetic workload kind or a trace, with the knobs that shape it."""

    workload: WorkloadKind | None = None
    trace: Path | None = None
    fmt: AutoFormat = "auto"
    requests: int = 60_000
    keys: int = 2000
    rate: float | None = None
    """Base rate of a synthetic workload (None: the kind's default, see `spec_for`)."""
    cv: float = 1.0
    seed: int = 0
    key_blocks: int = 2
    tile: int | None = None
    """Trace copies; None = as many as `requests` needs."""
    limit: int | None = None

    def describe(self) -> dict[str, Any]:
        """For reports."""
        if self.workload is not None:
            return {"kind": self.workload, "keys": self.keys, "seed": self.seed, "cv": self.cv}
        return {"trace": str(self.trace), "format": self.fmt, "key_blocks": self.key_blocks}


def detect_format(path: Path) -> TraceFormat:
    """mooncake (JSONL with hash_ids and timestamp), azure (its CSV header) or csv (generic)."""
    try:
        with path.open("rb") as fh:
            first = fh.readline().strip()
    except OSError as exc:
        raise ReplayError(f"cannot read trace {path}: {exc}") from None
    if first.startswith(b"{"):
        try:
            obj = orjson.loads(first)
        except orjson.JSONDecodeError:
            raise ReplayError(f"{path}: first line is not JSON") from None
        return "mooncake" if "timestamp" in obj and "input_length" in obj else "csv"
    if first.startswith(b"TIMESTAMP") and b"ContextTokens" in first:
        return "azure"
    return "csv"


def load_source(spec: SourceSpec) -> RequestSet:
    """Generate or read the requests; tile a trace up to `spec.requests`."""
    rng = np.random.default_rng(spec.seed)
    if (spec.workload is None) == (spec.trace is None):
        raise ReplayError("give exactly one of a workload kind or a trace file")
    if spec.workload is not None:
        cv_spec: dict[str, Any] = {}
        if not math.isclose(spec.cv, 1.0):
            cv_spec = {"arrival": "gamma", "cv": spec.cv}
        wl = spec_for(
            spec.workload, keys=spec.keys, requests=spec.requests, rate=spec.rate, **cv_spec
        )
        return generate(wl, rng)
    assert spec.trace is not None
    fmt = detect_format(spec.trace) if spec.fmt == "auto" else spec.fmt
    base = read_trace(
        spec.trace, fmt, rng=rng, key_blocks=spec.key_blocks, limit=spec.limit, keys=spec.keys
    )
    copies = spec.tile if spec.tile is not None else max(1, math.ceil(spec.requests / base.n))
    return base.tiled(copies, rng) if copies > 1 else base


def write_jsonl(requests: RequestSet, path: Path) -> int:
    """Write the generic JSONL form (ts, key, tokens, hash_ids, block_tokens); returns lines."""
    q = requests
    offsets = q.block_offsets.tolist()
    ids = q.block_ids.tolist()
    with path.open("wb") as fh:
        for i in range(q.n):
            row = {
                "ts": round(float(q.times[i]), 6),
                "key": q.keys[int(q.key_index[i])],
                "prompt_tokens": int(q.prompt_tokens[i]),
                "prefix_tokens": int(q.prefix_tokens[i]),
                "output_tokens": int(q.output_tokens[i]),
                "block_tokens": q.block_tokens,
                "hash_ids": ids[offsets[i] : offsets[i + 1]],
            }
            fh.write(orjson.dumps(row) + b"\n")
    return q.n


def write_mooncake(requests: RequestSet, path: Path) -> int:
    """Write Mooncake JSONL (`timestamp` ms, `input_length`, `output_length`, `hash_ids`).

    Mooncake lists one id per 512-token block *including* a partial last block, so a prompt that
    does not end on a block boundary gets one more id, unique to it (`read_mooncake` drops it
    again). Only 512-token blocks can be written; returns the lines written.
    """
    q = requests
    if q.block_tokens != MOONCAKE_BLOCK_TOKENS:
        raise ReplayError(
            f"Mooncake traces use {MOONCAKE_BLOCK_TOKENS}-token blocks; "
            f"this request set has {q.block_tokens}"
        )
    offsets = q.block_offsets.tolist()
    ids = q.block_ids.tolist()
    prompt = q.prompt_tokens.tolist()
    output = q.output_tokens.tolist()
    partial = q.n_blocks  # ids above every full block's id: one per partial last block
    with path.open("wb") as fh:
        for i in range(q.n):
            hash_ids = ids[offsets[i] : offsets[i + 1]]
            if prompt[i] % MOONCAKE_BLOCK_TOKENS:
                hash_ids.append(partial)
                partial += 1
            row = {
                "timestamp": round(float(q.times[i]) * 1000.0),
                "input_length": prompt[i],
                "output_length": output[i],
                "hash_ids": hash_ids,
            }
            fh.write(orjson.dumps(row) + b"\n")
    return q.n
