"""`gather`: the evaluator's worker pool; a worker that dies is an error that says what to do."""

from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor

import pytest

from cacheroute.replay.errors import ReplayError
from cacheroute.replay.evaluate import gather


def test_every_name_is_done_once_with_its_result() -> None:
    got: dict[str, object] = {}
    with ProcessPoolExecutor(2, multiprocessing.get_context("spawn")) as pool:
        gather(pool, str.upper, ["a", "b", "c"], got.__setitem__)
    assert got == {"a": "A", "b": "B", "c": "C"}


def test_a_worker_that_dies_is_a_replay_error_naming_the_remedy() -> None:
    # the worker exits as it starts (as one killed for memory would): the pool breaks
    ctx = multiprocessing.get_context("spawn")
    with (
        ProcessPoolExecutor(1, ctx, os._exit, (1,)) as pool,
        pytest.raises(ReplayError, match=r"worker process died.*fewer --jobs"),
    ):
        gather(pool, str.upper, ["a"], lambda name, result: None)
