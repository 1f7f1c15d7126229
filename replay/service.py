"""The service model of one serving replica: what a request costs, with documented defaults.

An engine step (continuous batching with chunked prefill, as vLLM v1 and SGLang run) gives every
decoding sequence one token and, while prompts wait for prefill, spends up to one chunk of prefill
work on the oldest of them (FIFO):

    decode part of a step  = decode_base_s + decode_per_seq_s * n_decoding
                             + decode_per_ctx_token_s * (context tokens of the decoding sequences)
    prefill work of a prompt = prefill_fixed_s + prefill_per_token_s * u
                             + attention_per_pair_s * (u * c + u * u / 2)

with u uncached prompt tokens attending to c cached ones (the quadratic attention term). A step
with prefill pending takes decode part + `chunk_tokens * prefill_per_token_s`; the engine is
simulated as a fluid between events (arrival, prefill done, sequence done), which is exact for
the step rates above and needs no per-token loop. At most `max_running` sequences run; the rest
wait in a FIFO queue. The prefix cache of a replica holds `cache_tokens` tokens of KV in blocks.

Defaults: Llama-3.1-8B in bf16 on one H100-80GB (16 GB of weights read per step at ~3 TB/s; 128 KiB
of K/V per token; ~400 TFLOP/s effective for prefill: ~16 GFLOP per token and ~0.5 MFLOP per
query-key pair over 32 layers). The replica's knee (where p99 TTFT leaves a 2 s SLO) is then
~6-12 requests/s for 3k-token multi-turn prompts and 100-token answers, depending on the hit
rate - the paper's 8B ablation ran Flat-LB at 240 QPS on 30 H100s, 8 QPS each.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from cacheroute.replay.errors import ReplayError
from cacheroute.replay.requestset import FloatArray

__all__ = ["ServiceModel"]


@dataclass(frozen=True, slots=True)
class ServiceModel:
    """Per-replica cost model and limits (seconds, tokens)."""

    decode_base_s: float = 0.006
    """Fixed part of a decode step: reading the weights (16 GB at ~3 TB/s) plus launch overhead."""
    decode_per_seq_s: float = 5e-5
    """Per decoding sequence per step (sampling, per-sequence compute)."""
    decode_per_ctx_token_s: float = 4e-8
    """Per context token of every decoding sequence per step (128 KiB of K/V read at ~3.2 TB/s)."""
    prefill_fixed_s: float = 0.002
    """Per prompt (scheduling, the partial last block)."""
    prefill_per_token_s: float = 4e-5
    """Per uncached prompt token: ~25k tokens/s of prefill."""
    attention_per_pair_s: float = 1.3e-9
    """Per (new token, earlier token) attention pair: the quadratic term of long prompts."""
    chunk_tokens: int = 2048
    """Prefill token budget per step (vLLM's max_num_batched_tokens with chunked prefill)."""
    max_running: int = 64
    """Concurrency limit: sequences in the running batch; later arrivals queue (FIFO)."""
    cache_tokens: int = 262_144
    """Prefix-cache capacity per replica in tokens (~32 GiB of KV at 128 KiB per token)."""

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if not (math.isfinite(value) and value >= 0):
                raise ReplayError(f"service model: {name} must be finite and >= 0, got {value!r}")
        if self.max_running < 1 or self.chunk_tokens < 1:
            raise ReplayError("service model: max_running and chunk_tokens must be >= 1")
        if self.decode_base_s <= 0 or self.prefill_per_token_s <= 0:
            raise ReplayError("service model: decode_base_s and prefill_per_token_s must be > 0")

    @property
    def chunk_s(self) -> float:
        """Prefill seconds one step spends while prompts wait."""
        return self.chunk_tokens * self.prefill_per_token_s

    def prefill_seconds(self, uncached: FloatArray, cached: FloatArray) -> FloatArray:
        """Prefill work of prompts with `uncached` new tokens after `cached` ones (vectorised)."""
        u = np.asarray(uncached, dtype=np.float64)
        c = np.asarray(cached, dtype=np.float64)
        out: FloatArray = (
            self.prefill_fixed_s
            + self.prefill_per_token_s * u
            + self.attention_per_pair_s * (u * c + 0.5 * u * u)
        )
        return out

    def to_dict(self) -> dict[str, Any]:
        """Plain dict for reports."""
        return asdict(self)
