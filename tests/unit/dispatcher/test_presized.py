"""`presized_dict`: a dict that takes its entries without resizing (CPython), else a plain one."""

from __future__ import annotations

import sys

import pytest

from cacheroute.dispatcher.presized import PRESIZE_MAX, presized_dict

CPYTHON = sys.implementation.name == "cpython"


@pytest.mark.skipif(not CPYTHON, reason="presizing needs CPython's C API")
@pytest.mark.parametrize("n", [1_000, 61_432, PRESIZE_MAX])
def test_filling_a_presized_dict_never_grows_its_table(n: int) -> None:
    d = presized_dict(n)
    assert d == {}
    assert type(d) is dict
    before = sys.getsizeof(d)
    d.update((f"tenant-{i}/conv", i % 30) for i in range(n))
    # no resize on the way: the table it was made with holds all n entries
    assert sys.getsizeof(d) == before
    assert d == {f"tenant-{i}/conv": i % 30 for i in range(n)}
    plain: dict[str, int] = {}
    assert sys.getsizeof(plain) < before  # a plain dict starts small and grows (resizes)


def test_zero_negative_and_oversized_requests() -> None:
    assert presized_dict(0) == {}
    assert presized_dict(-5) == {}
    big = presized_dict(10 * PRESIZE_MAX)  # capped at CPython's largest presize
    big.update((i, i) for i in range(PRESIZE_MAX + 10))  # grows past it like any dict
    assert len(big) == PRESIZE_MAX + 10
