"""Helpers for the planner-service integration tests: plans, rates, topic readers, processes.

Also runnable as a script (`python -m tests.integration.planservice_support publish-and-die ...`):
a publisher that SIGKILLs its own process in the middle of a publish, after some chunks reached the
broker, which is the one failure a test cannot stage from inside its own process.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from confluent_kafka import Producer

from cacheroute.dispatcher.reader import scan_plans
from cacheroute.kafkaio import KafkaRecord, producer_config
from cacheroute.loopback import free_port
from cacheroute.planner import Plan, PlannerParams, build_plan
from cacheroute.planner.protocol import parse_key
from cacheroute.planservice.publisher import PlanPublisher
from cacheroute.schemas import KeyRate, PlanHeader, codec_for
from cacheroute.settings import Settings

REPO = Path(__file__).resolve().parents[2]


def make_plan(
    n_keys: int,
    *,
    version: int,
    seed: int = 0,
    destinations: int = 8,
    warm_slots: int | None = None,
    created_ms: int = 1_700_000_000_000,
) -> Plan:
    """A plan that admits every one of `n_keys` keys (k_b = 1 except a few hot ones)."""
    rng = np.random.default_rng(seed)
    keys = [f"tenant-{i % 97}/conversation-{i:07d}" for i in range(n_keys)]
    rates = rng.lognormal(0.0, 1.2, n_keys)
    q_cap = float(np.quantile(rates, 0.999))
    k = np.clip(np.ceil(rates / q_cap), 1, destinations)
    slots = warm_slots if warm_slots is not None else int(np.ceil(k.sum() / destinations)) + 1
    params = PlannerParams(q_cap=q_cap, warm_slots=slots, control_interval_s=5.0)
    dests = [f"gpu-{i}" for i in range(destinations)]
    return build_plan(keys, rates, dests, params, version=version, created_ms=created_ms + version)


@contextmanager
def started_publisher(settings: Settings, txid: str, **kwargs: object) -> Iterator[PlanPublisher]:
    publisher = PlanPublisher(settings, transactional_id=txid, **kwargs)  # type: ignore[arg-type]
    publisher.start()
    try:
        yield publisher
    finally:
        publisher.close()


def plan_records(settings: Settings, *, committed: bool = True) -> list[KafkaRecord]:
    """Every record of the plans topic, committed only (default) or everything."""
    out: list[KafkaRecord] = []
    scan_plans(
        settings, out.append, isolation="read_committed" if committed else "read_uncommitted"
    )
    return out


def headers(records: Sequence[KafkaRecord]) -> list[PlanHeader]:
    """The decodable headers among `records`, in log order."""
    codec = codec_for(PlanHeader)
    out = []
    for r in records:
        if parse_key(r.key)[0] == "header" and r.value is not None:
            try:
                out.append(codec.decode(r.value))
            except ValueError:
                continue
    return out


def produce_rates(
    settings: Settings,
    windows: Sequence[Mapping[str, float]],
    *,
    window_ms: int,
    end_ms: int,
    prompts: Mapping[str, int] | None = None,
    cached: Mapping[str, int] | None = None,
) -> None:
    """KeyRate records for consecutive windows, the last one ending at `end_ms`.

    `prompts`: prompt tokens per request of some keys (the others carry no token sums);
    `cached`: tokens per request the engines reported serving from cache (default none)."""
    codec = codec_for(KeyRate)
    producer = Producer(producer_config(settings))
    topic = settings.topics["rates"]
    first = end_ms - len(windows) * window_ms
    for w, rates in enumerate(windows):
        start = first + w * window_ms
        for key, rate in rates.items():
            count = max(1, round(rate * window_ms / 1000))
            tokens = (prompts or {}).get(key, 0) * count
            hits = (cached or {}).get(key, 0) * count
            record = KeyRate(
                key,
                start,
                start + window_ms,
                count,
                rate,
                prompt_tokens_sum=tokens,
                cached_tokens_sum=hits,
            )
            producer.produce(topic, key=key.encode(), value=codec.encode(record))
    assert producer.flush(30) == 0


@dataclass
class PlannerProcess:
    """One `cacheroute planner run` subprocess."""

    proc: subprocess.Popen[bytes]
    metrics_port: int
    log: Path
    planner_id: str

    def metric(self, name: str, labels: str = "") -> float:
        """Value of one Prometheus sample (0 when absent or the process is down)."""
        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=2
            ) as resp:
                text = resp.read().decode()
        except OSError:
            return 0.0
        want = f"{name}{{{labels}}}" if labels else name
        for line in text.splitlines():
            head, _, value = line.rpartition(" ")
            if head == want:
                return float(value)
        return 0.0

    def wait_metric(
        self, name: str, at_least: float, labels: str = "", timeout: float = 60.0
    ) -> float:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = self.metric(name, labels)
            if value >= at_least:
                return value
            if self.proc.poll() is not None:
                raise AssertionError(f"{self.planner_id} exited:\n{self.tail()}")
            time.sleep(0.2)
        raise AssertionError(f"{name} stayed below {at_least}; log:\n{self.tail()}")

    def tail(self, lines: int = 60) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


@contextmanager
def planner_process(
    settings: Settings, config: Path, planner_id: str, log_dir: Path
) -> Iterator[PlannerProcess]:
    """Run `cacheroute planner run --config CONFIG`; always stopped (SIGKILL by pid at the end)."""
    port = free_port()
    log = log_dir / f"planner-{planner_id}.log"
    env = {
        **os.environ,
        "CACHEROUTE_BOOTSTRAP": settings.bootstrap,
        "CACHEROUTE_TOPIC_PREFIX": settings.topic_prefix,
        "COLUMNS": "200",
    }
    argv = [sys.executable, "-m", "cacheroute", "planner", "run", "--config", str(config)]
    argv += ["--planner-id", planner_id, "--metrics-port", str(port)]
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO)
    try:
        yield PlannerProcess(proc, port, log, planner_id)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


def publish_and_die(argv: Sequence[str]) -> None:
    """Publish a plan and SIGKILL this process after `--kill-after` chunks were sent."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--txid", required=True)
    parser.add_argument("--keys", type=int, default=20_000)
    parser.add_argument("--kill-after", type=int, default=5)
    args = parser.parse_args(argv)
    settings = Settings.from_env(bootstrap=args.bootstrap, topic_prefix=args.prefix)

    def on_chunk(index: int, total: int) -> None:
        if index + 1 == args.kill_after:
            time.sleep(1.0)  # linger is 20 ms: the chunks produced so far reach the broker
            print(f"killing myself after chunk {index + 1} of {total}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

    publisher = PlanPublisher(
        settings, transactional_id=args.txid, max_chunk_bytes=8192, on_chunk=on_chunk
    )
    recovery = publisher.start()
    publisher.publish(make_plan(args.keys, version=recovery.next_version, seed=7))
    raise SystemExit("the publish finished although it should have been killed")


if __name__ == "__main__":
    if sys.argv[1:2] == ["publish-and-die"]:
        publish_and_die(sys.argv[2:])
    else:
        raise SystemExit("usage: planservice_support publish-and-die --bootstrap ... --txid ...")
