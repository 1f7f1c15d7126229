"""Write `tenant_chat_6000.jsonl`: a Mooncake-format long-context chat trace where the first two
blocks name a tenant, not a conversation (python tests/data/traces/make_tenant_chat.py --help).

Why it exists: in the evidence's other chat traces the first 2 blocks name a conversation
(`chat_shape_6000.jsonl`) or one of 100 tenants (`conversation_mooncake_6000.jsonl`). A fleet with
a few tenants, each with a system prompt of several blocks, is keyed by `evaluate --trace` (first
2 blocks, with session hints) into a handful of heavy keys whose conversations must be spread
over each key's replicas. A plan of so few keys is hard to balance, and at 16 gateways no
dispatcher sees enough of the in-flight load to correct it: this trace is where the sizing of
replicas (`planner.params.DEFAULT_FAIR_SHARE`) was found to matter.

Shape (deterministic for a seed; not a copy of any trace):

- 8 tenants with shares 40/20/12/10/8/5/3/2 %, each a system prompt of `--system-blocks` blocks
  (default 4) in front of all of its conversations;
- conversations start as a Poisson process (1 a second); turns per conversation Pareto
  (shape 1.3, at most 40); each turn appends a new message of log-normal blocks (median ~4.5
  blocks, about 2.3k tokens) to the history, so a turn's prompt extends the previous one's blocks;
  a conversation stops growing at 200 blocks (~100k tokens);
- think times 5 s plus exponential (mean 30 s); answers log-normal around 150 tokens;
- prompts p50 ~9.2k, p90 ~46k, p99 ~93k tokens for the default seed (6,000 requests).
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

BLOCK = 512
SHARES = (0.40, 0.20, 0.12, 0.10, 0.08, 0.05, 0.03, 0.02)
MAX_BLOCKS = 200


def generate(requests: int, seed: int, system_blocks: int) -> list[dict[str, object]]:
    """The trace's first `requests` requests, in time order."""
    rng = random.Random(seed)
    tenants = [list(range(i * 100_000 + 1, i * 100_000 + 1 + system_blocks)) for i in range(8)]
    next_id = 10**7
    events: list[tuple[float, int, int, list[int]]] = []
    start = 0.0
    while len(events) < 2 * requests:
        start += rng.expovariate(1.0)
        ids = list(tenants[rng.choices(range(8), SHARES)[0]])
        t = start
        for _ in range(min(40, int(rng.paretovariate(1.3)))):
            add = max(1, int(rng.lognormvariate(1.5, 1.0)))
            ids = ids + list(range(next_id, next_id + add))
            next_id += add
            if len(ids) > MAX_BLOCKS:
                break
            prompt = len(ids) * BLOCK - rng.randint(0, BLOCK - 1)
            events.append((t, prompt, int(rng.lognormvariate(5.0, 0.8)), ids))  # never mutated
            t += rng.expovariate(1 / 30.0) + 5.0
    events.sort(key=lambda e: e[0])
    return [
        {"timestamp": int(t * 1000), "input_length": p, "output_length": o, "hash_ids": ids}
        for t, p, o, ids in events[:requests]
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=6000)
    parser.add_argument("--seed", type=int, default=2)
    parser.add_argument("--system-blocks", type=int, default=4)
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).with_name("tenant_chat_6000.jsonl")
    )
    args = parser.parse_args()
    rows = generate(args.requests, args.seed, args.system_blocks)
    with args.out.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    lengths = sorted(int(r["input_length"]) for r in rows)  # type: ignore[call-overload]
    n = len(lengths)
    print(
        f"{n} requests -> {args.out}; prompt tokens p50 {lengths[n // 2]}, "
        f"p90 {lengths[int(0.9 * n)]}, p99 {lengths[int(0.99 * n)]}"
    )


if __name__ == "__main__":
    main()
