"""A real single-node Apache Kafka (KRaft) for development, tests and the demo — no Docker needed.

`distribution` finds the broker's jars (KAFKA_HOME, the local cache, Maven Central or the release
tarball), `config` renders its configuration, and `broker` starts, stops and inspects the process.
"""

from cacheroute.localkafka.broker import BrokerStatus, LocalBroker, StartResult
from cacheroute.localkafka.distribution import KafkaDistribution, find_java, resolve_distribution

__all__ = [
    "BrokerStatus",
    "KafkaDistribution",
    "LocalBroker",
    "StartResult",
    "find_java",
    "resolve_distribution",
]
