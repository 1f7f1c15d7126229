"""Small seeded request sets for the replay tests (factories, quix-style)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pytest

from cacheroute.replay.requestset import RequestSet, make_request_set
from cacheroute.replay.workloads import WorkloadKind, generate, spec_for

WorkloadFactory = Callable[..., RequestSet]
TinyFactory = Callable[..., RequestSet]


def tiny(
    blocks: Sequence[Sequence[int]],
    *,
    times: Sequence[float] | None = None,
    keys: Sequence[str] | None = None,
    prompt: Sequence[int] | None = None,
    output: Sequence[int] | None = None,
    block_tokens: int = 16,
) -> RequestSet:
    """Hand-written requests: one block list per request (prompt = its full blocks + 1 token)."""
    n = len(blocks)
    return make_request_set(
        times=times if times is not None else [float(i) for i in range(n)],
        keys=keys if keys is not None else [f"k{i % 3}" for i in range(n)],
        prompt_tokens=prompt if prompt is not None else [len(b) * block_tokens + 1 for b in blocks],
        output_tokens=output if output is not None else [4] * n,
        block_lists=blocks,
        block_tokens=block_tokens,
        source="tiny",
    )


@pytest.fixture
def tiny_factory() -> TinyFactory:
    return tiny


@pytest.fixture(scope="session")
def workload_factory() -> WorkloadFactory:
    cache: dict[tuple[object, ...], RequestSet] = {}

    def make(
        kind: WorkloadKind = "whale", *, requests: int = 3000, keys: int = 300, seed: int = 0
    ) -> RequestSet:
        sig = (kind, requests, keys, seed)
        if sig not in cache:
            spec = spec_for(kind, requests=requests, keys=keys)
            cache[sig] = generate(spec, np.random.default_rng(seed))
        return cache[sig]

    return make
