"""`compiled`: numba's machine code looked up once, called without its per-call type dispatch."""

from __future__ import annotations

import numpy as np

from cacheroute.replay.jit import compiled, njit


@njit
def _scatter(i: int, value: float, out: np.ndarray) -> int:
    out[i] += value
    return i + 1


def test_compiled_kernel_gives_the_dispatchers_answer_and_converts_numpy_scalars() -> None:
    out = np.zeros(3)
    kernel = compiled(_scatter, 0, 0.0, out)
    assert kernel(1, 2.5, out) == 2
    assert kernel(np.int64(2), np.float32(0.5), out) == 3  # type: ignore[arg-type]  # converted
    assert _scatter(1, 1.0, out) == 2
    assert out.tolist() == [0.0, 3.5, 0.5]


def test_a_plain_function_comes_back_unchanged() -> None:
    def plain(x: int) -> int:
        return x

    assert compiled(plain, 1) is plain
