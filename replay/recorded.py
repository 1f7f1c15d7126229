"""Traffic as gateways recorded it: `requests` topic records -> a `RequestSet` (pure, no Kafka).

`cacheroute evaluate --topic requests` evaluates what the gateways actually saw, exactly as it
evaluates a trace file: the records (read by `replay.live.read_recorded`) are collected here, turned
into the generic trace form and evaluated like any trace. Why: a plan that is about to go live
should be judged on the traffic it will meet, and the same records carry what the engines served
(`cached_tokens` from each answer's usage), so the report can put the served hit rate next to the
simulated one of the same policy - the simulator's calibration.

What each request becomes:
- time: the gateway's event time, in seconds from the first recorded event;
- key: the routing key the gateway used; prompt: the tokens the gateway emitted (the backend's
  `usage.prompt_tokens` when it answered with usage);
- blocks: the prefix block hashes the gateway sent (`cacheroute gateway --hash-blocks`: chained
  hashes of `block_tokens`-token blocks, the trace readers' block identity), cut to the prompt's
  full blocks; a request recorded without hashes has no cacheable blocks (said in the notes);
- declared prefix: its leading blocks already seen earlier in the recording (as the Mooncake
  reader declares it), or what the gateway declared when it did;
- output tokens: not recorded by gateways, so one value for every request (`output_tokens`).
Pre-aggregated `RequestSummary` records (an emitter under pressure) carry no per-request data:
their requests are counted and named in the notes, never invented.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cacheroute.replay.errors import ReplayError
from cacheroute.replay.requestset import RequestSet, make_request_set
from cacheroute.schemas import RequestBatch, RequestEvent, RequestSummary

__all__ = ["DEFAULT_OUTPUT_TOKENS", "RecordedTraffic", "ServedStats"]

DEFAULT_OUTPUT_TOKENS = 128
"""Output length of a recorded request (gateways do not record it); the generic trace default."""


@dataclass(frozen=True, slots=True)
class ServedStats:
    """What the engines served, as the gateways' events report it."""

    requests: int
    reported: int
    """Requests whose answer reported cached tokens (vLLM, SGLang and `cacheroute engine` do)."""
    hit_rate: float | None
    """Cached tokens / prompt tokens over the requests that reported (None: none did)."""
    gateways: tuple[str, ...]
    destinations: tuple[str, ...]


