"""Fixtures for tests that talk to a real Apache Kafka broker.

The broker is the project's own (`cacheroute kafka start`, done by `.ci/run` and `make test`) or any
broker named by CACHEROUTE_BOOTSTRAP. Locally, a missing broker skips these tests with the reason;
under CI (`CI=true`) a missing broker fails them, so a skipped integration test never passes CI.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

from cacheroute.localkafka.broker import broker_answers
from cacheroute.settings import Settings
from cacheroute.topics import make_admin


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("true", "1", "yes")


@pytest.fixture(scope="session")
def kafka_settings() -> Settings:
    """Settings of the test broker; skips (locally) or fails (CI) when none answers."""
    settings = Settings.from_env()
    if not broker_answers(settings.bootstrap, timeout=5.0, security=settings.kafka_security):
        reason = (
            f"no Kafka broker answers at {settings.bootstrap}; start one with "
            "`cacheroute kafka start` (or `make test`, which does)"
        )
        if _in_ci():
            pytest.fail(reason + " — under CI a missing broker is a failure, not a skip")
        pytest.skip(reason)
    return settings


@pytest.fixture
def settings(kafka_settings: Settings) -> Iterator[Settings]:
    """Per-test settings with a unique topic prefix; the test's topics are deleted afterwards."""
    prefix = f"test-{uuid.uuid4().hex[:10]}."
    per_test = kafka_settings.with_overrides(topic_prefix=prefix)
    yield per_test
    admin = make_admin(per_test)
    ours = [t for t in admin.list_topics(timeout=10).topics if t.startswith(prefix)]
    if ours:
        for fut in admin.delete_topics(ours, operation_timeout=30).values():
            fut.result(timeout=30)
