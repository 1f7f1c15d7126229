"""Where a replay comes from: a synthetic workload or a trace file, scaled to the size asked for.

Shared by `cacheroute evaluate`, `workload generate` and `replay`, so all three read a source the
same way. Traces smaller than `min_requests` are tiled (copies with offset ids, random shifts) to
reach it; the RequestSet's notes record what was done. `write_jsonl` and `write_mooncake` write a
RequestSet back out as a generic or a Mooncake trace.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np
import orjson

from cacheroute.replay.diagnostic import diagnose, uncached_work
from cacheroute.replay.errors import ReplayError
from cacheroute.replay.requestset import RequestSet
from cacheroute.replay.service import ServiceModel
from cacheroute.replay.tracefiles import READ_ERRORS, open_trace
from cacheroute.replay.traces import (
    BLOCK_KEY_FORMATS,
    MOONCAKE_BLOCK_TOKENS,
    SESSION_KEYS,
    TraceFormat,
    read_trace,
    require_arrivals,
    require_one_clock,
)
from cacheroute.replay.workloads import WorkloadKind, generate, spec_for

__all__ = [
    "KEY_BLOCKS_CANDIDATES",
    "KeyBlocks",
    "SourceSpec",
    "choose_key_blocks",
    "detect_format",
    "load_source",
    "resolve_key_blocks",
    "write_jsonl",
    "write_mooncake",
]

AutoFormat = TraceFormat | Literal["auto"]
KeyBlocks = int | Literal["auto"]
DEFAULT_KEY_BLOCKS = 2
KEY_BLOCKS_CANDIDATES = (SESSION_KEYS, 1, 2, 3, 4, 5, 6)
"""What `--key-blocks auto` tries (0: session keys, `traces.session_keys`). Not the default: on the test Mooncake trace (20,000 requests
tiled) each candidate costs a read and a diagnostic, ~0.9 s, so ~5 s in all (the bar was 2 s)."""
AUTO_TOLERANCE = 0.01
"""Gains within this of the best count as equal, and the fewest blocks among them wins: keys
that group requests alike differ only in their hashed homes, which is noise, not benefit."""
AUTO_BUSY = 0.8
"""`auto` diagnoses each candidate at the load that keeps R replicas this busy with no cache hits:
near the loads an evaluation compares capacities at, where eviction decides what reuse is kept."""


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
    key_blocks: KeyBlocks = 2
    """Mooncake key: the first this many block ids, or `auto` (see `choose_key_blocks`)."""
    tile: int | None = None
    """Trace copies; None = as many as `requests` needs."""
    limit: int | None = None
    key_blocks_gains: tuple[tuple[int, float], ...] = ()
    """With `auto`, once chosen (`resolve_key_blocks`): each candidate and its predicted gain."""
    recorded: RequestSet | None = None
    """Requests read from a recorded topic (`replay.recorded`): evaluated as a trace is (tiled
    to `requests`); `recorded_from` says where they came from."""
    recorded_from: str = ""

    @property
    def key_blocks_chosen(self) -> int:
        """The key_blocks the reader uses: the given number, auto's choice, or the default 2."""
        if isinstance(self.key_blocks, int):
            return self.key_blocks
        if self.key_blocks_gains:
            best = max(g for _, g in self.key_blocks_gains)
            return min(k for k, g in self.key_blocks_gains if g >= best - AUTO_TOLERANCE)
        return DEFAULT_KEY_BLOCKS

    def describe(self) -> dict[str, Any]:
        """For reports."""
        if self.workload is not None:
            return {"kind": self.workload, "keys": self.keys, "seed": self.seed, "cv": self.cv}
        if self.recorded is not None:
            return {"recorded": self.recorded_from, "requests_recorded": self.recorded.n}
        out: dict[str, Any] = {
            "trace": str(self.trace),
            "format": self.fmt,
            "key_blocks": self.key_blocks,
            "key_blocks_chosen": self.key_blocks_chosen,
        }
        if self.key_blocks_gains:
            out["key_blocks_gains"] = {str(k): g for k, g in self.key_blocks_gains}
        return out


def detect_format(path: Path) -> TraceFormat:
    """mooncake (JSONL with hash_ids and timestamp), bailian (those and chat ids), azure (its CSV
    header) or csv (generic)."""
    try:
        with open_trace(path, text=False) as fh:
            first = fh.readline().strip()
    except READ_ERRORS as exc:
        raise ReplayError(f"cannot read trace {path}: {exc}") from None
    if first.startswith(b"{"):
        try:
            obj = orjson.loads(first)
        except orjson.JSONDecodeError:
            raise ReplayError(f"{path}: first line is not JSON") from None
        if "timestamp" not in obj or "input_length" not in obj:
            return "csv"
        return "bailian" if "chat_id" in obj or "parent_chat_id" in obj else "mooncake"
    if first.startswith(b"TIMESTAMP") and b"ContextTokens" in first:
        return "azure"
    return "csv"


