"""The dispatcher lowers Python's thread switch interval when it starts, and never raises it."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest

from cacheroute.benchmarks.dispatcher import bench_dispatcher
from cacheroute.dispatcher.dispatcher import Dispatcher, DispatcherConfig
from cacheroute.dispatcher.errors import DispatchError


@pytest.fixture(autouse=True)
def _restore_switch_interval() -> Iterator[None]:
    before = sys.getswitchinterval()
    yield
    sys.setswitchinterval(before)


def test_start_lowers_the_switch_interval_to_the_configured_value() -> None:
    sys.setswitchinterval(0.005)
    with Dispatcher(["a", "b"]):
        assert sys.getswitchinterval() == pytest.approx(0.0005)


def test_it_is_never_raised_and_none_leaves_it_alone() -> None:
    sys.setswitchinterval(0.0001)
    with Dispatcher(["a"], DispatcherConfig(switch_interval_s=0.002)):
        assert sys.getswitchinterval() == pytest.approx(0.0001)
    sys.setswitchinterval(0.005)
    with Dispatcher(["a"], DispatcherConfig(switch_interval_s=None)):
        assert sys.getswitchinterval() == pytest.approx(0.005)


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf")])
def test_a_bad_switch_interval_is_refused(bad: float) -> None:
    with pytest.raises(DispatchError, match="switch_interval_s"):
        DispatcherConfig(switch_interval_s=bad)


def test_bench_dispatcher_reports_receive_stalls_per_version() -> None:
    """2 timed versions (3, 4) and 1 with the CPU hog (5): the live version ends at 5."""
    out = bench_dispatcher(keys=2000, destinations=8, decisions=4000, versions=2)
    assert out["receive_versions"] == 2
    assert out["hog_versions"] == 1
    assert out["version_after_swap"] == 5
    assert out["switch_interval_ms"] == pytest.approx(0.5)
    assert 0 < out["receive_p50_stall_ms"] <= out["receive_p99_stall_ms"]
    assert out["receive_p99_stall_ms"] <= out["receive_max_stall_ms"]
    assert out["receive_hog_max_stall_ms"] > 0
