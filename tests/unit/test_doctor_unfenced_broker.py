"""Doctor never crashes when a broker swallows the topic-config request.

While a killed broker is not yet fenced, KRaft may still name it in the metadata and a
DescribeConfigs request sent to it gets no answer: doctor once died there with a `TimeoutError`
traceback (seen in the leader-kill test). The admin client below stands in for exactly that one
behaviour: metadata answers, DescribeConfigs never does. No broker is needed.
"""

from __future__ import annotations

from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any

from confluent_kafka.admin import AdminClient

from cacheroute.doctor import FAIL, OK, DoctorOptions, _topic_findings
from cacheroute.kafkaio import QuietLog
from cacheroute.settings import Settings
from cacheroute.topics import describe_topic_configs, topic_specs


class _SilentConfigs:
    """Metadata lists the project's topics; DescribeConfigs futures never complete."""

    def __init__(self, settings: Settings) -> None:
        specs = topic_specs(settings, 1)
        part = SimpleNamespace(replicas=[1], isrs=[1], leader=1)
        self.meta = SimpleNamespace(
            brokers={1: object()},
            topics={
                s.name: SimpleNamespace(
                    error=None, partitions=dict.fromkeys(range(s.partitions), part)
                )
                for s in specs
            },
        )
        self.timeouts: list[float] = []

    def list_topics(self, timeout: float = -1) -> Any:
        del timeout
        return self.meta

    def describe_configs(self, resources: list[Any], **kwargs: Any) -> dict[Any, Future[Any]]:
        self.timeouts.append(kwargs["request_timeout"])
        return {r: Future() for r in resources}


def test_unanswered_topic_configs_are_a_finding_not_a_traceback() -> None:
    settings = Settings()
    admin = _SilentConfigs(settings)
    findings: list[Any] = []
    partitions = _topic_findings(settings, admin, DoctorOptions(timeout_s=0.2), findings)
    # every topic was still seen (the rest of the doctor goes on with them)
    assert set(partitions) == {s.name for s in topic_specs(settings, 1)}
    assert admin.timeouts == [0.2]  # the doctor's own timeout, not a fixed 30 s
    by_check = {f.check: f for f in findings}
    assert by_check["topic-configs"].status == FAIL
    assert "could not read the topic configs" in by_check["topic-configs"].message
    # the configs were not judged, so no topic is reported "as specified"
    assert not any(f.status == OK and "as specified" in f.message for f in findings)


def test_describe_topic_configs_gives_up_after_its_timeout() -> None:
    config: dict[str, Any] = {"bootstrap.servers": "127.0.0.1:1", "logger": QuietLog()}
    admin = AdminClient(config)
    try:
        describe_topic_configs(admin, ["x"], timeout=0.5)
    except TimeoutError:
        pass
    else:  # pragma: no cover - a listener on port 1 would be a broken machine
        raise AssertionError("no broker listens on port 1, yet configs came back")
