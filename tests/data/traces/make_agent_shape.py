"""Write `agent_shape_6000.jsonl`: a Mooncake-format trace in the shape of tool-using agent traffic
(python tests/data/traces/make_agent_shape.py --help).

Why it exists: the evidence's chat traces have human think times (tens of seconds to minutes
between turns). Agent traffic, as Mooncake's published tool&agent trace describes it (about
23.6k requests an hour, mean input ~8.6k tokens, mean output ~180 tokens, a higher prefix reuse
than its conversation trace), is different, and a router has to work on it too:

- a few dozen agent applications, each with a long system prompt of tool schemas (2-12 blocks),
  with Zipf-like popularity: the first 2 blocks name an application, so a handful of heavy keys
  whose sessions a plan must spread over replicas while keeping each session on one;
- a session is a chain of steps; each step's prompt is the previous prompt plus the model's
  answer (a tool call, ~180 tokens) plus the tool's result (log-normal around 350 tokens, heavy
  tail), so it extends the history's blocks; 6 steps a session on average, at most 40;
- steps follow each other within seconds (the model's own latency plus the tool's: 1 s + an
  exponential of mean 4 s), not human think times: a session's next request usually arrives
  before the next plan, and while the previous one may still be in flight elsewhere;
- a prompt's partial last block has an id of its own, as block hashing gives it;
- arrival times in milliseconds.

Deterministic for a seed. Not a copy of any trace: only a published shape, with numbers chosen
where none is published (said above).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

BLOCK = 512


def generate(n: int, seed: int, apps: int = 40) -> list[tuple[float, int, int, list[int]]]:
    """(time s, input tokens, output tokens, block ids) of `n` requests, by arrival time."""
    rng = np.random.default_rng(seed)
    popularity = 1.0 / np.arange(1, apps + 1) ** 1.1
    popularity /= popularity.sum()
    system_blocks = rng.integers(2, 13, size=apps)
    next_block = 0
    system_ids: list[list[int]] = []
    for k in system_blocks.tolist():
        system_ids.append(list(range(next_block, next_block + k)))
        next_block += k
    out: list[tuple[float, int, int, list[int]]] = []
    sessions_per_s = n / 3600.0 / 6.0  # (6 steps each: n requests in about an hour)
    t = 0.0
    while len(out) < n * 1.05:
        t += rng.exponential(1.0 / sessions_per_s)
        app = int(rng.choice(apps, p=popularity))
        steps = min(40, int(rng.geometric(1.0 / 6.0)))
        system = system_ids[app]
        # the task: a user message, some context pasted in
        prompt = len(system) * BLOCK + int(min(rng.lognormal(np.log(800.0), 1.0), 40_000.0))
        own: list[int] = []  # ids of the session's whole blocks after the system prompt
        at, answer = t, 0
        for k in range(steps):
            if k:
                result = int(min(rng.lognormal(np.log(350.0), 1.0), 20_000.0))
                prompt = min(prompt + answer + result, 128_000)
            full = prompt // BLOCK - len(system)
            need = max(0, full - len(own))
            own = own[:full] + list(range(next_block, next_block + need))
            next_block += need
            ids = [*system, *own[:full]]
            if prompt % BLOCK:  # the partial last block: its own id, never reused
                ids.append(next_block)
                next_block += 1
            answer = int(min(1500.0, max(8.0, rng.lognormal(np.log(150.0), 0.7))))
            out.append((at, prompt, answer, ids))
            at += 1.0 + rng.exponential(4.0)
    out.sort(key=lambda r: r[0])
    return out[:n]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=6000)
    ap.add_argument("--seed", type=int, default=2026)
    ap.add_argument("--apps", type=int, default=40, help="agent applications (system prompts)")
    ap.add_argument("--out", type=Path, default=Path(__file__).with_name("agent_shape_6000.jsonl"))
    args = ap.parse_args()
    rows = generate(args.requests, args.seed, args.apps)
    t0 = rows[0][0]
    with args.out.open("w") as f:
        for at, prompt, answer, blocks in rows:
            row = {"timestamp": round((at - t0) * 1000), "input_length": prompt}
            f.write(json.dumps({**row, "output_length": answer, "hash_ids": blocks}) + "\n")
    p = np.percentile([r[1] for r in rows], [50, 90, 99])
    mean_in = np.mean([r[1] for r in rows])
    mean_out = np.mean([r[2] for r in rows])
    print(
        f"{len(rows)} requests -> {args.out}; prompt p50/p90/p99 {p[0]:.0f}/{p[1]:.0f}/{p[2]:.0f}, "
        f"mean input {mean_in:.0f}, mean output {mean_out:.0f}"
    )


if __name__ == "__main__":
    main()
