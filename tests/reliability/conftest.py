"""Fault-injection suite: the integration fixtures (real broker, per-test topic prefix) plus
cleanup of the Faust-internal topics a streams worker creates.

Every test here is marked `kafka` (a missing broker skips locally, fails under CI) and asserts
what was lost by the fault: nothing.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from cacheroute.settings import Settings
from cacheroute.topics import make_admin
from tests.integration.conftest import kafka_settings, settings  # noqa: F401


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test of this directory `kafka` (they all need the real broker)."""
    for item in items:
        if "tests/reliability/" in str(item.path).replace("\\", "/"):
            item.add_marker(pytest.mark.kafka)


@pytest.fixture
def faust_cleanup(settings: Settings) -> Iterator[str]:  # noqa: F811
    """The streams app id of this test; its changelog/internal topics are deleted afterwards."""
    stem = settings.topic_prefix.rstrip(".") + "-streams"
    yield stem
    admin = make_admin(settings.bootstrap)
    ours = [t for t in admin.list_topics(timeout=10).topics if t.startswith(stem)]
    if ours:
        for fut in admin.delete_topics(ours, operation_timeout=30).values():
            fut.result(timeout=30)
