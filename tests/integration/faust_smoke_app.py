"""A tiny faust-streaming app run by test_faust_kafka.py in its own process.

It counts input values in a Table (so faust creates and writes a changelog topic on our broker),
and after N events writes the counts to an output topic and exits. Arguments:
bootstrap app_id in_topic out_topic n
"""

from __future__ import annotations

import os
import sys

import faust

bootstrap, app_id, in_topic, out_topic, n_text = sys.argv[1:6]
expected = int(n_text)

app = faust.App(
    app_id,
    broker=f"kafka://{bootstrap}",
    web_enabled=False,
    store="memory://",
    topic_partitions=1,
    broker_session_timeout=10,
    broker_heartbeat_interval=1,
)
source = app.topic(in_topic, value_type=bytes, value_serializer="raw", partitions=1)
sink = app.topic(out_topic, value_type=bytes, value_serializer="raw", partitions=1)
counts = app.Table("counts", default=int, partitions=1)


@app.agent(source)
async def count(stream):  # type: ignore[no-untyped-def]
    seen = 0
    async for value in stream:
        word = value.decode()
        counts[word] += 1
        seen += 1
        if seen == expected:
            summary = ",".join(f"{k}={counts[k]}" for k in sorted(counts.keys()))
            fut = await sink.send(value=summary.encode())
            await fut
            await app.producer.flush()
            os._exit(0)  # the harness is done; skip faust's slow graceful shutdown


if __name__ == "__main__":
    sys.argv = [sys.argv[0], "worker", "-l", "warn", "--without-web"]
    app.main()
