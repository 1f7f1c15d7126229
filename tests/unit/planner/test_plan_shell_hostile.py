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

from cacheroute.dispatcher import follower as follower_module
from cacheroute.dispatcher import reader as reader_module
from cacheroute.dispatcher.follower import FollowerConfig, PlanFollower
from cacheroute.doctor import check_plan
from cacheroute.kafkaio import KafkaRecord
from cacheroute.planner.assembly import Outcome, PlanAssembler
from cacheroute.planner.protocol import HEADER_KEY, chunk_key, encode_plan
from cacheroute.planner.smoothing import AddResult, RateSmoother
from cacheroute.planservice.config import load_service_config
from cacheroute.planservice.rates import RatesBatch
from cacheroute.planservice.service import PlannerService, refresh_reason
from cacheroute.schemas import KeyRate
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
    with caplog.at_level(logging.ERROR, logger="cacheroute.dispatcher.follower"):
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


# ------------------------------------------------------------------ the planner's rates loop
WINDOW_MS = 60_000


class FakeRates:
    """A RatesSource that hands out one prepared batch, then nothing.

    The batch ends with a record of the next window, so the smoother knows the prepared window
    closed and folds it in the same poll."""

    partitions = 1

    def __init__(self, rates: list[KeyRate]) -> None:
        rates = [*rates, _key_rate("next", 1.0, window=rates[0].window_start_ms // WINDOW_MS + 1)]
        # Kafka timestamps: each record written as its window closed
        self.batch = RatesBatch([(0, r, r.window_end_ms) for r in rates], [])

    def poll(self, max_records: int, timeout: float) -> RatesBatch:
        batch, self.batch = self.batch, RatesBatch([], [])
        return batch

    def lag(self) -> int:
        return 0


class ExplodingSmoother(RateSmoother):
    """A smoother that fails on one key, as an unforeseen bug in `add` would."""

    def add(
        self, rate: KeyRate, partition: int, arrived_ms: int, record_ms: int | None = None
    ) -> AddResult:
        if rate.key == "poison":
            raise ValueError("simulated")
        return super().add(rate, partition, arrived_ms, record_ms)


def _planner(rates: list[KeyRate], now_ms: int, smoother: type[RateSmoother]) -> PlannerService:
    config = load_service_config(None, {"destinations": 2, "q_cap": 10.0, "warm_slots": 4})
    service = PlannerService(Settings(topic_prefix="unit."), config, clock=lambda: now_ms / 1000)
    service._rates = FakeRates(rates)  # type: ignore[assignment]
    service._smoother = smoother(config.smoothing, partitions=1)
    return service


def _records(service: PlannerService, outcome: str) -> float:
    sample = service.metrics.registry.get_sample_value(
        "cacheroute_planner_rates_records_total", {"outcome": outcome}
    )
    return sample or 0.0


def _key_rate(key: str, value: float, window: int = 10) -> KeyRate:
    start = window * WINDOW_MS
    return KeyRate(key, start, start + WINDOW_MS, round(value * 60), value)


def test_planner_skips_a_rate_record_whose_handling_raises_and_keeps_the_rest(
    caplog: pytest.LogCaptureFixture,
) -> None:
    rates = [_key_rate("a", 1.0), _key_rate("poison", 2.0), _key_rate("b", 3.0)]
    rates.append(_key_rate("c", 4.0))
    now_ms = 12 * WINDOW_MS  # window 10 closed long ago: it folds in this very poll
    service = _planner(rates, now_ms, ExplodingSmoother)
    with caplog.at_level(logging.ERROR, logger="cacheroute.planservice.service"):
        service._read_rates(0.0)
    assert service._smoother is not None
    snap = service._smoother.snapshot()
    assert dict(zip(snap.keys, snap.rates.tolist(), strict=True)) == {"a": 1.0, "b": 3.0, "c": 4.0}
    assert _records(service, "accepted") == 4  # a, b, c and the next window's record
    assert _records(service, "error") == 1
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1
    assert "1 KeyRate record(s) could not be handled" in errors[0]
    assert "the records after it are not" in errors[0]
    assert "'poison'" in errors[0]
    assert "ValueError: simulated" in errors[0]
    # the input lag gauge: now minus the newest folded window's end, 12 - 11 windows
    assert service.metrics.registry.get_sample_value("cacheroute_planner_input_lag_seconds") == 60


def test_planner_logs_a_window_cut_to_plausible_rates_once_with_the_reason(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The first window after a start: 100 keys at 1/s and one made-up key at 9e5/s.

    Reference 101 x median 1 = 101/s; the key is clamped to 1e5/s (100 x max(101, 1000)), then
    scaled so the window's total is 10 x 101 = 1010/s: it folds at 910/s (see test_smoothing)."""
    rates = [_key_rate(f"k{i:03d}", 1.0) for i in range(100)] + [_key_rate("made-up", 9e5)]
    service = _planner(rates, 12 * WINDOW_MS, RateSmoother)
    with caplog.at_level(logging.WARNING, logger="cacheroute.planservice.service"):
        service._read_rates(0.0)
        service._read_rates(0.0)  # nothing new: no second line for the same window
    assert service._smoother is not None
    snap = service._smoother.snapshot()
    assert float(snap.rates.sum()) == pytest.approx(1010.0, rel=1e-12)
    assert _records(service, "accepted") == 102  # with the next window's record
    assert _records(service, "invalid") == 0
    assert _records(service, "clamped") == 1
    assert _records(service, "scaled") == 1
    lines = [r.getMessage() for r in caplog.records if "rate window" in r.getMessage()]
    assert len(lines) == 1
    assert "reported a total of 9.001e+05 requests/s, folded as 1010" in lines[0]
    assert "reference total 101/s (the window's key count x its median key rate" in lines[0]
    assert "1 key rate(s) clamped to max_surge 100 x max(it, max_key_rate / 1000)" in lines[0]
    assert "1 key rate(s) scaled down" in lines[0]
    assert "largest cut: key 'made-up' at 9e+05/s" in lines[0]
