"""The gateway emitter: reports every request to the `requests` topic without slowing the request.

Why it is built this way: a faust worker handles about 5,000 Kafka messages per second,
so one message per request cannot scale. `emit` therefore only validates the event and appends it
to the column buffer of the partition Kafka's default partitioner gives its key (so each key is
always counted by the same streams worker); a background thread seals each buffer into one
`RequestBatch` (or, in summary mode, per-key `RequestSummary` rows per tick), encodes it and hands
it to confluent-kafka. The request path never touches the network, never waits on a lock held
while encoding or producing (its lock guards only list appends and buffer swaps), and never raises.

Delivery is at-least-once from librdkafka's idempotent producer, so a record reaches its partition
once and in order; `seq` numbers each (gateway, partition) stream from 0, and a gap means records
were lost (counted in `delivery_errors`). Events emitted while a batch is being sealed go into the
next batch, so the streams agent should allow a few milliseconds (`poll_interval_ms`) of lateness.
"""

from __future__ import annotations

import logging
import threading
import time
from array import array
from collections.abc import Callable, Sequence
from types import TracebackType

from confluent_kafka import Producer
from prometheus_client import CollectorRegistry

from cacheroute.dispatcher.emitter.columns import NO_HASHES, ColumnBuffer, Columns, seal_due
from cacheroute.dispatcher.emitter.config import EmitterConfig, EmitterStats
from cacheroute.dispatcher.emitter.fields import INT_MAX, LONG_MAX, as_count, as_event_time, as_text
from cacheroute.dispatcher.emitter.metrics import EmitterCollector
from cacheroute.dispatcher.emitter.partitioner import PartitionMemo
from cacheroute.dispatcher.emitter.sealer import Outgoing, Sealer, Taken
from cacheroute.dispatcher.emitter.summary import TickAccumulator
from cacheroute.dispatcher.emitter.throttle import ThrottledLog
from cacheroute.dispatcher.emitter.transport import ProducerLike, discover_partitions
from cacheroute.dispatcher.errors import DispatchError
from cacheroute.kafkaio import producer_config
from cacheroute.settings import Settings

__all__ = ["Emitter", "EmitterConfig", "EmitterStats"]

log = logging.getLogger("cacheroute.dispatcher.emitter")  # its name before the package split


def _wall_ms() -> int:
    """Wall clock in ms since the epoch: event times must be comparable across gateways."""
    return time.time_ns() // 1_000_000