@dataclass
class RecordedTraffic:
    """Requests collected from recorded records, column by column, in the order read."""

    from_ms: int | None = None
    to_ms: int | None = None
    """Only events with from_ms <= event time < to_ms are kept (None: no bound)."""
    keys: list[str] = field(default_factory=list)
    times_ms: list[int] = field(default_factory=list)
    prompt: list[int] = field(default_factory=list)
    prefix: list[int] = field(default_factory=list)
    cached: list[int] = field(default_factory=list)
    destinations: list[str] = field(default_factory=list)
    gateways: list[str] = field(default_factory=list)
    hashes: list[list[int]] = field(default_factory=list)
    summarised: int = 0
    """Requests that arrived only as pre-aggregated summaries (not replayable one by one)."""
    outside: int = 0
    """Events outside [from_ms, to_ms)."""
    other_records: int = 0
    """Records of another type (a record that is not a request)."""
    undecodable: int = 0
    """Records that are not CacheRoute records at all (the streams agent dead-letters them)."""
    malformed: int = 0
    """Events the streams agent dead-letters too: an empty key, a negative prompt, prefix or
    cached tokens below -1. Left out and counted: one such event used to stop the evaluation
    (an empty key) or be replayed as a 1-token prompt (a negative one)."""

    def __len__(self) -> int:
        return len(self.keys)

    def _keep(self, t: int) -> bool:
        if (self.from_ms is not None and t < self.from_ms) or (
            self.to_ms is not None and t >= self.to_ms
        ):
            self.outside += 1
            return False
        return True

    def add(self, record: object) -> None:
        """Take one decoded record of the `requests` topic (any type; non-requests are counted)."""
        if isinstance(record, RequestBatch):
            self._add_batch(record)
        elif isinstance(record, RequestEvent):
            if self._keep(record.event_time_ms):
                self._append(
                    record.key,
                    record.event_time_ms,
                    record.prompt_tokens,
                    -1 if record.prefix_tokens is None else record.prefix_tokens,
                    -1 if record.cached_tokens is None else record.cached_tokens,
                    record.destination or "",
                    record.gateway_id,
                    list(record.prefix_block_hashes or ()),
                )
        elif isinstance(record, RequestSummary):
            for first, count in zip(record.first_ms, record.counts, strict=False):
                if self._keep(first):
                    self.summarised += count
        else:
            self.other_records += 1

    def _add_batch(self, b: RequestBatch) -> None:
        n = len(b.keys)
        for i in range(n):
            t = b.event_time_ms[i]
            if not self._keep(t):
                continue
            self._append(
                b.keys[i],
                t,
                b.prompt_tokens[i],
                -1 if b.prefix_tokens is None else b.prefix_tokens[i],
                -1 if b.cached_tokens is None else b.cached_tokens[i],
                "" if b.destinations is None else b.destinations[i],
                b.gateway_id,
                [] if b.prefix_block_hashes is None else list(b.prefix_block_hashes[i]),
            )

    def _append(  # noqa: PLR0917 - one value per column
        self,
        key: str,
        t: int,
        prompt: int,
        prefix: int,
        cached: int,
        destination: str,
        gateway: str,
        hashes: list[int],
    ) -> None:
        if not key or prompt < 0 or prefix < -1 or cached < -1:
            self.malformed += 1
            return
        self.keys.append(key)
        self.times_ms.append(t)
        self.prompt.append(prompt)
        self.prefix.append(prefix)
        self.cached.append(cached)
        self.destinations.append(destination)
        self.gateways.append(gateway)
        self.hashes.append(hashes)

    # ------------------------------------------------------------------------------- outputs
    def served(self) -> ServedStats:
        """The hit rate the engines reported (cached / prompt tokens where usage reported it)."""
        hit = total = reported = 0
        for p, c in zip(self.prompt, self.cached, strict=True):
            if c >= 0:
                reported += 1
                hit += min(c, p)
                total += p
        return ServedStats(
            requests=len(self.keys),
            reported=reported,
            hit_rate=hit / total if total > 0 else None,
            gateways=tuple(sorted(set(self.gateways))),
            destinations=tuple(sorted(d for d in set(self.destinations) if d)),
        )

    def request_set(
        self,
        *,
        block_tokens: int,
        output_tokens: int = DEFAULT_OUTPUT_TOKENS,
        source: str = "recorded requests",
    ) -> RequestSet:
        """The recorded requests as a replayable `RequestSet` (module docstring: what each is)."""
        n = len(self.keys)
        if n == 0:
            bad = f" ({self.malformed} malformed)" if self.malformed else ""
            raise ReplayError(f"{source}: no request events in the range read{bad}")
        if block_tokens < 1:
            raise ReplayError(f"block_tokens must be >= 1, got {block_tokens}")
        order = sorted(range(n), key=self.times_ms.__getitem__)
        t0 = self.times_ms[order[0]]
        seen: set[int] = set()
        times: list[float] = []
        keys: list[str] = []
        prompt: list[int] = []
        prefix: list[int] = []
        blocks: list[list[int]] = []
        hashed = 0
        for i in order:
            p = max(1, self.prompt[i])
            full = self.hashes[i][: p // block_tokens]
            # an empty list is also what a prompt shorter than one block gets: not a missing hash
            hashed += bool(self.hashes[i]) or p < block_tokens
            reused = 0
            while reused < len(full) and full[reused] in seen:
                reused += 1
            seen.update(full)
            times.append((self.times_ms[i] - t0) / 1000.0)
            keys.append(self.keys[i])
            prompt.append(p)
            blocks.append(full)
            prefix.append(self.prefix[i] if self.prefix[i] >= 0 else reused * block_tokens)
        notes = [
            f"recorded by {len(set(self.gateways))} gateway(s); output tokens not recorded: "
            f"{output_tokens} per request"
        ]
        if hashed < n:
            notes.append(
                f"{n - hashed} of {n} requests of a block or more recorded without prefix block "
                "hashes (gateways without --hash-blocks): no cacheable blocks for them"
            )
        if self.malformed:
            notes.append(
                f"left out {self.malformed} malformed request events (an empty key, negative "
                "token counts; the streams agent dead-letters them too)"
            )
        if self.undecodable or self.other_records:
            notes.append(
                f"skipped {self.undecodable} undecodable and {self.other_records} non-request "
                "records"
            )
        if self.summarised:
            notes.append(
                f"{self.summarised} requests recorded only in pre-aggregated summaries: not "
                "replayed"
            )
        return make_request_set(
            times=times,
            keys=keys,
            prompt_tokens=prompt,
            output_tokens=[output_tokens] * n,
            block_lists=blocks,
            prefix_tokens=prefix,
            block_tokens=block_tokens,
            source=source,
            notes=tuple(notes),
        )
