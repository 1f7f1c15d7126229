"""`serve` tunes the cyclic collector before it serves (`cacheroute.serve.tune_gc`)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from cacheroute.serve import GC_THRESHOLDS, tune_gc


@pytest.fixture
def restored_gc() -> Iterator[None]:
    before = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*before)


@pytest.mark.usefixtures("restored_gc")
def test_tune_gc_freezes_start_up_objects_and_raises_the_thresholds() -> None:
    gc.unfreeze()
    assert gc.get_freeze_count() == 0
    marker = [object()]  # a tracked object that exists before serving starts
    assert gc.is_tracked(marker)
    tune_gc()
    assert gc.get_threshold() == (20_000, 20, 100) == GC_THRESHOLDS
    # everything alive at that point (the marker included) is out of the collector's reach
    assert gc.get_freeze_count() > 0
    assert all(marker is not o for o in gc.get_objects())
    # objects made afterwards are collected as usual
    later = [object()]
    assert any(later is o for o in gc.get_objects())
