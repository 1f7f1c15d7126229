"""Which planner instance is active: consumer-group ownership of the plans topic's one partition.

Every `planner run` joins one consumer group subscribed to the plans topic. The topic has exactly
one partition, so the group coordinator assigns it to exactly one live member: that member is the
active planner, the others are hot standbys. When the active one dies (SIGKILL, no LeaveGroup) the
coordinator notices after `session.timeout.ms` and hands the partition to a standby within one
rebalance; a clean shutdown leaves the group at once. The partition is paused as soon as it is
assigned: membership is all we want from this consumer, not the records.

Group membership alone cannot stop a paused-then-resumed zombie from writing (a process frozen
past its session timeout still believes it is active until its next poll). That is what the
shared transactional id is for: the new active instance's `init_transactions` fences the old one,
whose next commit fails with ProducerFenced (see publisher.py).

No extra topic is needed: the plans topic is the resource being led, and its one partition is the
whole point of its layout.
"""

from __future__ import annotations

import logging

from confluent_kafka import Consumer, KafkaError, TopicPartition

from cacheroute.kafkaio import consumer_config
from cacheroute.settings import Settings

__all__ = ["Leadership"]

log = logging.getLogger(__name__)


class Leadership:
    """Membership in the planner group; `poll()` says whether this instance is the active one."""

    def __init__(
        self,
        settings: Settings,
        *,
        group_id: str,
        member: str,
        session_timeout_ms: int = 6_000,
    ) -> None:
        self.topic = settings.topics["plans"]
        self.group_id = group_id
        self.member = member
        self._leader = False
        self._generation = 0
        self._consumer = Consumer(
            consumer_config(
                settings,
                group_id=group_id,
                **{
                    "session.timeout.ms": session_timeout_ms,
                    "heartbeat.interval.ms": max(100, min(1000, session_timeout_ms // 6)),
                    "enable.partition.eof": False,
                    "auto.offset.reset": "latest",
                    # sticky: a standby joining must not move the partition off the active one
                    "partition.assignment.strategy": "cooperative-sticky",
                    "client.id": f"cacheroute-planner-leader[{member}]",
                },
            )
        )
        self._subscribe()
        self._closed = False

    def _subscribe(self) -> None:
        self._consumer.subscribe(
            [self.topic],
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_lost,
        )

    @property
    def is_leader(self) -> bool:
        """Whether this instance holds the partition (as of the last poll)."""
        return self._leader

    @property
    def generation(self) -> int:
        """How many times this instance became the leader."""
        return self._generation

    def poll(self) -> bool:
        """Serve group callbacks (never blocks); return whether this instance leads now."""
        msg = self._consumer.poll(0)
        err = msg.error() if msg is not None else None
        if err is not None:
            if err.fatal():
                log.error("leadership consumer failed: %s; stepping down", err)
                self._leader = False
            elif err.code() not in (KafkaError._PARTITION_EOF,):
                log.debug("leadership consumer: %s", err)
        return self._leader

    def rejoin(self) -> None:
        """Leave and rejoin the group, giving the partition up (after being fenced while leader)."""
        self._leader = False
        self._consumer.unsubscribe()
        self._subscribe()

    def close(self) -> None:
        """Leave the group (a standby takes over at once instead of after the session timeout)."""
        if not self._closed:
            self._closed = True
            self._leader = False
            self._consumer.close()

    # -------------------------------------------------------------------------- callbacks
    # Cooperative rebalancing: callbacks get only the partitions added or taken away.
    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        consumer.incremental_assign(partitions)
        if partitions:
            consumer.pause(partitions)
            if not self._leader:
                self._generation += 1
                log.info("%s holds %s in group %s: active", self.member, self.topic, self.group_id)
            self._leader = True

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if partitions:
            if self._leader:
                log.info(
                    "%s: %s revoked in group %s: standby", self.member, self.topic, self.group_id
                )
            self._leader = False
            consumer.incremental_unassign(partitions)

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if self._leader:
            log.warning(
                "%s lost its group membership (its session timed out, e.g. during a broker "
                "outage): standby until the group assigns %s again, which takes one rejoin if "
                "no other planner is running; if another one took over, its transactions fence "
                "this one",
                self.member,
                self.topic,
            )
        self._leader = False
        if partitions:
            consumer.incremental_unassign(partitions)
