"""One gateway process for test_dispatcher_kafka.py: follow plans, route keys, report.

Arguments: bootstrap topic_prefix seed keys_file out_dir versions...
For each version V in `versions`: wait until the dispatcher runs on version >= V, route every key of
keys_file 5 times (holding a random number of requests in flight, so gateways see different loads),
write out_dir/<pid>-v<V>.json = {"version": live version, "choices": {key: [destinations]},
"spilled": {key: [destinations]}} - a route the dispatcher spilled off an overloaded member (it
took the cold path) is listed under "spilled", not "choices".
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from pathlib import Path

from cacheroute.dispatcher.dispatcher import Dispatcher
from cacheroute.dispatcher.routing import RouteKind
from cacheroute.settings import Settings

bootstrap, prefix, seed_text, keys_file, out_dir = sys.argv[1:6]
versions = [int(v) for v in sys.argv[6:]]
settings = Settings.from_env(bootstrap=bootstrap, topic_prefix=prefix)
keys = json.loads(Path(keys_file).read_text())
rng = random.Random(int(seed_text))
names = [f"gpu-{i}" for i in range(8)]
dispatcher = Dispatcher(names, rng=random.Random(int(seed_text) + 1)).follow(settings)
for version in versions:
    deadline = time.monotonic() + 60
    while (dispatcher.version or 0) < version:
        if time.monotonic() > deadline:
            sys.exit(f"never reached version {version} (at {dispatcher.version})")
        time.sleep(0.05)
    choices: dict[str, list[str]] = {}
    spilled: dict[str, list[str]] = {}
    held: list[int] = []
    counts = dispatcher.router.counts
    for _ in range(5):
        for key in keys:
            before = counts[RouteKind.SPILLED]
            i = dispatcher.route_index(key)
            into = spilled if counts[RouteKind.SPILLED] != before else choices
            into.setdefault(key, []).append(dispatcher.router.names[i])
            dispatcher.acquire(i)
            held.append(i)
            while len(held) > rng.randint(0, 40):
                dispatcher.release(held.pop(rng.randrange(len(held))))
    out = {
        "version": dispatcher.version,
        "choices": choices,
        "spilled": spilled,
        "counts": dispatcher.router.counts,
    }
    Path(out_dir, f"{os.getpid()}-v{version}.json").write_text(json.dumps(out))
dispatcher.close()
