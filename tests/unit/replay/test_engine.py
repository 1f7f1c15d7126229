"""The serving engine against closed-form timings of its own service model."""

from __future__ import annotations

import itertools
import math

import pytest

from cacheroute.replay.engine import Engine
from cacheroute.replay.requestset import RequestSet
from cacheroute.replay.service import ServiceModel

from .conftest import TinyFactory

S = ServiceModel(cache_tokens=1024)


def run(
    q: RequestSet, service: ServiceModel = S, r: int = 1, dest: list[int] | None = None
) -> Engine:
    eng = Engine.create(q, service, r)
    times = q.times.tolist()
    for i in range(q.n):
        eng.step(i, dest[i] if dest else 0, times[i + 1] if i + 1 < q.n else math.inf)
    return eng


def prefill(s: ServiceModel, u: float, c: float) -> float:
    return (
        s.prefill_fixed_s + s.prefill_per_token_s * u + s.attention_per_pair_s * (u * c + u * u / 2)
    )


def test_one_request_on_an_idle_replica(tiny_factory: TinyFactory) -> None:
    q = tiny_factory([[1, 2, 3]], prompt=[50], output=[10])
    eng = run(q)
    start, first, done = eng.out_f[0]
    assert start == 0.0
    assert first == pytest.approx(prefill(S, 50, 0))
    step = S.decode_base_s + S.decode_per_seq_s + S.decode_per_ctx_token_s * (50 + 5)
    assert done == pytest.approx(first + 9 * step)
    assert eng.out_i[0].tolist() == [0, 0]


def test_a_cached_prefix_shortens_prefill(tiny_factory: TinyFactory) -> None:
    q = tiny_factory([[1, 2, 3], [1, 2, 3, 4]], times=[0.0, 10.0], prompt=[50, 70], output=[1, 1])
    eng = run(q)
    assert eng.out_i[1, 1] == 48  # three 16-token blocks
    assert eng.out_f[1, 1] - 10.0 == pytest.approx(prefill(S, 70 - 48, 48))
    assert eng.out_f[1, 2] == eng.out_f[1, 1]  # one output token: done at the first token


def test_prompt_fully_cached_still_computes_one_token(tiny_factory: TinyFactory) -> None:
    q = tiny_factory([[1, 2], [1, 2]], times=[0.0, 5.0], prompt=[32, 32], output=[1, 1])
    eng = run(q)
    assert eng.out_i[1, 1] == 31


def test_concurrency_limit_queues_fifo(tiny_factory: TinyFactory) -> None:
    q = tiny_factory([[1], [2], [3]], times=[0.0, 0.0, 0.0], output=[3, 3, 3])
    eng = run(q, ServiceModel(max_running=1))
    starts = eng.out_f[:, 0].tolist()
    dones = eng.out_f[:, 2].tolist()
    assert starts[0] == 0.0
    assert starts[1] == pytest.approx(dones[0])
    assert starts[2] == pytest.approx(dones[1])


def test_prefill_waits_fifo_and_decodes_slow_while_prefill_runs(tiny_factory: TinyFactory) -> None:
    s = ServiceModel(chunk_tokens=64)
    q = tiny_factory([[1], [2]], times=[0.0, 0.0], prompt=[2000, 2000], output=[2, 2])
    eng = run(q, s)
    w = prefill(s, 2000, 0)
    assert eng.out_f[0, 1] == pytest.approx(w)  # first prompt alone on the GPU
    # while the second prefills, the first decodes at one token per (decode + chunk) step
    assert eng.out_f[1, 1] > 2 * w * 0.99
    step_mixed = s.decode_base_s + s.decode_per_seq_s + s.decode_per_ctx_token_s * 2001 + s.chunk_s
    assert eng.out_f[0, 2] == pytest.approx(w + step_mixed)


def test_completions_are_reported_before_the_next_arrival(tiny_factory: TinyFactory) -> None:
    q = tiny_factory([[1], [2], [3]], times=[0.0, 0.0, 100.0])
    eng = Engine.create(q, S, 2)
    assert eng.step(0, 0, 0.0) == 0
    assert eng.step(1, 1, 100.0) == 2  # both finish long before t = 100
    assert sorted(eng.comp[:2].tolist()) == [0, 1]
    assert eng.step(2, 0, math.inf) == 1
    assert eng.running().tolist() == [0, 0]
    assert eng.queued().tolist() == [0, 0]


def test_replicas_are_independent(tiny_factory: TinyFactory) -> None:
    q = tiny_factory([[1, 2], [1, 2]], times=[0.0, 1.0], prompt=[40, 40])
    eng = run(q, r=2, dest=[0, 1])
    assert eng.out_i[:, 1].tolist() == [0, 0]  # the second replica has its own, empty cache


def test_first_tokens_are_reported_once_in_the_step_that_reaches_them(
    tiny_factory: TinyFactory,
) -> None:
    # request 0: a 50-token prompt alone, first token at prefill(50) = 2 ms + 50 x 40 us +
    # 1.3 ns x 50^2 / 2 = 4.001625 ms; request 1 arrives at t = 1 s
    q = tiny_factory([[1], [2]], times=[0.0, 1.0], prompt=[50, 50], output=[10, 10])
    eng = Engine.create(q, S, 1)
    assert eng.step(0, 0, 0.001) == 0  # advanced to 1 ms only: not prefilled yet
    assert eng.first_tokens() == []
    assert eng.step(1, 0, math.inf) == 2  # runs to the end: both prefill and finish
    assert eng.first_tokens() == [0, 1]
    assert eng.out_f[0, 1] == pytest.approx(0.004001625)


def test_every_request_gets_one_first_token_no_later_than_its_completion(
    tiny_factory: TinyFactory,
) -> None:
    n = 40
    q = tiny_factory(
        [[i % 5, 100 + i] for i in range(n)],
        times=[0.05 * i for i in range(n)],
        prompt=[300 + 37 * i for i in range(n)],
        output=[1 + (i % 7) * 5 for i in range(n)],
    )
    eng = Engine.create(q, S, 2)
    times = q.times.tolist()
    seen_first: list[int] = []
    seen_done: list[int] = []
    for i in range(n):
        done = eng.step(i, i % 2, times[i + 1] if i + 1 < n else math.inf)
        seen_first += eng.first_tokens()
        for c in eng.comp[:done].tolist():
            assert c in seen_first  # its first token came in this step or before
            seen_done.append(c)
    assert sorted(seen_first) == list(range(n))
    assert sorted(seen_done) == list(range(n))
    # reported in the order they happened
    firsts = eng.out_f[:, 1]
    assert all(firsts[a] <= firsts[b] for a, b in itertools.pairwise(seen_first))
