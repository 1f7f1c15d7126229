"""Reading the plans topic once, and the pieces every reader shares.

`LivePlan` is an applied version as readers hand it out; `scan_plans` feeds every record from the
start of the topic to its current end to a callback (the publisher's recovery uses it twice, with
both isolation levels); `read_plan_history` applies versions like a follower and keeps the ones
asked for (`plan show`, `plan diff`). `drain` is the polling primitive of all plan and rate readers.
"""

from __future__ import annotations

import logging
import time
from collections import Counter as Tally
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)

from cacheroute.errors import CacheRouteError
from cacheroute.kafkaio import KafkaRecord, consumer_config, to_record
from cacheroute.planner import Plan
from cacheroute.planner.assembly import Applied, Ignored, PlanAssembler, Rejected
from cacheroute.schemas import PlanHeader
from cacheroute.settings import Settings

__all__ = [
    "MISSING_TOPIC",
    "Isolation",
    "LivePlan",
    "PlanHistory",
    "drain",
    "plans_consumer",
    "read_plan_history",
    "scan_plans",
    "topic_exists",
]

log = logging.getLogger(__name__)

Isolation = Literal["read_committed", "read_uncommitted"]

MISSING_TOPIC = {
    KafkaError.UNKNOWN_TOPIC_OR_PART,
    KafkaError._UNKNOWN_TOPIC,
    KafkaError._UNKNOWN_PARTITION,
}


@dataclass(frozen=True, slots=True)
class LivePlan:
    """An applied plan version with where it came from and a key index for lookups."""

    plan: Plan
    header: PlanHeader
    where: str
    """`topic[partition]@offset` of the header that committed it."""
    applied_ms: int
    """Wall-clock time this reader applied it."""
    index: Mapping[str, int] = field(default_factory=dict)
    """Admitted key -> position in `plan.keys` (empty when the follower was told not to build it)."""

    @property
    def version(self) -> int:
        """The plan version."""
        return self.plan.version

    def age_s(self, now_ms: int) -> float:
        """Seconds since the planner built the plan (by the planner's clock)."""
        return (now_ms - self.plan.created_ms) / 1000.0

    def destinations_of(self, key: str) -> tuple[str, ...] | None:
        """Destination names of an admitted key, in selection order; None for a cold key."""
        i = self.index.get(key) if self.index else _linear_index(self.plan, key)
        if i is None:
            return None
        names = self.plan.destination_names
        return tuple(names[d] for d in self.plan.targets_of(i))


def _linear_index(plan: Plan, key: str) -> int | None:
    try:
        return plan.keys.index(key)
    except ValueError:
        return None


# ---------------------------------------------------------------------------- one-shot reads
def drain(consumer: Consumer, max_messages: int, timeout: float) -> list[Message]:
    """Wait up to `timeout` for one message, then take what else is already there.

    confluent-kafka's `consume(n, timeout)` waits until it has n messages or the timeout passed,
    so a reader at the end of a quiet topic would always lose the whole timeout.
    """
    first = consumer.poll(timeout)
    if first is None or max_messages <= 1:
        return [] if first is None else [first]
    return [first, *consumer.consume(max_messages - 1, 0)]


def topic_exists(consumer: Consumer, topic: str, timeout: float) -> bool:
    """Whether the broker knows `topic` (an assigned missing topic just reads nothing, forever)."""
    try:
        meta = consumer.list_topics(topic, timeout=timeout).topics.get(topic)
    except KafkaException as exc:
        raise CacheRouteError(f"cannot read metadata of {topic}: {exc}", retriable=True) from exc
    return meta is not None and meta.error is None and bool(meta.partitions)


def plans_consumer(
    settings: Settings, isolation: Isolation, client_id: str, *, fetch_wait_ms: int = 100
) -> Consumer:
    """An assign-only consumer (no group membership, never commits) for the plans topic.

    `fetch_wait_ms` is how long the broker holds an empty fetch: short for one-shot reads (the end
    of the topic is noticed sooner), longer for followers (fewer idle requests per gateway).
    """
    return Consumer(
        consumer_config(
            settings,
            group_id="cacheroute-plan-reader",
            **{
                "isolation.level": isolation,
                "enable.partition.eof": True,
                "client.id": client_id,
                "fetch.wait.max.ms": fetch_wait_ms,
            },
        )
    )


