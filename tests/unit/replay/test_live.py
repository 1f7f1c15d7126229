"""Live push pacing and event times, with a fake emitter and a fake clock (no Kafka)."""

from __future__ import annotations

import pytest

from cacheroute.errors import CacheRouteError
from cacheroute.replay.live import push

from .conftest import TinyFactory


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.now += s


class FakeEmitter:
    def __init__(self, accept: bool = True) -> None:
        self.events: list[tuple[str, int, int | None, list[int] | None, int | None]] = []
        self.accept = accept

    def emit(
        self,
        key: str,
        prompt_tokens: int,
        *,
        prefix_tokens: int | None = None,
        destination: str | None = None,
        cached_tokens: int | None = None,
        prefix_block_hashes: list[int] | None = None,
        event_time_ms: int | None = None,
    ) -> bool:
        del destination, cached_tokens
        self.events.append((key, prompt_tokens, prefix_tokens, prefix_block_hashes, event_time_ms))
        return self.accept

    def flush(self, timeout: float = 30.0) -> bool:
        del timeout
        return True


def test_push_paces_at_speed_and_stamps_compressed_event_times(tiny_factory: TinyFactory) -> None:
    q = tiny_factory([[1], [1, 2], [3]], times=[0.0, 2.0, 4.0], keys=["a", "a", "b"])
    clock, em = FakeClock(), FakeEmitter()
    stats = push(q, em, speed=2.0, start_ms=1_000, clock=clock, sleep=clock.sleep)
    assert [e[4] for e in em.events] == [1_000, 2_000, 3_000]
    assert clock.slept == pytest.approx([1.0, 1.0])
    assert [e[0] for e in em.events] == ["a", "a", "b"]
    assert stats.accepted == 3
    assert stats.replay_s == pytest.approx(2.0)
    assert stats.flushed


def test_push_as_fast_as_possible_keeps_trace_time_and_hashes(tiny_factory: TinyFactory) -> None:
    q = tiny_factory([[1], [1, 2]], times=[0.0, 60.0])
    clock, em = FakeClock(), FakeEmitter(accept=False)
    stats = push(q, em, speed=0, start_ms=0, block_hashes=True, clock=clock, sleep=clock.sleep)
    assert clock.slept == []
    assert [e[4] for e in em.events] == [0, 60_000]
    assert [e[3] for e in em.events] == [[0], [0, 1]]
    assert stats.rejected_or_dropped == 2


def test_negative_speed_is_refused(tiny_factory: TinyFactory) -> None:
    with pytest.raises(CacheRouteError):
        push(tiny_factory([[1]]), FakeEmitter(), speed=-1, start_ms=0)
