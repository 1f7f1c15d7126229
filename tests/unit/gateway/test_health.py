"""Re-check delays of the gateway's backend health checker (pure backoff rule)."""

from __future__ import annotations

import pytest

from cacheroute.gateway.health import FIRST_RECHECK_S, grow_backoff


def test_backoff_starts_small_and_doubles_to_the_interval() -> None:
    delays = []
    backoff = 0.0
    for _ in range(8):
        backoff = grow_backoff(backoff, 2.0)
        delays.append(backoff)
    assert FIRST_RECHECK_S == 0.1
    assert delays == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0, 2.0])


def test_backoff_never_exceeds_a_short_interval() -> None:
    assert grow_backoff(0.0, 0.05) == 0.05
    assert grow_backoff(0.05, 0.05) == 0.05
