"""Knobs of the engine stand-in: its name, model, cache size and timing model."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["EngineConfig"]


@dataclass(frozen=True)
class EngineConfig:
    """One simulated replica.

    Timing: a request waits for one of `max_running` running slots (queueing), then its prefill
    takes `uncached prompt tokens x prefill_us_per_token`, which is the time to its first token;
    each further output token follows after `decode_ms`. The defaults are in the range of an 8B
    model on one H100 (the replay simulator's defaults). `zero_delay` skips every sleep, for
    benchmarks of what sits in front of the engine.
    """

    name: str = "engine"
    model: str = "cacheroute-sim"
    host: str = "127.0.0.1"
    port: int = 8000
    cache_tokens: int = 262_144
    block_tokens: int = 16
    prefill_us_per_token: float = 40.0
    decode_ms: float = 8.0
    max_running: int = 64
    default_max_tokens: int = 16
    max_output_tokens: int = 4096
    zero_delay: bool = False

    def prefill_s(self, uncached_tokens: int) -> float:
        """Seconds of prefill for `uncached_tokens` (0 in zero-delay mode)."""
        return 0.0 if self.zero_delay else uncached_tokens * self.prefill_us_per_token / 1e6

    def decode_s(self) -> float:
        """Seconds between two output tokens (0 in zero-delay mode)."""
        return 0.0 if self.zero_delay else self.decode_ms / 1000.0
