"""The partitioner agrees with Kafka's Java client, aiokafka (faust) and itself, on every key."""

from __future__ import annotations

import random

import pytest
from aiokafka.partitioner import DefaultPartitioner  # type: ignore[import-untyped]
from aiokafka.partitioner import murmur2 as aiokafka_murmur2
from hypothesis import given
from hypothesis import strategies as st

from cacheroute.dispatcher.emitter.partitioner import PartitionMemo, murmur2, partition_for


def _signed(h: int) -> int:
    return h - 2**32 if h >= 2**31 else h


@pytest.mark.parametrize(
    ("data", "java"),
    [  # org.apache.kafka.common.utils.UtilsTest#testMurmur2 (Java returns a signed int)
        (b"21", -973932308),
        (b"foobar", -790332482),
        (b"a-little-bit-long-string", -985981536),
        (b"a-little-bit-longer-string", -1486304829),
        (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
        (b"abc", 479470107),
    ],
)
def test_murmur2_matches_the_java_client_vectors(data: bytes, java: int) -> None:
    assert _signed(murmur2(data)) == java


def test_murmur2_equals_aiokafka_on_random_bytes_of_every_tail_length() -> None:
    rng = random.Random(7)
    for _ in range(5000):
        data = rng.randbytes(rng.randrange(0, 80))
        assert murmur2(data) == aiokafka_murmur2(data)


def test_partition_for_equals_aiokafka_default_partitioner_on_many_keys() -> None:
    rng = random.Random(11)
    alphabet = "abcdefXYZ0189-_:/ éü中文🙂"
    for partitions in (1, 3, 8, 12, 64):
        everything = list(range(partitions))
        for _ in range(2000):
            key = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 40)))
            expected = DefaultPartitioner()(key.encode(), everything, everything)
            assert partition_for(key, partitions) == expected


@given(st.text(), st.integers(1, 1000))
def test_partition_for_is_in_range_and_deterministic(key: str, partitions: int) -> None:
    try:
        p = partition_for(key, partitions)
    except UnicodeEncodeError:  # lone surrogates: no Kafka client can send such a key either
        return
    assert 0 <= p < partitions
    assert p == partition_for(key, partitions)


def test_partition_for_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="positive"):
        partition_for("k", 0)
    with pytest.raises(UnicodeEncodeError):
        partition_for("\udc80", 8)


def test_memo_is_bounded_and_agrees_with_partition_for() -> None:
    memo = PartitionMemo(partitions=8, capacity=100)
    keys = [f"key-{i}" for i in range(1000)]
    for round_ in range(3):
        for key in keys if round_ != 1 else reversed(keys):
            assert memo(key) == partition_for(key, 8)
            assert len(memo) <= 200
    assert len(memo.hot) <= 100


def test_memo_promotes_from_the_previous_generation_without_rehashing() -> None:
    memo = PartitionMemo(partitions=8, capacity=2)
    memo("a")
    memo("b")
    memo("c")  # hot was full: {"a", "b"} became the previous generation
    assert "a" not in memo.hot
    memo._old["a"] = 99  # a value partition_for could never give: proves it was promoted
    assert memo("a") == 99
    assert memo.hot["a"] == 99


def test_memo_rejects_bad_sizes() -> None:
    with pytest.raises(ValueError, match="partitions"):
        PartitionMemo(0)
    with pytest.raises(ValueError, match="capacity"):
        PartitionMemo(8, capacity=0)