class Emitter:
    """Buffers request events per partition and produces them as batch records.

    `Emitter(settings, "gw-1")` discovers the partition count of `settings.topics["requests"]`,
    creates an idempotent zstd producer and starts the sealing thread. `clock_ms` (wall ms by
    default) stamps events and drives linger, heartbeat and tick rules; `registry` receives the
    `cacheroute_emitter_*` metrics (a private registry per emitter by default, as `.registry`).
    """

    def __init__(
        self,
        settings: Settings,
        gateway_id: str,
        config: EmitterConfig | None = None,
        *,
        producer: ProducerLike | None = None,
        clock_ms: Callable[[], int] | None = None,
        registry: CollectorRegistry | None = None,
    ) -> None:
        if type(gateway_id) is not str or not gateway_id:
            raise DispatchError(f"gateway_id must be a non-empty string, got {gateway_id!r}")
        self.config = config = config if config is not None else EmitterConfig()
        self.gateway_id = gateway_id
        self.topic = settings.topics["requests"]
        self.partitions = config.partitions or discover_partitions(settings, self.topic)
        self._clock_ms = clock_ms if clock_ms is not None else _wall_ms
        self._memo = PartitionMemo(self.partitions, config.partition_cache_size)
        self._owned: Producer | None = None
        if producer is None:
            producer = self._owned = Producer(
                producer_config(settings, **config.producer_overrides)
            )

        # Request-side state, guarded by _lock (held only for appends, swaps and counter updates).
        self._lock = threading.Lock()
        self._buffers = [ColumnBuffer() for _ in range(self.partitions)]
        self._ticks: list[TickAccumulator] | None = None  # summary mode: per-partition ticks
        if config.mode == "summary":
            self._ticks = [TickAccumulator(config.tick_ms) for _ in range(self.partitions)]
        self._limit = config.max_buffered_events  # 0 once closed: every emit then drops
        self._max_batch = config.max_batch_events
        self._held = 0  # memory units not yet delivered: events, or summary rows
        self._accepted = self._dropped = self._rejected = 0
        self._last_reject = ""
        self._batches_sent = self._heartbeats_sent = self._events_sent = 0
        self._events_failed = self._delivery_errors = 0
        self._closed = False  # no more emits
        self._finished = False  # close() is done: no more sealing either

        # Sealer-side state, guarded by _seal_lock (the background thread, pump, flush, close).
        self._seal_lock = threading.Lock()
        self._log = ThrottledLog(log, config.log_interval_ms)
        self._sealer = Sealer(
            gateway_id=gateway_id,
            topic=self.topic,
            partitions=self.partitions,
            config=config,
            producer=producer,
            ledger=self,
            log=self._log,
            now_ms=self._clock_ms(),
        )
        self._reported = {"rejected": 0, "dropped": 0}

        self.registry = registry if registry is not None else CollectorRegistry()
        self._collector = EmitterCollector(self.stats, gateway_id)
        self.registry.register(self._collector)

        self._wake = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None
        if config.background:
            self._thread = threading.Thread(
                target=self._run, name=f"cacheroute-emitter-{gateway_id}", daemon=True
            )
            self._thread.start()

    # ----------------------------------------------------------------------------- request path

    def emit(  # noqa: PLR0912, PLR0915 - flat on purpose: a helper call per field costs ~2x
        self,
        key: str,
        prompt_tokens: int,
        *,
        prefix_tokens: int | None = None,
        destination: str | None = None,
        cached_tokens: int | None = None,
        prefix_block_hashes: Sequence[int] | None = None,
        event_time_ms: int | None = None,
    ) -> bool:
        """Record one request; True if accepted. Never blocks on I/O and never raises.

        Rejected (False, counted in `rejected`, logged rate-limited by the background thread):
        a key that is not a UTF-8-encodable `str`, is empty or longer than `max_key_bytes` (the
        streams agent would discard it); token counts that are not ints (bool excluded; numpy
        ints are fine) in 0..2**31-1; a destination that is not an encodable `str`; hashes that
        are not 64-bit ints; an event time that is not an int in 0..2**63-1. Such events could
        not be encoded or counted, and one of them would otherwise spoil a batch of good ones.
        `destination=""` means the same as None. Dropped (False, counted in `dropped`): the
        memory bound is reached, or the emitter is closed.
        """
        try:
            if type(key) is not str and not isinstance(key, str):
                raise DispatchError(f"key must be a str, got {type(key).__name__}")
            if type(prompt_tokens) is not int or not 0 <= prompt_tokens <= INT_MAX:
                prompt_tokens = as_count("prompt_tokens", prompt_tokens)
            if prefix_tokens is None:
                prefix_tokens = -1
            elif type(prefix_tokens) is not int or not 0 <= prefix_tokens <= INT_MAX:
                prefix_tokens = as_count("prefix_tokens", prefix_tokens)
            if cached_tokens is None:
                cached_tokens = -1
            elif type(cached_tokens) is not int or not 0 <= cached_tokens <= INT_MAX:
                cached_tokens = as_count("cached_tokens", cached_tokens)
            if destination is None:
                destination = ""
            elif type(destination) is not str or not destination.isascii():
                destination = as_text("destination", destination)
            if prefix_block_hashes is None:
                hashes: Sequence[int] = NO_HASHES
            else:  # copies, and checks every value is a 64-bit int, in C
                hashes = array("q", prefix_block_hashes) or NO_HASHES
            partition = self._memo.hot.get(key)
            if partition is None:
                partition = self._new_key(key)
            now = self._clock_ms()
            if event_time_ms is None:
                event_time_ms = now
            elif type(event_time_ms) is not int or not 0 <= event_time_ms <= LONG_MAX:
                event_time_ms = as_event_time(event_time_ms)
            lock = self._lock
            lock.acquire()  # not `with`: ~70 ns less per event on CPython 3.11
            try:
                if self._held >= self._limit:
                    self._dropped += 1
                    return False
                if self._ticks is not None:  # summary mode: count it into its key's row
                    self._held += self._ticks[partition].add(
                        key, event_time_ms, prompt_tokens, prefix_tokens, cached_tokens
                    )
                    self._accepted += 1
                    return True
                buf = self._buffers[partition]
                keys = buf.keys
                if not keys:
                    buf.opened_ms = now
                keys.append(key)
                buf.event_time_ms.append(event_time_ms)
                buf.prompt_tokens.append(prompt_tokens)
                buf.prefix_tokens.append(prefix_tokens)
                buf.cached_tokens.append(cached_tokens)
                buf.destinations.append(destination)
                buf.hashes.append(hashes)
                self._held += 1
                self._accepted += 1
                full = len(keys) == self._max_batch
            finally:
                lock.release()
            if full:
                self._wake.set()  # seal now rather than at the next poll
            return True
        except Exception as exc:
            self._reject(exc)
            return False

    def _new_key(self, key: str) -> int:
        """Partition of a key not in the memo, after the checks that depend on the key alone.

        Only keys that pass are memoised, so these checks cost nothing on the hot path.
        """
        if not key:
            raise DispatchError("key must not be empty")
        size = len(key.encode("utf-8"))  # lone surrogates raise UnicodeEncodeError
        if size > self.config.max_key_bytes:
            raise DispatchError(f"key is {size} bytes, more than max_key_bytes")
        return self._memo.miss(key)

    def _reject(self, exc: Exception) -> None:
        try:
            reason = f"{type(exc).__name__}: {exc}"
            with self._lock:
                self._rejected += 1
                self._last_reject = reason
        except Exception:  # noqa: S110 - emit must never raise, even while describing a failure
            pass

    # ----------------------------------------------------------------------------- sealing side

    def pump(self, now_ms: int | None = None) -> int:
        """One sealing cycle at `now_ms` (default: the clock); returns records handed to Kafka.

        The background thread calls this every `poll_interval_ms`; with `background=False` the
        owner does.
        """
        with self._seal_lock:
            if self._finished:
                return 0
            now = self._clock_ms() if now_ms is None else now_ms
            self._sealer.seal(now, self._take(now, force=False))
            produced = self._sealer.drain(now)
            self._sealer.poll(now)
            self._report(now)
            return produced

    def _take(self, now: int, *, force: bool) -> Taken:
        """Swap out the buffers and summary ticks due for sealing (all when `force`), under the lock.

        Swapping is O(1) per partition; encoding happens afterwards, outside the lock.
        """
        linger = self.config.linger_ms
        batches: list[tuple[int, Columns]] = []
        ticks: list[tuple[int, int, dict[str, list[int]]]] = []
        with self._lock:
            for p, buf in enumerate(self._buffers):
                n = len(buf.keys)
                if n and (
                    force
                    or seal_due(n, buf.opened_ms, now, max_events=self._max_batch, linger_ms=linger)
                ):
                    batches.append((p, buf.take()))
            holding = [bool(buf.keys) for buf in self._buffers]
            for p, acc in enumerate(self._ticks or ()):
                for start in sorted(acc.ticks) if force else acc.due(now):
                    ticks.append((p, start, acc.pop(start)))
                holding[p] = holding[p] or acc.rows > 0
        return Taken(batches, ticks, holding)

    def settle(self, out: Outgoing, *, delivered: bool) -> None:
        """Ledger: a record was delivered or lost for good; release its memory and count it."""
        with self._lock:
            self._held -= out.units
            if delivered:
                self._batches_sent += 1
                self._heartbeats_sent += out.heartbeat
                self._events_sent += out.events
            else:
                self._delivery_errors += 1
                self._events_failed += out.events

    def _report(self, now: int) -> None:
        """Log rejected and dropped events (at most once per interval each, with the count)."""
        with self._lock:
            counts = {"rejected": self._rejected, "dropped": self._dropped}
            last_reject = self._last_reject
        reasons = {
            "rejected": f"invalid values (last: {last_reject})",
            "dropped": "emitter closed"
            if self._closed
            else f"{self.config.max_buffered_events} events buffered (max_buffered_events)",
        }
        for kind, count in counts.items():
            new = count - self._reported[kind]
            if new > 0 and self._log.due(kind, now):
                self._log.log(
                    kind,
                    now,
                    logging.WARNING,
                    f"emitter {self.gateway_id}: {kind} {new} events: {reasons[kind]}",
                )
                self._reported[kind] = count

    def _run(self) -> None:
        interval = self.config.poll_interval_ms / 1000
        last_crash = 0.0
        while not self._stopping:
            try:
                self.pump()
            except Exception:
                if time.monotonic() - last_crash > self.config.log_interval_ms / 1000:
                    last_crash = time.monotonic()
                    log.exception("emitter %s: sealing cycle failed; retrying", self.gateway_id)
            self._wake.wait(interval)
            self._wake.clear()

    # ------------------------------------------------------------------------------- lifecycle

    def flush(self, timeout: float = 30.0) -> bool:
        """Seal everything buffered (summary mode: the current tick too) and wait for delivery.

        True when every record sealed so far was delivered or failed for good within `timeout`.
        """
        deadline = time.monotonic() + timeout
        with self._seal_lock:
            if self._finished:  # closed: the producer may be gone, and nothing can be buffered
                return not self._sealer.waiting
            now = self._clock_ms()
            self._sealer.seal(now, self._take(now, force=True))
            while True:
                self._sealer.drain(now)
                waiting = self._sealer.waiting
                left = max(0.0, deadline - time.monotonic())
                remaining = self._sealer.flush(now, min(left, 0.05) if waiting else left)
                if (not waiting and remaining == 0) or time.monotonic() >= deadline:
                    break
                now = self._clock_ms()
            self._report(now)
            return not self._sealer.waiting and remaining == 0

    def close(self, timeout: float = 30.0) -> bool:
        """Stop accepting, flush, stop the thread; idempotent. True if nothing was left behind."""
        with self._lock:
            if self._closed:
                return self._buffered_locked() == 0
            self._closed = True
            self._limit = 0
        deadline = time.monotonic() + timeout
        self._stopping = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
        done = self.flush(max(0.0, deadline - time.monotonic()))
        if not done:
            log.error(
                "emitter %s closed with %d events undelivered",
                self.gateway_id,
                self.stats().buffered,
            )
        with self._seal_lock:
            self._finished = True
            self._log.report_suppressed()
        self.registry.unregister(self._collector)
        close_producer = getattr(self._owned, "close", None)  # confluent-kafka >= 2.13
        if done and close_producer is not None:
            close_producer()  # nothing is queued, so this returns at once
        return done

    def __enter__(self) -> Emitter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def stats(self) -> EmitterStats:
        """A consistent snapshot of the counters."""
        with self._lock:
            return EmitterStats(
                accepted=self._accepted,
                dropped=self._dropped,
                rejected=self._rejected,
                batches_sent=self._batches_sent,
                heartbeats_sent=self._heartbeats_sent,
                events_sent=self._events_sent,
                events_failed=self._events_failed,
                delivery_errors=self._delivery_errors,
                buffered=self._buffered_locked(),
            )

    def _buffered_locked(self) -> int:
        return self._accepted - self._events_sent - self._events_failed
