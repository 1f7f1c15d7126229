"""The reusable plan-topic follower: what the dispatcher embeds in every gateway.

`PlanFollower` is what a gateway embeds. It reads the compacted plans topic from the beginning
with `isolation.level=read_committed` (a planner killed mid-publish leaves an open or aborted
transaction that such a reader never sees), applies the newest complete, checksummed version once it
reached the end, then follows new versions as they commit. A version that is incomplete, corrupt or
invalid is counted and logged and the previous plan stays live; garbage records are ignored. The
live plan is one attribute read (`follower.live`), swapped atomically, so a router thread never sees
half a plan and never waits for the follower.

    follower = PlanFollower(settings).start()         # background thread
    follower.wait_caught_up(timeout=30)
    live = follower.live                              # LivePlan | None
    if live is not None:
        i = live.index.get(key)                       # admitted? -> position in the plan
        targets = live.plan.targets_of(i) if i is not None else None
    follower.status()                                 # version, age, counters
    follower.close()

Without `start()`, call `poll(timeout)` from your own loop instead. One-shot reads of the topic
(tools, the publisher's recovery) are in reader.py.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter as Tally
from collections.abc import Callable
from dataclasses import dataclass

from confluent_kafka import OFFSET_BEGINNING, KafkaError, KafkaException, Message, TopicPartition

from cacheroute.dispatcher.follower_metrics import FollowerMetrics
from cacheroute.dispatcher.reader import (
    MISSING_TOPIC,
    LivePlan,
    drain,
    plans_consumer,
    topic_exists,
)
from cacheroute.dispatcher.routing import compiled_groups
from cacheroute.errors import CacheRouteError
from cacheroute.kafkaio import AUTHORIZATION_ERRORS, to_record
from cacheroute.planner.assembly import Applied, Ignored, Outcome, PlanAssembler, Rejected
from cacheroute.schemas.codec import warm_up_plan_decoding
from cacheroute.settings import Settings

__all__ = ["FollowerConfig", "FollowerStatus", "LivePlan", "PlanFollower"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FollowerConfig:
    """How a follower reads."""

    poll_timeout_s: float = 0.5
    """Longest wait of one poll; also how fast `close()` takes effect."""
    max_pending_versions: int = 3
    """Unfinished versions whose chunks are buffered at most (bounds memory)."""
    build_index: bool = True
    """Build `LivePlan.index` (key -> position) when applying, off the routing path."""
    client_id: str = "cacheroute-plan-follower"


@dataclass(frozen=True)
class FollowerStatus:
    """A snapshot of a follower for logs, health checks and the CLI."""

    version: int | None
    age_s: float | None
    caught_up: bool
    applied: int
    rejected: dict[str, int]
    ignored: dict[str, int]
    records: int


class PlanFollower:
    """Follows the plans topic and keeps the newest verified plan live (see the module docstring)."""

    def __init__(
        self,
        settings: Settings,
        config: FollowerConfig | None = None,
        *,
        metrics: FollowerMetrics | None = None,
        on_plan: Callable[[LivePlan], None] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.config = config or FollowerConfig()
        self.metrics = metrics or FollowerMetrics.create()
        self._on_plan = on_plan
        self._clock = clock
        self._topic = settings.topics["plans"]
        # decode and validate in GIL-yielding steps: gateways route on other threads meanwhile
        self._assembler = PlanAssembler(
            max_pending_versions=self.config.max_pending_versions,
            defer_headers=True,
            pause=_yield_gil,
        )
        self._consumer = plans_consumer(
            settings, "read_committed", self.config.client_id, fetch_wait_ms=500
        )
        try:
            if not topic_exists(self._consumer, self._topic, 10.0):
                log.warning(
                    "plans topic %s does not exist (yet); the follower waits for it. Create it "
                    "with `cacheroute topics ensure`",
                    self._topic,
                )
        except CacheRouteError as exc:  # broker down: the consumer keeps retrying by itself
            log.warning("plan follower: %s; it keeps trying", exc)
        self._consumer.assign([TopicPartition(self._topic, 0, OFFSET_BEGINNING)])
        self._live: LivePlan | None = None
        self._caught_up = threading.Event()
        self._changed = threading.Condition()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._applied = 0
        self._rejected: Tally[str] = Tally()
        self._ignored: Tally[str] = Tally()
        self._records = 0
        self._last_error_log = 0.0
        self._closed = False
        self.metrics.plan_age_seconds.set_function(self._age_or_nan)

    # ------------------------------------------------------------------------- lifecycle
    def start(self) -> PlanFollower:
        """Follow in a background (daemon) thread; returns self."""
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name=f"plan-follower[{self._topic}]", daemon=True
            )
            self._thread.start()
        return self

    def close(self, timeout: float = 10.0) -> None:
        """Stop following and close the consumer (the live plan stays readable)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        if not self._closed:
            self._closed = True
            self._consumer.close()

    def __enter__(self) -> PlanFollower:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self) -> None:
        warm_up_plan_decoding()
        groups = compiled_groups()
        if groups is not None:
            groups.warm_up()
        while not self._stop.is_set():
            try:
                self.poll(self.config.poll_timeout_s)
            except Exception:
                log.exception(
                    "plan follower: unexpected error while reading %s; the live plan (version %s) "
                    "stays; retrying in 1 s",
                    self._topic,
                    self.version,
                )
                self._stop.wait(1.0)

    # ----------------------------------------------------------------------------- views
    @property
    def live(self) -> LivePlan | None:
        """The newest applied plan (None before the first); one atomic attribute read."""
        return self._live

    @property
    def version(self) -> int | None:
        """Version of the live plan."""
        live = self._live
        return None if live is None else live.version

    @property
    def caught_up(self) -> bool:
        """Whether the topic was read to its (committed) end once since the start."""
        return self._caught_up.is_set()

    def status(self) -> FollowerStatus:
        """Version, age and counters, consistent with each other."""
        live = self._live
        with self._lock:
            return FollowerStatus(
                version=None if live is None else live.version,
                age_s=None if live is None else live.age_s(self._now_ms()),
                caught_up=self.caught_up,
                applied=self._applied,
                rejected=dict(self._rejected),
                ignored=dict(self._ignored),
                records=self._records,
            )

    def wait_caught_up(self, timeout: float) -> bool:
        """Block until the topic was read to its end once (polls itself without a thread)."""
        deadline = time.monotonic() + timeout
        while not self._caught_up.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            if self._thread is None:
                self.poll(min(left, self.config.poll_timeout_s))
            else:
                self._caught_up.wait(min(left, 0.5))
        return True

    def wait_for_version(self, version: int, timeout: float) -> LivePlan | None:
        """Block until a plan with at least `version` is live; None on timeout."""
        deadline = time.monotonic() + timeout
        while True:
            live = self._live
            if live is not None and live.version >= version:
                return live
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            if self._thread is None:
                self.poll(min(left, self.config.poll_timeout_s))
            else:
                with self._changed:
                    self._changed.wait(min(left, 0.5))

    # ---------------------------------------------------------------------------- reading
    def poll(self, timeout: float) -> list[Outcome]:
        """Read what is there (waiting at most `timeout`), apply what completes; the outcomes.

        Each message is handled on its own: an exception while handling one is counted (ignored,
        reason `error`) and logged, and the messages after it in the batch are still handled. The
        consumer's position is already past the whole batch, so a record skipped by an exception
        would never be read again (it could be the header of the next version). Only a fatal Kafka
        error propagates, after the batch.
        """
        messages = drain(self._consumer, 500, timeout)
        outcomes: list[Outcome] = []
        fatal: KafkaException | None = None
        for msg in messages:
            try:
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        outcomes.extend(self._reached_end())
                    else:
                        self._kafka_error(err)
                    continue
                record = to_record(msg)
                with self._lock:
                    self._records += 1
                started = time.perf_counter()
                outcome = self._assembler.offer(record.key, record.value, record.where)
                outcomes.append(outcome)
                self._account(outcome, time.perf_counter() - started)
            except KafkaException as exc:  # fatal: the consumer cannot go on
                fatal = exc
            except Exception:  # per message: never drop the rest of the batch
                self._failed(msg)
        if fatal is not None:
            raise fatal
        return outcomes

    def _failed(self, msg: Message) -> None:
        with self._lock:
            self._ignored["error"] += 1
        self.metrics.ignored.labels("error").inc()
        log.exception(
            "plan follower: handling the record at %s[%s]@%s failed; it is skipped, the records "
            "after it are not; version %s stays live",
            msg.topic(),
            msg.partition(),
            msg.offset(),
            self.version,
        )

    def _reached_end(self) -> list[Outcome]:
        if not self._assembler.deferring:
            return []
        started = time.perf_counter()
        try:
            outcomes = self._assembler.finish_catch_up()
            for outcome in outcomes:
                try:
                    self._account(outcome, time.perf_counter() - started)
                except Exception:  # one outcome's bookkeeping must not lose the others
                    log.exception(
                        "plan follower: accounting for a %s outcome failed", type(outcome).__name__
                    )
        finally:  # whatever happened, waiting for the catch-up must not hang
            self._caught_up.set()
        self.metrics.caught_up.set(1)
        live = self._live
        log.info(
            "plan follower caught up on %s: live version %s",
            self._topic,
            "none" if live is None else live.version,
        )
        with self._changed:
            self._changed.notify_all()
        return outcomes

    def _account(self, outcome: Outcome, seconds: float) -> None:
        if isinstance(outcome, Applied):
            live = LivePlan(
                plan=outcome.plan,
                header=outcome.header,
                where=outcome.where,
                applied_ms=self._now_ms(),
                index=(
                    {k: i for i, k in enumerate(outcome.plan.keys)}
                    if self.config.build_index
                    else {}
                ),
            )
            self._live = live
            with self._lock:
                self._applied += 1
            self.metrics.applied.inc()
            self.metrics.apply_seconds.observe(seconds)
            self.metrics.live_version.set(live.version)
            log.info(
                "plan version %d applied from %s (%d admitted keys, %d chunks, planner %s)",
                live.version,
                outcome.where,
                live.plan.n_admitted,
                outcome.header.chunk_count,
                outcome.header.planner_id or "?",
            )
            with self._changed:
                self._changed.notify_all()
            if self._on_plan is not None:
                try:
                    self._on_plan(live)
                except Exception:
                    log.exception("on_plan callback failed for version %d", live.version)
        elif isinstance(outcome, Rejected):
            with self._lock:
                self._rejected[outcome.reason] += 1
            self.metrics.rejected.labels(outcome.reason).inc()
            log.warning(
                "plan version %d at %s not applied (%s): %s; version %s stays live",
                outcome.version,
                outcome.where,
                outcome.reason,
                outcome.detail,
                self.version,
            )
        elif isinstance(outcome, Ignored):
            with self._lock:
                self._ignored[outcome.reason] += 1
            self.metrics.ignored.labels(outcome.reason).inc()
            garbage = outcome.reason in (
                "unknown-key",
                "undecodable",
                "key-mismatch",
                "out-of-range",
            )
            log.log(
                logging.WARNING if garbage else logging.DEBUG,
                "ignored record at %s (%s): %s",
                outcome.where,
                outcome.reason,
                outcome.detail,
            )
        elif outcome.evicted is not None:  # Buffered
            log.info(
                "dropped the buffered chunks of unfinished version %d (more than %d versions "
                "pending)",
                outcome.evicted,
                self.config.max_pending_versions,
            )

    def _kafka_error(self, err: KafkaError) -> None:
        if err.fatal():
            raise KafkaException(err)
        now = time.monotonic()
        if now - self._last_error_log < 10.0:
            return
        self._last_error_log = now
        if err.code() in MISSING_TOPIC:
            log.warning(
                "plans topic %s does not exist (yet); create it with `cacheroute topics ensure`",
                self._topic,
            )
        elif err.code() in AUTHORIZATION_ERRORS:
            live = self._live
            log.warning(
                "plan follower: Kafka refused reading %s (%s): this gateway's principal lacks "
                "READ on the topic. Routing stays on plan v%s; grant the gateway role's ACLs "
                "(`cacheroute topics acls`). Retrying",
                self._topic,
                err.str(),
                None if live is None else live.version,
            )
        else:
            log.warning("plan follower: Kafka reports %s; retrying", err)

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)

    def _age_or_nan(self) -> float:
        live = self._live
        return float("nan") if live is None else live.age_s(self._now_ms())


def _yield_gil() -> None:
    """Let a waiting routing thread take the GIL between decode/validation steps."""
    time.sleep(0)
