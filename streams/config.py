"""Configuration of the windowed rate aggregation (a frozen dataclass, passed in)."""

from __future__ import annotations

from dataclasses import dataclass

from cacheroute.schemas import MAX_PROMPT_TOKENS

__all__ = ["StreamConfig"]


@dataclass(frozen=True)
class StreamConfig:
    """Windowing and validation knobs of the streams agent.

    Windows are tumbling, `window_ms` long (the planner's control interval), aligned to the epoch:
    window `w` covers event times `[w, w + window_ms)`. A window closes — its `KeyRate` records are
    emitted and its state dropped — once the partition's watermark (newest trusted gateway time:
    see `max_clock_ahead_ms`) reaches `w + window_ms + grace_ms`; events for a window that has
    reached that point are late: counted, not aggregated (the agent dead-letters them). `grace_ms`
    must cover gateway clock skew, emitter linger and transport delay.
    """

    window_ms: int = 60_000
    grace_ms: int = 5_000
    reorder_ms: int = 1_000
    """How far behind the newest event an event may arrive and still enter the gap statistics."""
    buckets: int = 64
    """Table entries per window per partition; keys hash into buckets (see state.py)."""
    max_key_bytes: int = 1024
    max_future_ms: int = 60_000
    """An event newer than its batch's seal time plus this is malformed (clock or encoding bug)."""
    max_past_ms: int = 86_400_000
    """An event older than its batch's seal time minus this is malformed, not merely late."""
    max_clock_ahead_ms: int = 5_000
    """How far a record's `created_ms`, or any of its event times, may be ahead of the clock the
    agent trusts for it (its Kafka record timestamp; see streams/app.py) before it is
    future-dated: dead-lettered, and never allowed to move the watermark. One gateway clock ahead
    would otherwise push the partition's watermark ahead and make every other gateway's events
    late. It must cover the skew between gateway and broker clocks; keep it at most `grace_ms`,
    or a gateway that is ahead by less than the margin can still make punctual events late."""

    max_prompt_tokens: int = MAX_PROMPT_TOKENS
    """An event whose prompt_tokens (or prefix or cached tokens) exceed this is malformed: the
    planner's own ceiling on a key's mean prompt (both default to `schemas.MAX_PROMPT_TOKENS`),
    applied per event. The planner plans on work, a key's mean prompt times its rate,
    and its ceiling sees only a key's mean: one event claiming 2 billion tokens (Avro's `int`
    allows it) among a thousand ordinary requests of its key passes it, and would make that key
    most of the cluster's work for a window (a check with `planner.work.work_rates`: a key at 1,000
    requests a minute among 10k Zipf keys at 1,000/s, mean 2.0M tokens: 93%): every other
    key's share shrinks with it, and keys that need several replicas get one."""

    def __post_init__(self) -> None:
        if self.window_ms <= 0 or self.grace_ms < 0 or self.reorder_ms < 0 or self.buckets <= 0:
            raise ValueError(
                "window_ms and buckets must be positive; grace_ms and reorder_ms non-negative"
            )
        if self.reorder_ms > self.grace_ms:
            raise ValueError("reorder_ms must not exceed grace_ms")
        if self.max_clock_ahead_ms < 0:
            raise ValueError("max_clock_ahead_ms must be non-negative")
        if self.max_prompt_tokens <= 0:
            raise ValueError("max_prompt_tokens must be positive")
