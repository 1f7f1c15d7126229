"""The Kafka shell around the plan protocol, without a broker: consume loops that survive one bad
record, the planner's refresh of a plan from the future, and doctor's verdict on one.

Consumers are replaced by fakes that hand out prepared messages, so a record whose handling raises
can be placed exactly between a version's chunks and its header.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from typing import Any

import pytest
from confluent_kafka import KafkaError

from cacheroute.doctor import check_plan
from cacheroute.kafkaio import KafkaRecord
from cacheroute.planner.assembly import Outcome, PlanAssembler
from cacheroute.planner.protocol import HEADER_KEY, chunk_key, encode_plan
from cacheroute.planservice import follower as follower_module
from cacheroute.planservice import reader as reader_module
from cacheroute.planservice.follower import FollowerConfig, PlanFollower
from cacheroute.planservice.service import refresh_reason
from cacheroute.settings import Settings

from .conftest import PlanFactory

NOW_MS = 1_700_000_000_000
DAY_MS = 86_400_000


class FakeError:
    def __init__(self, code: int) -> None:
        self._code = code

    def code(self) -> int:
        return self._code

    def fatal(self) -> bool:
        return False


class FakeMessage:
    """The parts of confluent_kafka.Message the readers use."""

    def __init__(
        self, offset: int, key: bytes | None, value: bytes | None, *, eof: bool = False
    ) -> None:
        self._offset, self._key, self._value = offset, key, value
        self._error = FakeError(KafkaError._PARTITION_EOF) if eof else None

    def error(self) -> FakeError | None:
        return self._error

    def topic(self) -> str:
        return "unit.plans"

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes | None:
        return self._value

    def timestamp(self) -> tuple[int, int]:
        return 1, NOW_MS

    def headers(self) -> None:
        return None


class FakeConsumer:
    """Hands out `messages` in one batch (`poll` the first, `consume` the rest)."""

    def __init__(self, messages: Sequence[FakeMessage]) -> None:
        self.messages = list(messages)

    def poll(self, timeout: float) -> FakeMessage | None:
        return self.messages.pop(0) if self.messages else None

    def consume(self, n: int, timeout: float) -> list[FakeMessage]:
        out, self.messages = self.messages[:n], self.messages[n:]
        return out

    def assign(self, partitions: object) -> None:
        return None

    def close(self) -> None:
        return None


def log_of(plan_factory: PlanFactory, poison: bytes) -> list[FakeMessage]:
    """Version 1's chunks, a record whose handling raises, the header, end of partition."""
    plan = dataclasses.replace(plan_factory(600, q_cap=2.0, warm_slots=150), version=1)
    enc = encode_plan(plan, max_chunk_bytes=2048)
    recs: list[tuple[bytes | None, bytes | None]] = [
        (chunk_key(i), c) for i, c in enumerate(enc.chunks)
    ]
    recs += [(poison, b"x"), (HEADER_KEY, enc.header_bytes)]
    msgs = [FakeMessage(i, k, v) for i, (k, v) in enumerate(recs)]
    return [*msgs, FakeMessage(len(msgs), None, None, eof=True)]


class Exploding(PlanAssembler):
    """An assembler that fails on one key, as an unforeseen bug or a MemoryError would."""

    def __init__(self, poison: bytes, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.poison = poison

    def offer(self, key: bytes | None, value: Any, where: str = "") -> Outcome:
        if key == self.poison:
            raise MemoryError("simulated")
        return super().offer(key, value, where)


def test_follower_poll_handles_the_records_after_one_that_raises(
    plan_factory: PlanFactory, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    poison = b"chunk/00007-poison"
    consumer = FakeConsumer(log_of(plan_factory, poison))
    monkeypatch.setattr(follower_module, "plans_consumer", lambda *a, **k: consumer)
    monkeypatch.setattr(follower_module, "topic_exists", lambda *a, **k: True)
    follower = PlanFollower(Settings(topic_prefix="unit."), FollowerConfig())
    follower._assembler = Exploding(poison, defer_headers=True)
    with caplog.at_level(logging.ERROR, logger="cacheroute.planservice.follower"):
        follower.poll(0.0)  # one batch: chunks, the poison, the header, end of partition
    status = follower.status()
    assert status.version == 1  # the header after the poison was not dropped
    assert status.caught_up
    assert status.ignored == {"error": 1}
    assert status.rejected == {}
    sample = follower.metrics.registry.get_sample_value(
        "cacheroute_plan_follower_records_ignored_total", {"reason": "error"}
    )
    assert sample == 1.0
    assert sum("it is skipped, the records after it are not" in r.message for r in caplog.records)
    follower.close()


def test_scan_plans_hands_on_the_records_after_one_whose_callback_raises(
    plan_factory: PlanFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    messages = log_of(plan_factory, b"poison")
    consumer = FakeConsumer(messages)
    monkeypatch.setattr(reader_module, "plans_consumer", lambda *a, **k: consumer)
    monkeypatch.setattr(reader_module, "topic_exists", lambda *a, **k: True)
    seen: list[int] = []
    ends: list[int] = []

    def handle(record: KafkaRecord) -> None:
        if record.key == b"poison":
            raise ValueError("unforeseen")
        seen.append(record.offset)

    count = reader_module.scan_plans(Settings(topic_prefix="unit."), handle, on_end=ends.append)
    records = len(messages) - 1
    assert count == records
    assert seen == [i for i in range(records) if i != records - 2]  # all but the poison
    assert ends == [records]  # where a reader that goes on continues


@pytest.mark.parametrize(
    ("created_ms", "max_age_s", "reason"),
    [
        (NOW_MS + DAY_MS, 30.0, "was created 86400 s in the future of this planner's clock; "
         "gateways treat it as stale"),
        (NOW_MS + DAY_MS, 0.0, "was created 86400 s in the future of this planner's clock; "
         "gateways treat it as stale"),  # even with the age rule off
        (NOW_MS + 2_000, 30.0, "was created 2 s in the future of this planner's clock; gateways "
         "treat it as stale"),
        (NOW_MS + 1_000, 30.0, None),  # within the planner's 1 s tolerance
        (NOW_MS - 30_000, 30.0, "is older than 30s"),
        (NOW_MS - 29_999, 30.0, None),
        (NOW_MS - 10**9, 0.0, None),  # age rule off
    ],
)  # fmt: skip
def test_refresh_reason(created_ms: int, max_age_s: float, reason: str | None) -> None:
    assert refresh_reason(created_ms, NOW_MS, max_age_s) == reason


def test_doctor_fails_a_plan_from_the_future() -> None:
    ahead = check_plan(
        version=4, created_ms=NOW_MS + DAY_MS, control_interval_s=60.0, now_ms=NOW_MS
    )
    assert ahead.status == "fail"
    assert ahead.message.startswith(
        "plan v4 was created 86400 s in the future of this host's clock (more than the 5 s "
        "allowed for clock skew)"
    )
    assert "NTP" in ahead.fix
    within = check_plan(
        version=4, created_ms=NOW_MS + 5_000, control_interval_s=60.0, now_ms=NOW_MS
    )
    assert within.status == "ok"
    assert within.detail["age_s"] == -5.0
