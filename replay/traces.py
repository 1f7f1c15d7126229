"""Trace readers (Mooncake and Bailian JSONL, Azure CSV, generic CSV/JSONL) into a RequestSet.

* **Mooncake** (kvcache-ai/Mooncake FAST'25 traces): one JSON object a line with `timestamp` (ms),
  `input_length`, `output_length` and `hash_ids`, one id per 512-token block of the prompt (equal
  ids = identical prefix). The routing key is the first `key_blocks` ids joined by `-` (the first
  block alone is a poor key on production data: a handful of shared system prompts), or with
  `key_blocks=SESSION_KEYS` (0) what a gateway keying on "system prompt + first message" gets
  (`session_keys`). Only full blocks are cacheable: the id of a partial last block is dropped.
* **Bailian** (Alibaba's Qwen usage traces, alibaba-edu/qwen-bailian-usagetraces-anon): multi-turn
  conversations as Mooncake's fields with `timestamp` in seconds, hash ids of 16-token blocks,
  and `chat_id`, `parent_chat_id`, `turn`, `type`. The ids are merged into 512-token blocks
  (`blockhash`); keys as Mooncake's; the chat id chains name each request's conversation.
* **Azure** (Azure Public Dataset, AzureLLMInferenceTrace 2023): `TIMESTAMP,ContextTokens,
  GeneratedTokens` - token counts only, no prefixes. Keys are synthetic: each request draws a key
  from a paper-like skewed distribution over `keys` keys, and the key's reusable prefix
  (log-normal around `prefix_tokens`, capped by the context) is shared by all its requests; the
  rest of each prompt is unique. The report says so.
* **generic** (CSV with a header, or JSONL): `ts` (seconds), `key`, `prompt_tokens`,
  `prefix_tokens`, optionally `output_tokens` (default 128) and `hash_ids` (JSONL list, or
  space-separated in CSV) with `block_tokens`. Without hash ids, the first `prefix_tokens` of a
  key's prompts are taken to be the same content for every request of that key (block j of key k
  is shared), and the rest unique. `cacheroute workload generate` writes this format, with ids.

`declared prefix` of a Mooncake request = its leading blocks already seen earlier in the trace
(the infinite-cache hit ceiling); of an Azure request = its key's prefix after the key's first
request.
"""

from __future__ import annotations

import csv
import math
import re
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from itertools import chain, islice
from pathlib import Path
from typing import Any, Literal

import numpy as np
import orjson

from cacheroute.planner.workload import paper_workload
from cacheroute.replay.blockhash import BlockMerger, infer_block_tokens
from cacheroute.replay.errors import ReplayError
from cacheroute.replay.requestset import IntArray, RequestSet, make_request_set
from cacheroute.replay.tracefiles import READ_ERRORS, data_suffix, open_trace

__all__ = [
    "BLOCK_KEY_FORMATS",
    "TRACE_FORMATS",
    "TraceFormat",
    "read_azure",
    "read_bailian",
    "read_generic",
    "read_mooncake",
    "read_trace",
    "require_arrivals",
    "require_one_clock",
]

TraceFormat = Literal["mooncake", "bailian", "azure", "csv"]
TRACE_FORMATS: tuple[TraceFormat, ...] = ("mooncake", "bailian", "azure", "csv")
BLOCK_KEY_FORMATS: tuple[TraceFormat, ...] = ("mooncake", "bailian")
"""Formats whose routing keys are leading block ids (`key_blocks`, session keys and hints)."""
MOONCAKE_BLOCK_TOKENS = 512
_DEFAULT_OUTPUT = 128


def read_trace(
    path: Path,
    fmt: TraceFormat,
    *,
    rng: np.random.Generator,
    key_blocks: int = 2,
    limit: int | None = None,
    keys: int = 1000,
    prefix_tokens: float = 1024.0,
    block_tokens: int = 512,
) -> RequestSet:
    """Read `path` in format `fmt` (see the module docstring for each format's options).

    Refuses a trace whose requests all carry the same timestamp (`require_arrivals`), or whose
    time is nearly all one pause, a clock off in a few records (`require_one_clock`)."""
    if fmt == "mooncake":
        out = read_mooncake(path, key_blocks=key_blocks, limit=limit)
    elif fmt == "bailian":
        out = read_bailian(path, key_blocks=key_blocks, limit=limit)
    elif fmt == "azure":
        out = read_azure(
            path,
            rng,
            keys=keys,
            prefix_tokens=prefix_tokens,
            block_tokens=block_tokens,
            limit=limit,
        )
    elif fmt == "csv":
        out = read_generic(path, block_tokens=block_tokens, limit=limit)
    else:
        raise ReplayError(f"unknown trace format {fmt!r}; choose from {', '.join(TRACE_FORMATS)}")
    require_arrivals(out, str(path))
    require_one_clock(out, str(path))
    return out