def scan_plans(
    settings: Settings,
    on_record: Callable[[KafkaRecord], None],
    *,
    isolation: Isolation = "read_committed",
    timeout: float = 60.0,
    on_end: Callable[[int], None] | None = None,
) -> int:
    """Feed every record of the plans topic, from the start to its current end, to `on_record`.

    The end is where the consumer reports end-of-partition: the last stable offset under
    read_committed (an open transaction is not waited for), the high watermark otherwise;
    `on_end(offset)` gets it (where a reader that goes on should continue). Returns the number of
    records read. An exception from `on_record` is logged and the scan goes on with the next
    record: one record nobody foresaw must not hide the ones after it (a later header, say).
    """
    topic = settings.topics["plans"]
    consumer = plans_consumer(settings, isolation, "cacheroute-plan-scan")
    count = failed = 0
    try:
        if not topic_exists(consumer, topic, timeout):
            raise CacheRouteError(
                f"topic {topic} does not exist; create it with `cacheroute topics ensure`"
            )
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        deadline = time.monotonic() + timeout
        while True:
            if time.monotonic() > deadline:
                raise CacheRouteError(
                    f"reading {topic} to its end took more than {timeout:g}s ({count} records "
                    "read); is the broker overloaded?",
                    retriable=True,
                )
            messages = drain(consumer, 1000, 0.5)
            for msg in messages:
                err = msg.error()
                if err is None:
                    count += 1
                    try:
                        on_record(to_record(msg))
                    except Exception:  # per record, logged with its traceback
                        failed += 1
                        log.exception(
                            "handling the record at %s[%d]@%s failed; going on with the next",
                            topic,
                            msg.partition() or 0,
                            msg.offset(),
                        )
                elif err.code() == KafkaError._PARTITION_EOF:
                    if failed:
                        log.error("%d record(s) of %s could not be handled", failed, topic)
                    if on_end is not None:
                        on_end(msg.offset() or 0)
                    return count
                elif err.code() in MISSING_TOPIC:
                    raise CacheRouteError(
                        f"topic {topic} does not exist; create it with `cacheroute topics ensure`"
                    )
                elif err.fatal():
                    raise CacheRouteError(f"reading {topic} failed: {err}")
    finally:
        consumer.close()


@dataclass(frozen=True)
class PlanHistory:
    """What one read of the plans topic found."""

    versions: dict[int, LivePlan]
    """Applied versions kept by the reader (the newest always), by version."""
    applied: tuple[int, ...]
    """Every version that was complete and valid on the topic, kept or not."""
    live: LivePlan | None
    rejected: list[Rejected]
    ignored: dict[str, int]
    records: int


def read_plan_history(
    settings: Settings,
    *,
    keep: Callable[[int], bool] | None = None,
    timeout: float = 60.0,
    now_ms: int = 0,
) -> PlanHistory:
    """Every version still on the topic (committed), applied in log order like a follower would.

    `keep(version)` says which applied versions to hold in memory besides the newest (default:
    all). Compaction leaves only the newest version's records, so older versions are there only
    until the cleaner has run.
    """
    assembler = PlanAssembler(max_pending_versions=8)
    versions: dict[int, LivePlan] = {}
    rejected: list[Rejected] = []
    ignored: Tally[str] = Tally()
    applied: list[int] = []
    live: LivePlan | None = None

    def handle(record: KafkaRecord) -> None:
        nonlocal live
        outcome = assembler.offer(record.key, record.value, record.where)
        if isinstance(outcome, Applied):
            if live is not None and keep is not None and not keep(live.version):
                versions.pop(live.version, None)
            live = LivePlan(outcome.plan, outcome.header, outcome.where, now_ms)
            versions[live.version] = live
            applied.append(live.version)
        elif isinstance(outcome, Rejected):
            rejected.append(outcome)
        elif isinstance(outcome, Ignored):
            ignored[outcome.reason] += 1

    records = scan_plans(settings, handle, timeout=timeout)
    return PlanHistory(versions, tuple(applied), live, rejected, dict(ignored), records)
