"""`RequestSet`: a replayable stream of requests, column-wise, in arrival order.

Every source (synthetic workloads, Mooncake/Azure/generic traces) becomes one of these; the
simulator, the diagnostic and the live replay read nothing else. A request's prompt is described by
its *blocks*: block j covers prompt tokens [j*B, (j+1)*B) (B = `block_tokens`), and equal block ids
mean identical content *including everything before it* (as vLLM and Mooncake hash blocks), so a
prefix-cache hit is the longest run of leading block ids a replica already holds. Only full blocks
are listed: the partial last block is never cached, as in vLLM.

Block ids are dense (0..n_blocks-1, renumbered on construction), so the simulator's cache can key
on `block * R + destination` without overflow. Scaling for cluster-size load is explicit and
recorded in `notes`: `compressed(f)` divides timestamps by f (f x the rate, same requests);
`tiled(n, rng)` overlays n copies with disjoint key and block ids, each shifted by a random offset
in time (n x the rate, same per-key rates).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from numpy.typing import NDArray

from cacheroute.planner.workload import gini
from cacheroute.replay.errors import ReplayError

__all__ = ["FloatArray", "IntArray", "RequestSet", "make_request_set"]

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]


@dataclass(frozen=True, slots=True, eq=False)
class RequestSet:
    """Requests sorted by arrival time; column i of every array belongs to request i."""

    times: FloatArray  # (n,) seconds from the start, non-decreasing
    key_index: IntArray  # (n,) index into `keys`
    keys: tuple[str, ...]  # routing keys (distinct)
    prompt_tokens: IntArray  # (n,)
    output_tokens: IntArray  # (n,) >= 1
    prefix_tokens: IntArray  # (n,) reusable prefix the source declares (<= prompt_tokens)
    block_offsets: IntArray  # (n + 1,) CSR offsets into block_ids
    block_ids: IntArray  # (sum,) dense block ids of each request's full prompt blocks
    block_tokens: int
    source: str
    notes: tuple[str, ...] = ()
    conversations: tuple[str, ...] | None = None
    """Per request, its conversation as the source names it (a trace with conversation ids:
    Bailian's `parent_chat_id` chains); None: the source does not say (`traces.session_hints`
    then finds conversations from the blocks)."""

    def __post_init__(self) -> None:
        for arr in (
            self.times,
            self.key_index,
            self.prompt_tokens,
            self.output_tokens,
            self.prefix_tokens,
            self.block_offsets,
            self.block_ids,
        ):
            arr.setflags(write=False)
        if self.conversations is not None and len(self.conversations) != self.times.shape[0]:
            raise ReplayError(
                f"{len(self.conversations)} conversations for {self.times.shape[0]} requests"
            )

    # ------------------------------------------------------------------------------- views
    @property
    def n(self) -> int:
        """Number of requests."""
        return int(self.times.shape[0])

    @property
    def n_blocks(self) -> int:
        """Distinct block ids (ids are 0..n_blocks-1)."""
        return int(self.block_ids.max()) + 1 if self.block_ids.size else 0

    @property
    def duration(self) -> float:
        """Seconds from the first to the last arrival."""
        return float(self.times[-1] - self.times[0]) if self.n > 1 else 0.0

    @property
    def rate(self) -> float:
        """Mean offered load in requests/s over the replay."""
        return (self.n - 1) / self.duration if self.duration > 0 else 0.0

    def blocks_of(self, i: int) -> IntArray:
        """Block ids of request i."""
        return self.block_ids[self.block_offsets[i] : self.block_offsets[i + 1]]

    def key_counts(self) -> IntArray:
        """Requests per key (indexed like `keys`)."""
        return np.bincount(self.key_index, minlength=len(self.keys)).astype(np.int64)

    def key_rates(self) -> FloatArray:
        """Oracle per-key rates (requests/s) over the whole replay."""
        duration = self.duration if self.duration > 0 else 1.0
        out: FloatArray = self.key_counts() / duration
        return out

    def stats(self) -> dict[str, Any]:
        """Shape of the stream: size, load, skew, token counts, scaling applied."""
        counts = self.key_counts().astype(np.float64)
        active = counts[counts > 0]
        share = np.sort(active)[::-1] / max(1.0, float(active.sum()))
        top = max(1, math.ceil(0.04 * active.size))
        prompt = float(self.prompt_tokens.sum())
        return {
            "source": self.source,
            "requests": self.n,
            "keys": int(active.size),
            "duration_s": self.duration,
            "rate_qps": self.rate,
            "gini": gini(active),
            "top4_share": float(share[:top].sum()),
            "max_key_share": float(share[0]) if share.size else 0.0,
            "mean_prompt_tokens": prompt / max(1, self.n),
            "mean_output_tokens": float(self.output_tokens.mean()) if self.n else 0.0,
            "declared_prefix_share": float(self.prefix_tokens.sum()) / max(1.0, prompt),
            "block_tokens": self.block_tokens,
            "notes": list(self.notes),
        }

    # ---------------------------------------------------------------------------- scaling
    def compressed(self, factor: float) -> RequestSet:
        """Timestamps divided by `factor`: the same requests at `factor` times the load."""
        if not (math.isfinite(factor) and factor > 0):
            raise ReplayError(f"time compression must be > 0, got {factor!r}")
        start = float(self.times[0]) if self.n else 0.0
        times = start + (self.times - start) / factor
        return replace(self, times=times, notes=(*self.notes, f"time-compressed x{factor:.4g}"))

    def tiled(self, copies: int, rng: np.random.Generator) -> RequestSet:
        """`copies` overlaid copies with disjoint keys and blocks, each shifted randomly in time.

        Copy c gets keys `"<key>#c"` and block ids offset by c * n_blocks; its timestamps are
        rotated by a uniform offset modulo the duration, so copies do not arrive in lockstep.
        """
        if copies < 1:
            raise ReplayError(f"tile count must be >= 1, got {copies}")
        if copies == 1:
            return self
        n, nk, nb = self.n, len(self.keys), self.n_blocks
        span = self.duration if self.duration > 0 else 1.0
        start = float(self.times[0]) if n else 0.0
        shifts = np.concatenate([[0.0], rng.uniform(0.0, span, copies - 1)])
        times = np.concatenate(
            [start + np.mod(self.times - start + s, span + span / max(1, n)) for s in shifts]
        )
        keys = list(self.keys) + [f"{k}#{c}" for c in range(1, copies) for k in self.keys]
        sizes = np.diff(self.block_offsets)
        offsets = np.zeros(n * copies + 1, dtype=np.int64)
        np.cumsum(np.tile(sizes, copies), out=offsets[1:])
        blocks = np.concatenate([self.block_ids + c * nb for c in range(copies)])
        return _sorted(
            times=times,
            key_index=np.concatenate([self.key_index + c * nk for c in range(copies)]),
            keys=tuple(keys),
            prompt_tokens=np.tile(self.prompt_tokens, copies),
            output_tokens=np.tile(self.output_tokens, copies),
            prefix_tokens=np.tile(self.prefix_tokens, copies),
            block_offsets=offsets,
            block_ids=blocks,
            block_tokens=self.block_tokens,
            source=self.source,
            notes=(*self.notes, f"tiled x{copies} (ids offset, random time shifts)"),
            conversations=(
                None
                if self.conversations is None
                else (
                    *self.conversations,
                    *(f"{s}#{c}" for c in range(1, copies) for s in self.conversations),
                )
            ),
        )

    def subset(self, mask: NDArray[np.bool_], note: str) -> RequestSet:
        """The requests where `mask` is True, in order (keys and block ids kept as they are);
        `note` says why, in `notes`."""
        idx = np.flatnonzero(mask)
        sizes = np.diff(self.block_offsets)[idx]
        offsets = np.zeros(idx.size + 1, dtype=np.int64)
        np.cumsum(sizes, out=offsets[1:])
        gather = np.repeat(self.block_offsets[:-1][idx] - offsets[:-1], sizes) + np.arange(
            int(offsets[-1])
        )
        return replace(
            self,
            times=self.times[idx],
            key_index=self.key_index[idx],
            prompt_tokens=self.prompt_tokens[idx],
            output_tokens=self.output_tokens[idx],
            prefix_tokens=self.prefix_tokens[idx],
            block_offsets=offsets,
            block_ids=self.block_ids[gather],
            notes=(*self.notes, note),
            conversations=(
                None
                if self.conversations is None
                else tuple(self.conversations[i] for i in idx.tolist())
            ),
        )

    def head(self, count: int) -> RequestSet:
        """The first `count` requests (keys and block ids kept as they are)."""
        count = max(0, min(count, self.n))
        end = int(self.block_offsets[count])
        return replace(
            self,
            times=self.times[:count].copy(),
            key_index=self.key_index[:count].copy(),
            prompt_tokens=self.prompt_tokens[:count].copy(),
            output_tokens=self.output_tokens[:count].copy(),
            prefix_tokens=self.prefix_tokens[:count].copy(),
            block_offsets=self.block_offsets[: count + 1].copy(),
            block_ids=self.block_ids[:end].copy(),
            notes=(*self.notes, f"first {count} requests"),
            conversations=None if self.conversations is None else self.conversations[:count],
        )


def make_request_set(
    *,
    times: Sequence[float] | FloatArray,
    keys: Sequence[str],
    prompt_tokens: Sequence[int] | IntArray,
    output_tokens: Sequence[int] | IntArray,
    block_lists: Sequence[Sequence[int]] | None = None,
    block_offsets: IntArray | None = None,
    block_ids: IntArray | None = None,
    prefix_tokens: Sequence[int] | IntArray | None = None,
    block_tokens: int,
    source: str,
    notes: tuple[str, ...] = (),
    conversations: Sequence[str] | None = None,
) -> RequestSet:
    """Validate raw columns (one routing key string per request), sort by time, renumber blocks.

    Blocks come either as one list per request or as CSR (`block_offsets`, `block_ids`). Block ids
    may be any integers; they are renumbered densely. Output tokens below 1 become 1 (a request
    always produces its first token). `conversations`: one per request, when the source names
    them (`RequestSet.conversations`).
    """
    t = np.asarray(times, dtype=np.float64)
    n = t.shape[0]
    if n == 0:
        raise ReplayError("no requests: a replay needs at least one")
    if len(keys) != n:
        raise ReplayError(f"{len(keys)} keys for {n} requests")
    if not np.all(np.isfinite(t)):
        raise ReplayError("timestamps must be finite")
    if block_tokens < 1:
        raise ReplayError(f"block_tokens must be >= 1, got {block_tokens}")
    prompt = np.asarray(prompt_tokens, dtype=np.int64)
    output = np.maximum(np.asarray(output_tokens, dtype=np.int64), 1)
    if prompt.shape != (n,) or output.shape != (n,):
        raise ReplayError("prompt_tokens and output_tokens need one value per request")
    if np.any(prompt < 1):
        raise ReplayError(f"prompt_tokens must be >= 1 (request {int(np.argmin(prompt))})")
    if block_lists is not None:
        sizes = np.fromiter((len(b) for b in block_lists), dtype=np.int64, count=n)
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(sizes, out=offsets[1:])
        flat = np.fromiter(
            (x for b in block_lists for x in b), dtype=np.int64, count=int(offsets[-1])
        )
    elif block_offsets is not None and block_ids is not None:
        offsets, flat = np.asarray(block_offsets, np.int64), np.asarray(block_ids, np.int64)
        if offsets.shape != (n + 1,) or int(offsets[-1]) != flat.shape[0]:
            raise ReplayError("block_offsets must have n + 1 entries ending at len(block_ids)")
    else:
        raise ReplayError("give block_lists or block_offsets with block_ids")
    if np.any(np.diff(offsets) * block_tokens > prompt):
        raise ReplayError("a request lists more full blocks than its prompt has tokens")
    prefix = (
        np.zeros(n, dtype=np.int64)
        if prefix_tokens is None
        else np.minimum(np.asarray(prefix_tokens, dtype=np.int64), prompt)
    )
    uniq, key_index = np.unique(np.asarray(keys, dtype=object), return_inverse=True)
    if any(not isinstance(k, str) or not k for k in uniq):
        raise ReplayError("routing keys must be non-empty strings")
    return _sorted(
        times=t,
        key_index=key_index.astype(np.int64),
        keys=tuple(str(k) for k in uniq),
        prompt_tokens=prompt,
        output_tokens=output,
        prefix_tokens=np.maximum(prefix, 0),
        block_offsets=offsets,
        block_ids=flat,
        block_tokens=block_tokens,
        source=source,
        notes=notes,
        conversations=None if conversations is None else tuple(conversations),
    )


def _sorted(
    *,
    times: FloatArray,
    key_index: IntArray,
    keys: tuple[str, ...],
    prompt_tokens: IntArray,
    output_tokens: IntArray,
    prefix_tokens: IntArray,
    block_offsets: IntArray,
    block_ids: IntArray,
    block_tokens: int,
    source: str,
    notes: tuple[str, ...],
    conversations: tuple[str, ...] | None = None,
) -> RequestSet:
    """Stable sort by time, permute the CSR blocks along, renumber block ids densely."""
    order = np.argsort(times, kind="stable")
    if conversations is not None and len(conversations) != order.size:
        raise ReplayError(f"{len(conversations)} conversations for {order.size} requests")
    sizes = np.diff(block_offsets)[order]
    offsets = np.zeros(order.size + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    if offsets[-1]:
        starts = block_offsets[:-1][order]
        gather = np.repeat(starts - offsets[:-1], sizes) + np.arange(int(offsets[-1]))
        blocks = block_ids[gather]
        _, dense = np.unique(blocks, return_inverse=True)
        blocks = dense.astype(np.int64)
    else:
        blocks = np.zeros(0, dtype=np.int64)
    return RequestSet(
        times=np.ascontiguousarray(times[order], dtype=np.float64),
        key_index=np.ascontiguousarray(key_index[order]),
        keys=keys,
        prompt_tokens=np.ascontiguousarray(prompt_tokens[order]),
        output_tokens=np.ascontiguousarray(output_tokens[order]),
        prefix_tokens=np.ascontiguousarray(prefix_tokens[order]),
        block_offsets=offsets,
        block_ids=blocks,
        block_tokens=block_tokens,
        source=source,
        notes=notes,
        conversations=(
            None if conversations is None else tuple(conversations[i] for i in order.tolist())
        ),
    )