def require_arrivals(requests: RequestSet, what: str) -> None:
    """Raise `ReplayError` when more than one request arrives and all at the same instant.

    Every replay rescales time to reach an offered load (req/s = requests / duration), so a
    trace without an arrival process has no load to rescale: it used to run as one burst of
    every request within a second and report meaningless capacities (an SLO of minutes, a
    16x "win"). A trace whose times are coarse (whole seconds, 3 s steps) is fine.
    """
    if requests.n > 1 and requests.duration <= 0:
        raise ReplayError(
            f"{what}: all {requests.n:,} requests have the same timestamp "
            f"({float(requests.times[0]) * 1000:.0f} ms), "
            "so there is no arrival rate to replay or rescale; give each request its arrival "
            "time (Mooncake `timestamp` in ms, Azure `TIMESTAMP`, generic `ts` in seconds)"
        )


ONE_CLOCK_STRETCH = 10.0
"""`require_one_clock` refuses a trace whose span is more than this many times the span of its
central requests (all but the first and last 1%)."""
_ONE_CLOCK_MIN_REQUESTS = 20


def require_one_clock(requests: RequestSet, what: str) -> None:
    """Raise `ReplayError` when a few records lie far in time from all the others.

    Why: every replay rescales time by the trace's mean rate (requests / span), so one record
    whose clock is off - a timestamp a day, or a thousand years, from the others - stretches the
    span and silently turns the replay into one burst of everything else: the capacities, the
    auto SLO and the verdict all came out plausible-looking and wrong (one record at 1e18 ms in
    a 2,000-request trace: Flat-LB 49 req/s instead of 27, an auto SLO of 240 s instead of
    21 s). The test: the whole span against the span of the central requests (all but the first
    and last 1%, at least one each side), so any number of such records, early or late, count.
    A trace whose first or last 1% really is spread that thin has no one mean rate either; the
    message says which records lie outside, by their timestamps, and the user decides.
    """
    n = requests.n
    if n < _ONE_CLOCK_MIN_REQUESTS:
        return
    times = requests.times
    k = max(1, n // 100)
    lo, hi = float(times[k]), float(times[n - 1 - k])
    core = hi - lo
    span = float(times[-1] - times[0])
    if span <= ONE_CLOCK_STRETCH * core:
        return
    reach = max(core, 1e-9)
    early = times[times < lo - reach]
    late = times[times > hi + reach]
    parts = []
    if early.size:
        parts.append(
            f"{early.size:,} record(s) from {float(early[0]):.6g} s, up to "
            f"{_span(lo - float(early[-1]))} before the rest"
        )
    if late.size:
        parts.append(
            f"{late.size:,} record(s) up to {float(late[-1]):.6g} s, up to "
            f"{_span(float(late[-1]) - hi)} after the rest"
        )
    raise ReplayError(
        f"{what}: {' and '.join(parts)}; the other requests span {_span(core)}, the whole trace "
        f"{_span(span)}. Its mean rate, and every load a replay rescales from it, would be "
        "meaningless. A clock is probably off in those records: fix or remove them (times here "
        "are in seconds; a trace with a real pause that long is two traces: "
        "evaluate each)"
    )


def _span(seconds: float) -> str:
    """Seconds as a person reads a duration."""
    for unit, size in (("years", 365.25 * 86400), ("days", 86400.0), ("h", 3600.0), ("min", 60.0)):
        if seconds >= size:
            return f"{seconds / size:.3g} {unit}"
    return f"{seconds:.3g} s"


def _lines(path: Path, limit: int | None) -> Iterator[tuple[int, bytes]]:
    try:
        with open_trace(path, text=False) as fh:
            for n, line in enumerate(fh, start=1):
                if limit is not None and n > limit:
                    return
                if line.strip():
                    yield n, line
    except READ_ERRORS as exc:
        raise ReplayError(f"cannot read trace {path}: {exc}") from None


def _json(path: Path, n: int, line: bytes) -> dict[str, Any]:
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        raise ReplayError(f"{path}:{n}: not JSON ({exc})") from None
    if not isinstance(obj, dict):
        raise ReplayError(f"{path}:{n}: expected a JSON object")
    return obj


SESSION_KEYS = 0
"""`key_blocks` value for session keys (`session_keys`)."""


def session_keys(block_lists: Sequence[Sequence[int]], firsts: Sequence[int]) -> list[str]:
    """Routing keys that follow conversations: `mc-<first id>.<shared prefix>/<first own block>`.

    A gateway in front of a chat service keys a request on its system prompt plus first user
    message (README, "Routing key"): every turn of a conversation then has the same key, and its
    tenant (the system prompt) is the key's group. A block trace has no message boundaries, so
    this finds them from the whole trace. Build the tree of every request's full blocks; a node
    where requests part ways (two or more distinct next blocks) ends a prefix they share (a system
    prompt, a shared document, a conversation's history before different questions). Walking
    a request's path from its deepest such node up, the key is the first split whose next block
    on the path recurs (two or more requests pass through it): that block opens a conversation.
    Later turns extend the same path, so they get the same key. A request whose split block
    never recurs (a one-off question) keys on its deepest shared prefix alone, the group's key;
    a request that shares nothing keys on its first id; `firsts` is each request's first id,
    partial or not, for requests with no full block.
    """
    child: dict[tuple[int, int], int] = {}
    fanout: list[int] = [0]  # distinct next blocks per node; node 0 is the root
    passes: list[int] = [0]  # requests whose path goes through each node
    paths: list[list[int]] = []
    for ids in block_lists:
        node = 0
        path = []
        for b in ids:
            nxt = child.get((node, b))
            if nxt is None:
                nxt = len(fanout)
                child[(node, b)] = nxt
                fanout.append(0)
                passes.append(0)
                fanout[node] += 1
            passes[nxt] += 1
            node = nxt
            path.append(node)
        paths.append(path)
    keys: list[str] = []
    for ids, path, first in zip(block_lists, paths, firsts, strict=True):
        key = f"mc-{ids[0]}" if ids else f"mc-{first}"
        deepest = 0
        for depth in range(len(path), 0, -1):  # `depth` blocks are shared at this split
            split = path[depth - 1]
            if fanout[split] < 2:
                continue
            if depth < len(path) and passes[path[depth]] >= 2:
                key = f"mc-{ids[0]}.{split}/{ids[depth]}"
                break
            deepest = deepest or split
        else:
            if deepest:
                key = f"mc-{ids[0]}.{deepest}/"
        keys.append(key)
    return keys


def session_hints(requests: RequestSet) -> tuple[str, ...]:
    """Each request's conversation, found from its blocks as `session_keys` finds session keys.

    What a gateway whose routing key is coarser than a conversation (a tenant header, the
    leading blocks of a shared system prompt) also knows about a request: the hash of its system
    prompt plus first message. `Router.route_index(key, session)` uses it to keep a conversation
    on one replica of its key. A request with no full block is its own session. A trace that
    names its conversations (`RequestSet.conversations`) gives them instead: no guess needed.
    """
    q = requests
    if q.conversations is not None:
        return q.conversations
    offsets = q.block_offsets.tolist()
    ids = q.block_ids.tolist()
    lists = [ids[offsets[i] : offsets[i + 1]] for i in range(q.n)]
    firsts = [-(i + 1) for i in range(q.n)]
    return tuple(session_keys(lists, firsts))


def read_mooncake(path: Path, *, key_blocks: int = 2, limit: int | None = None) -> RequestSet:
    """A Mooncake JSONL trace; key = the first `key_blocks` hash ids, or session keys (0).

    Ids at a finer block than Mooncake's 512 tokens (a trace converted from another source) are
    found (`blockhash.infer_block_tokens`) and merged into 512-token blocks."""
    rows = _block_rows(path, limit, "Mooncake", "timestamp (ms)", 1000.0)
    return _block_trace(path, rows, key_blocks, "Mooncake", strict_blocks=False)


def read_bailian(path: Path, *, key_blocks: int = 2, limit: int | None = None) -> RequestSet:
    """An Alibaba Bailian (Qwen) usage trace: Mooncake's fields, `timestamp` in seconds, hash ids
    of 16-token blocks (found from the data, `blockhash.infer_block_tokens`) merged into 512-token
    ones. `chat_id` / `parent_chat_id` chains name each request's conversation (its first chat;
    `RequestSet.conversations`), what a gateway keying on a session id knows, so session hints
    need no guess from the blocks. Keys as `read_mooncake`; `turn` and `type` are not used."""
    rows = _block_rows(path, limit, "Bailian", "timestamp (s)", 1.0)
    return _block_trace(path, rows, key_blocks, "Bailian", strict_blocks=True)


_BlockRow = tuple[float, int, int, list[int], int | str | None, int | str | None]
"""(arrival s, input_length, output_length, hash_ids, chat_id, parent_chat_id); the ids are
None where the trace has none (Mooncake's; a first turn's parent)."""

_SIZE_SAMPLE = 4096
"""Requests a block-hash reader looks at to find the block size of the trace's ids."""


def _block_rows(
    path: Path, limit: int | None, what: str, time_field: str, units_per_second: float
) -> Iterator[_BlockRow]:
    """Each line of a block-hash trace as a `_BlockRow`."""
    for n, line in _lines(path, limit):
        obj = _json(path, n, line)
        try:
            ts = float(obj["timestamp"]) / units_per_second
            p = int(obj["input_length"])
            o = int(obj["output_length"])
            ids = [int(x) for x in obj["hash_ids"]]
        except KeyError as exc:
            raise ReplayError(
                f"{path}:{n}: {what} record without {exc}; each line needs {time_field}, "
                "input_length, output_length and hash_ids"
            ) from None
        except (TypeError, ValueError) as exc:
            raise ReplayError(f"{path}:{n}: bad {what} record ({exc!r})") from None
        if p < 1 or not ids:
            raise ReplayError(f"{path}:{n}: input_length and hash_ids must be non-empty")
        if not math.isfinite(ts):
            raise ReplayError(f"{path}:{n}: timestamp {obj['timestamp']!r} is not a finite number")
        chat, parent = obj.get("chat_id"), obj.get("parent_chat_id")
        yield ts, p, o, ids, _chat_id(chat), _chat_id(parent)


def _chat_id(value: object) -> int | str | None:
    """A chat id as a trace gives it (int or text); None for none, -1 or anything else."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        return None
    return None if value in (-1, "-1", "") else value


def _block_trace(
    path: Path, rows: Iterator[_BlockRow], key_blocks: int, what: str, *, strict_blocks: bool
) -> RequestSet:
    """A RequestSet from block-hash rows, in 512-token blocks; see `read_mooncake` for keys.

    The ids' block size is found on the first `_SIZE_SAMPLE` requests; finer ids are merged
    as each request is read. `strict_blocks`: refuse ids that fit no block size (Bailian);
    otherwise such ids are taken as 512-token blocks, the Mooncake format's definition."""
    if key_blocks < 0:
        raise ReplayError("key_blocks must be >= 1 (or 0: session keys)")
    b = MOONCAKE_BLOCK_TOKENS
    head = list(islice(rows, _SIZE_SAMPLE))
    if not head:
        raise ReplayError(f"{path}: no requests")
    try:
        fine = infer_block_tokens([r[1] for r in head], [len(r[3]) for r in head])
    except ReplayError as exc:
        if strict_blocks:
            raise ReplayError(f"{path}: {exc}") from None
        fine = b
    merger = BlockMerger(fine, b) if fine < b else None
    times: list[float] = []
    prompt: list[int] = []
    output: list[int] = []
    keys: list[str] = []
    blocks: list[list[int]] = []
    prefix: list[int] = []
    firsts: list[int] = []
    seen: set[int] = set()
    roots: dict[int | str, int | str] = {}  # chat id -> the first chat of its conversation
    conversations: list[str] | None = []
    for t, p, o, raw, chat, parent in chain(head, rows):
        if conversations is not None:
            if chat is None:
                conversations = None  # a trace without chat ids: conversations from blocks
            else:
                root = chat if parent is None else roots.get(parent, parent)
                roots[chat] = root
                conversations.append(f"chat-{root}")
        ids, n_full = merger.add(raw, p) if merger else (raw, min(len(raw), p // b))
        full = ids[:n_full]
        reused = 0
        while reused < len(full) and full[reused] in seen:
            reused += 1
        seen.update(full)
        times.append(t)
        prompt.append(p)
        output.append(o)
        keys.append("mc-" + "-".join(str(x) for x in ids[: max(key_blocks, 1)]))
        firsts.append(ids[0])
        blocks.append(full)
        prefix.append(reused * b)
    if key_blocks == SESSION_KEYS:
        keys = session_keys(blocks, firsts)
    how = (
        "session keys: shared prefix / first own block"
        if key_blocks == SESSION_KEYS
        else (f"key = first {key_blocks} block ids")
    )
    if fine < b:
        how = f"{fine}-token hash ids merged into {b}-token blocks; {how}"
    return make_request_set(
        times=times,
        keys=keys,
        prompt_tokens=prompt,
        output_tokens=output,
        block_lists=blocks,
        prefix_tokens=prefix,
        block_tokens=b,
        source=f"{what} trace {path.name} ({how})",
        conversations=conversations,
    )


_EXTRA_DIGITS = re.compile(r"(\.\d{6})\d+")


def _azure_time(raw: str) -> float:
    # the trace has 7 fractional digits; datetime takes at most 6 (a zone after them is kept)
    text = _EXTRA_DIGITS.sub(r"\1", raw.strip())
    stamp = datetime.fromisoformat(text)
    if stamp.tzinfo is None:  # the published trace: no zone, the trace's own clock
        return stamp.replace(tzinfo=UTC).timestamp()
    return stamp.timestamp()  # a zone given (an export in local time): honoured, not dropped


def read_azure(
    path: Path,
    rng: np.random.Generator,
    *,
    keys: int = 1000,
    prefix_tokens: float = 1024.0,
    block_tokens: int = 512,
    limit: int | None = None,
) -> RequestSet:
    """An Azure LLM inference CSV trace with synthetic keys and per-key prefixes."""
    times: list[float] = []
    context: list[int] = []
    generated: list[int] = []
    try:
        with open_trace(path, text=True) as fh:
            for n, row in enumerate(csv.DictReader(fh), start=2):
                if limit is not None and len(times) >= limit:
                    break
                try:
                    times.append(_azure_time(row["TIMESTAMP"]))
                    asked, made = int(row["ContextTokens"]), int(row["GeneratedTokens"])
                    if asked < 0 or made < 0:
                        raise ValueError(f"negative token count ({asked}, {made})")
                    context.append(max(1, asked))  # an empty prompt still costs a step
                    generated.append(max(1, made))
                except KeyError as exc:
                    raise ReplayError(
                        f"{path}:{n}: Azure row without {exc}; the header needs TIMESTAMP, "
                        "ContextTokens and GeneratedTokens"
                    ) from None
                except (TypeError, ValueError) as exc:
                    raise ReplayError(f"{path}:{n}: bad Azure row ({exc!r})") from None
    except READ_ERRORS as exc:
        raise ReplayError(f"cannot read trace {path}: {exc}") from None
    if not times:
        raise ReplayError(f"{path}: no requests")
    n_req = len(times)
    t = np.asarray(times) - min(times)
    shares = paper_workload(max(keys, 4), rng, total_rate=1.0, max_share=max(0.003, 1 / keys))
    p = shares.rates / shares.rates.sum()
    key = rng.choice(p.size, size=n_req, p=p).astype(np.int64)
    mu = math.log(max(prefix_tokens, 1.0)) - 0.5 * 0.6**2
    key_prefix = np.rint(rng.lognormal(mu, 0.6, p.size)).astype(np.int64)
    ctx = np.asarray(context, dtype=np.int64)
    pre = np.minimum(key_prefix[key], ctx)
    offsets, ids = _chain_blocks(key, pre, ctx, block_tokens)
    first = np.zeros(n_req, dtype=np.bool_)
    first[np.unique(key, return_index=True)[1]] = True
    width = len(str(p.size - 1))
    return make_request_set(
        times=t,
        keys=[f"azure-key-{k:0{width}d}" for k in key.tolist()],
        prompt_tokens=ctx,
        output_tokens=generated,
        block_offsets=offsets,
        block_ids=ids,
        prefix_tokens=np.where(first, 0, pre),
        block_tokens=block_tokens,
        source=f"Azure trace {path.name} (token counts only; synthetic keys and prefixes)",
        notes=(f"synthetic keys: {p.size} keys, prefix ~{prefix_tokens:g} tokens per key",),
    )


def _chain_blocks(
    key: IntArray, prefix: IntArray, prompt: IntArray, block_tokens: int
) -> tuple[IntArray, IntArray]:
    """Blocks of prompts whose first `prefix` tokens are their key's shared chain.

    Block j of a prompt is key block j when it lies wholly in the prefix, else unique.
    """
    b = block_tokens
    sizes = prompt // b
    offsets = np.zeros(sizes.size + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    total = int(offsets[-1])
    pos = np.arange(total, dtype=np.int64) - np.repeat(offsets[:-1], sizes)
    chain = int(prompt.max()) // b + 1
    shared = (pos + 1) * b <= np.repeat(prefix, sizes)
    key_ids = np.repeat(key, sizes) * chain + pos
    unique_ids = (int(key.max()) + 1) * chain + np.arange(total, dtype=np.int64)
    ids: IntArray = np.where(shared, key_ids, unique_ids)
    return offsets, ids


def read_generic(path: Path, *, block_tokens: int = 512, limit: int | None = None) -> RequestSet:
    """A generic CSV (with header) or JSONL trace: ts, key, prompt_tokens, prefix_tokens, ..."""
    rows: list[dict[str, Any]] = []
    if data_suffix(path) in (".jsonl", ".json", ".ndjson"):
        rows = [_json(path, n, line) for n, line in _lines(path, limit)]
    else:
        try:
            with open_trace(path, text=True) as fh:
                for row in csv.DictReader(fh):
                    if limit is not None and len(rows) >= limit:
                        break
                    rows.append(dict(row))
        except READ_ERRORS as exc:
            raise ReplayError(f"cannot read trace {path}: {exc}") from None
    if not rows:
        raise ReplayError(f"{path}: no requests")
    times: list[float] = []
    keys: list[str] = []
    prompts: list[int] = []
    prefixes: list[int] = []
    output: list[int] = []
    for n, r in enumerate(rows, start=1):
        try:
            ts = float(r["ts"])
            if not math.isfinite(ts):
                raise ValueError(f"ts {r['ts']!r} is not a finite number")
            key = str(r["key"])
            prompt_n = int(r["prompt_tokens"])
            prefix_n = _optional_int(r.get("prefix_tokens"), 0)
            output_n = _optional_int(r.get("output_tokens"), _DEFAULT_OUTPUT)
        except (KeyError, TypeError, ValueError) as exc:
            raise ReplayError(
                f"{path}: row {n}: every row needs ts (s), key and prompt_tokens "
                f"(ints; prefix_tokens, output_tokens optional): {exc!r}"
            ) from None
        if not key or prompt_n < 1 or prefix_n < 0 or output_n < 0:
            raise ReplayError(
                f"{path}: row {n}: key {key!r}, prompt_tokens {prompt_n}, prefix_tokens "
                f"{prefix_n}, output_tokens {output_n}: a key must be non-empty, a prompt at "
                "least 1 token, and prefix and output tokens not negative"
            )
        times.append(ts)
        keys.append(key)
        prompts.append(prompt_n)
        prefixes.append(prefix_n)
        output.append(output_n)
    prompt = np.asarray(prompts, dtype=np.int64)
    prefix = np.asarray(prefixes, dtype=np.int64)
    bt = int(rows[0].get("block_tokens") or block_tokens)
    if any("hash_ids" in r for r in rows):
        lists = [_ids(r.get("hash_ids")) for r in rows]
        lists = [ids[: int(p) // bt] for ids, p in zip(lists, prompt.tolist(), strict=True)]
        return make_request_set(
            times=times,
            keys=keys,
            prompt_tokens=prompt,
            output_tokens=output,
            block_lists=lists,
            prefix_tokens=prefix,
            block_tokens=bt,
            source=f"trace {path.name}",
        )
    _, key_idx = np.unique(np.asarray(keys, dtype=object), return_inverse=True)
    offsets, ids = _chain_blocks(key_idx.astype(np.int64), np.minimum(prefix, prompt), prompt, bt)
    return make_request_set(
        times=times,
        keys=keys,
        prompt_tokens=prompt,
        output_tokens=output,
        block_offsets=offsets,
        block_ids=ids,
        prefix_tokens=prefix,
        block_tokens=bt,
        source=f"trace {path.name} (a key's prefix tokens taken as shared content)",
    )


def _optional_int(value: object, default: int) -> int:
    """An optional column's value: `default` when absent or empty (a JSON 0 is 0, as CSV's "0")."""
    return default if value is None or value == "" else int(value)  # type: ignore[call-overload]


def _ids(value: object) -> list[int]:
    if value is None or value == "":
        return []
    if isinstance(value, str):
        return [int(x) for x in value.split()]
    if isinstance(value, list):
        return [int(x) for x in value]
    raise ReplayError(f"hash_ids must be a list or a space-separated string, got {value!r}")
