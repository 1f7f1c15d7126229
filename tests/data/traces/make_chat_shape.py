"""Write `chat_shape_6000.jsonl`: a Mooncake-format trace in the shape of public long-context chat
traces (python tests/data/traces/make_chat_shape.py --help).

Why it exists: the evidence's other conversation trace (`conversation_mooncake_6000.jsonl`) comes
from our own `conversation` workload, where 100 tenants each put a multi-block system prompt in
front of their conversations, so a key of the first 2 blocks is a tenant. Public chat traces
(Mooncake's FAST'25 conversation trace, for one) look different, and a router has to work on
those too:

- ONE shared system-prompt block (id 0) in front of every request, so the first 2 blocks name a
  conversation, not a tenant: thousands of keys of a few requests each, that start and end;
- a turn's prompt is the previous turn's prompt and answer plus a new message, so it extends the
  history's blocks; 3.5 turns a conversation on average, a quarter of them a single request;
- first prompts log-normal around 6k tokens (documents pasted in), p99 near 80k; answers
  log-normal around 350 tokens; think times exponential, mean 90 s;
- arrival times in whole 3 s steps, as that trace stores them (bursts of simultaneous arrivals).

Deterministic for a seed. Not a copy of any trace: only its published shape.

`--style sampled` writes a variant closer to what two slices of Mooncake's conversation trace
show (read in the public repository, not copied): a prompt's last, partial block has an id of its
own, as block hashing gives it (so a short prompt is two blocks, 0 and its own); about 35% of
requests continue a conversation (mean 1.6 requests each; some run to 9 turns); think times
log-normal around 150 s; a turn's new message log-normal around 250 tokens with a heavy tail
(documents pasted in later turns). In the evidence as `chat_sampled_6000.jsonl` (`--style
sampled --requests 6000 --seed 7`): where most requests start a conversation, and a plan admits
few of the keys that matter.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

BLOCK = 512


def generate(n: int, seed: int) -> list[tuple[float, int, int, list[int]]]:
    """(time s, input tokens, output tokens, block ids) of `n` requests, by arrival time."""
    rng = np.random.default_rng(seed)
    out: list[tuple[float, int, int, list[int]]] = []
    next_block = 1
    t = 0.0
    conversations_per_s = n / 3600.0 / 2.2  # (3.5 turns each: n requests in about 40 minutes)
    while len(out) < n:
        t += rng.exponential(1.0 / conversations_per_s)
        # a mix: 55% short chats (mean 2.2 turns), 45% long ones (mean 5)
        turns = int(rng.geometric(0.45)) if rng.random() < 0.55 else 1 + int(rng.geometric(0.25))
        prompt = int(min(max(rng.lognormal(np.log(6000.0), 1.1), 600.0), 120_000.0))
        history: list[int] = []
        at, answer = t, 0
        for k in range(turns):
            if k:
                prompt = min(prompt + answer + int(rng.lognormal(np.log(300.0), 1.0)), 128_000)
            full = prompt // BLOCK
            need = max(0, full - 1 - len(history))
            history = history[: full - 1] + list(range(next_block, next_block + need))
            next_block += need
            answer = int(min(2000.0, max(1.0, rng.lognormal(np.log(350.0), 0.8))))
            out.append((at, prompt, answer, [0, *history[: full - 1]]))
            at += rng.exponential(90.0)
    out.sort(key=lambda r: r[0])
    return out[:n]


def generate_sampled(n: int, seed: int) -> list[tuple[float, int, int, list[int]]]:
    """`--style sampled` (see the module docstring): `n` requests of conversations that start
    over 75 minutes, by arrival time."""
    rng = np.random.default_rng(seed)
    out: list[tuple[float, int, int, list[int]]] = []
    next_block = 1
    t = 0.0
    conversations_per_s = n / 3600.0 / 1.65
    while t < 4500.0:
        t += rng.exponential(1.0 / conversations_per_s)
        # 75% short (mean 1.25 requests), 25% long (mean 3)
        turns = int(rng.geometric(0.8)) if rng.random() < 0.75 else int(rng.geometric(0.33))
        prompt = int(min(max(rng.lognormal(np.log(5000.0), 1.25), 880.0), 126_000.0))
        full_ids: list[int] = []  # ids of the history's whole blocks (index 0: the shared one)
        at, answer = t, 0
        for k in range(turns):
            if k:
                message = int(min(rng.lognormal(np.log(250.0), 1.6), 60_000.0))
                prompt = min(prompt + answer + message, 128_000)
            full = prompt // BLOCK
            need = max(0, full - len(full_ids))
            full_ids = full_ids[:full] + list(range(next_block, next_block + need))
            next_block += need
            ids = [0, *full_ids[1:full]]
            if prompt % BLOCK:  # the partial last block: its own id, never reused
                ids.append(next_block)
                next_block += 1
            answer = int(min(2000.0, max(1.0, rng.lognormal(np.log(300.0), 1.0))))
            out.append((at, prompt, answer, ids))
            at += rng.lognormal(np.log(150.0), 0.8)
    out.sort(key=lambda r: r[0])
    return out[:n]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=6000)
    ap.add_argument("--seed", type=int, default=2026)
    ap.add_argument("--out", type=Path, default=Path(__file__).with_name("chat_shape_6000.jsonl"))
    ap.add_argument(
        "--style",
        choices=["chat", "sampled"],
        default="chat",
        help="chat: the evidence's trace; sampled: closer to slices of Mooncake's trace",
    )
    args = ap.parse_args()
    make = generate_sampled if args.style == "sampled" else generate
    rows = make(args.requests, args.seed)
    t0 = rows[0][0]
    with args.out.open("w") as f:
        for at, prompt, answer, blocks in rows:
            ms = int((at - t0) // 3.0 * 3000)
            row = {"timestamp": ms, "input_length": prompt, "output_length": answer}
            f.write(json.dumps({**row, "hash_ids": blocks}) + "\n")
    p = np.percentile([r[1] for r in rows], [50, 90, 99])
    print(
        f"{len(rows)} requests -> {args.out}; prompt p50/p90/p99 {p[0]:.0f}/{p[1]:.0f}/{p[2]:.0f}"
    )


if __name__ == "__main__":
    main()