def load_source(spec: SourceSpec) -> RequestSet:
    """Generate or read the requests; tile a trace up to `spec.requests`."""
    rng = np.random.default_rng(spec.seed)
    if (spec.workload is not None) + (spec.trace is not None) + (spec.recorded is not None) != 1:
        raise ReplayError("give exactly one of a workload kind, a trace file or recorded requests")
    if spec.recorded is not None:
        base = spec.recorded
        require_arrivals(base, "the recorded requests")
        require_one_clock(base, "the recorded requests")
        return _tiled(base, spec, rng, "the recorded requests")
    if spec.workload is not None:
        cv_spec: dict[str, Any] = {}
        if not math.isclose(spec.cv, 1.0):
            cv_spec = {"arrival": "gamma", "cv": spec.cv}
        wl = spec_for(
            spec.workload, keys=spec.keys, requests=spec.requests, rate=spec.rate, **cv_spec
        )
        return generate(wl, rng)
    trace = spec.trace
    assert trace is not None
    fmt = detect_format(trace) if spec.fmt == "auto" else spec.fmt
    if spec.key_blocks == "auto" and not spec.key_blocks_gains and fmt in BLOCK_KEY_FORMATS:
        spec = resolve_key_blocks(spec)  # defaults (R = 30); the CLI resolves with its own R
    base = read_trace(
        trace,
        fmt,
        rng=rng,
        key_blocks=spec.key_blocks_chosen,
        limit=spec.limit,
        keys=spec.keys,
    )
    if spec.key_blocks_gains and fmt in BLOCK_KEY_FORMATS:
        gains = ", ".join(f"{_kb_name(k)}: {g:.3f}x" for k, g in spec.key_blocks_gains)
        chosen = _kb_name(spec.key_blocks_chosen)
        note = f"key_blocks auto: chose {chosen} (predicted gain by key_blocks {gains})"
        base = replace(base, notes=(*base.notes, note))
    return _tiled(base, spec, rng, str(trace))


def _tiled(base: RequestSet, spec: SourceSpec, rng: np.random.Generator, what: str) -> RequestSet:
    """`base` tiled up to `spec.requests` (or `spec.tile` copies), or cut to its first
    `spec.requests` when it is longer.

    Copies keep the trace's own arrival process, shifted; a single request has none, so its
    copies would arrive at made-up times (uniform over an invented second) and the report would
    describe that, not the user's traffic (it said `deploy` for one 7k-token request). A longer
    trace was replayed whole: `evaluate --quick` ("20,000 requests") on a million-request trace
    simulated 24M requests for two policies (4 min here), and with every policy, three seeds and
    16 gateways it would run for hours. Its first requests keep its arrival process and its
    conversations whole, but for the last few at the cut."""
    copies = spec.tile if spec.tile is not None else max(1, math.ceil(spec.requests / base.n))
    if copies <= 1:
        if spec.tile is None and base.n > spec.requests:
            cut = base.head(spec.requests)
            note = f"first {spec.requests:,} of the {base.n:,} requests (--requests for more)"
            return replace(cut, notes=(*base.notes, note))
        return base
    if base.n == 1:
        raise ReplayError(
            f"{what}: one request, so there is no arrival process to replay; tiling it "
            f"{copies:,}x would invent one. Give at least two requests at different times "
            "(or --tile 1 to replay it as it is)"
        )
    return base.tiled(copies, rng)


def _kb_name(key_blocks: int) -> str:
    return "session" if key_blocks == SESSION_KEYS else str(key_blocks)


def choose_key_blocks(
    spec: SourceSpec,
    *,
    destinations: int = 30,
    service: ServiceModel | None = None,
    candidates: tuple[int, ...] = KEY_BLOCKS_CANDIDATES,
) -> tuple[tuple[int, float], ...]:
    """Each candidate key_blocks and the diagnostic's predicted gain of the deployed policy with it.

    The key decides what a plan can do: too few blocks and a few shared system prompts become
    giant keys the planner must spread over many replicas; too many and one conversation splits
    into keys whose shared blocks land on different homes. The diagnostic models exactly that
    (admission with fair-share sizing, cold homes), so the best key is the one it expects most
    from. Each candidate is read and tiled as `load_source` would, time-compressed to `AUTO_BUSY`
    (the knee, and so q_cap, is not known yet: fair-share sizing at this load stands in for it).
    """
    svc = service or ServiceModel()
    out: list[tuple[int, float]] = []
    for kb in candidates:
        q = load_source(replace(spec, key_blocks=kb, key_blocks_gains=()))
        load = AUTO_BUSY * destinations / max(uncached_work(q, svc), 1e-9)
        q = q.compressed(load / q.rate)
        d = diagnose(q, destinations, svc, q_cap=q.rate / destinations)
        out.append((kb, d.predicted_gain))
    return tuple(out)


def resolve_key_blocks(
    spec: SourceSpec, *, destinations: int = 30, service: ServiceModel | None = None
) -> SourceSpec:
    """`spec` with `auto` key_blocks chosen (`choose_key_blocks`); other specs as they are.

    Only block-hash traces (Mooncake, Bailian) have block-id keys: for anything else auto stays
    unresolved (and unused).
    """
    if spec.key_blocks != "auto" or spec.key_blocks_gains or spec.trace is None:
        return spec
    fmt = detect_format(spec.trace) if spec.fmt == "auto" else spec.fmt
    if fmt not in BLOCK_KEY_FORMATS:
        return spec
    gains = choose_key_blocks(spec, destinations=destinations, service=service)
    return replace(spec, key_blocks_gains=gains)


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
