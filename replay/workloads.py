"""Synthetic request streams: `paper`, `whale`, `low-reuse`, `conversation` (seeded, reproducible).

The model, per request, in arrival order:
  * **keys and rates** - per-key shares from the planner's paper-like generator (log-normal,
    sigma 1.65: Gini about 0.76, top 4% of keys about 47% of requests, no key above 0.3%);
  * **arrivals** - one aggregate renewal process at `rate` requests/s, Poisson or gamma gaps with
    coefficient of variation `cv`; each arrival picks its key by share;
  * **prompt** - the tenant's shared prompt (`tenant_tokens`, log-normal per tenant; keys
    `tenant-<t>/conv-<i>` belong to tenant i mod `tenants`) + the key's own system prefix
    (`system_tokens`, log-normal per key) + the session's history (every earlier turn's message and
    answer) + a new message (the unique suffix).
    A key busier than `session_rate` runs several sessions at once; a session lasts a geometric
    number of turns (`turns` on average) or until `max_context`, then a new one starts with an
    empty history. So the reusable prefix grows with each conversation turn;
  * **output** - log-normal around `output_tokens`.

Kinds:
  * `paper` - the paper's shape as above;
  * `whale` - plus a few shared-prefix applications (`whale_shares` of the rate, long common
    prompt `whale_system_tokens`, short sessions): pinning each to one replica skews load about 3x
    at R = 30 (the paper's ablation reports 3.46x);
  * `low-reuse` - the paper's losing regime: only `reuse_fraction` of requests come from recurring
    keys (with short prefixes and sessions); every other request is a one-off prompt under its own
    key, and nothing of it ever recurs;
  * `conversation` - a long-context multi-turn chat/agent service, shaped like Mooncake's public
    conversation trace (about 12k requests in an hour; prompt tokens p50 ~7k, p90 ~27k, p99 ~85k,
    mean ~12k; output mean 343). Its own model, below.

Block ids: block j of a prompt is the tenant's block j while it lies wholly in the tenant prompt,
else the key's block j while it lies wholly in tenant + system prefix, else block j of the
session's own chain; one-off prompts have unique blocks. Tenant prompts are what a cache-blind
balancer still hits (hot everywhere); with the defaults Flat-LB's hit rate lands near the paper's
56-64%, affinity's near its 88%.

The `conversation` kind does not use the per-key shares: every *session* is its own routing key
`tenant-<t>/conv-<i>`, so most keys are cold (a few requests each; a median of 3) and the reuse is
*within* a session and *across* a tenant's sessions. The model and why each default:
  * **tenants** - `tenants` applications (0: `keys // 40`; `keys` has no other role here), each
    with one system prompt shared by all its sessions: log-normal, mean `tenant_tokens` = 3500,
    sigma 0.9 (median ~2.3k, one in ten above ~7k, capped at max_context / 8), as agent and RAG
    system prompts run from a few hundred tokens to several thousand. A session picks its tenant
    by Zipf popularity (`tenant_zipf` = 1: the top tenant of 50 draws ~22% of the sessions);
  * **turns** - geometric with mean `turns` = 3 (quick questions), or, for `long_session_share`
    = 30% of sessions, log-normal around `long_turns` = 10 (sigma 0.8, capped at 256): most
    requests then come from the long sessions, which is what makes contexts long;
  * **prompt of turn j** = tenant prompt + every earlier message and answer of the session + the
    new message, so turn j's blocks extend turn j-1's exactly. Messages are log-normal (mean
    `message_tokens` = 700, sigma 1.0), except a `document_share` = 1.5% that are pasted
    documents (log-normal, mean `document_tokens` = 32k, sigma 0.6: mostly 10k-60k). These three
    (message, document share and size) were tuned so that the prompt percentiles land near
    Mooncake's; a document stays in the history for the rest of its session, which gives the
    long tail. A turn that would exceed `max_context` (128k, a common model window) starts a new
    session (a new key, empty history) of the same tenant instead;
  * **times** - sessions start as a Poisson process (gamma with `cv`) at `rate / E[turns]`, so
    the aggregate request rate is `rate`; turns of a session are `think_time` = 30 s apart on
    average (log-normal, sigma 1.0: reading, typing and generation), so at 100 req/s some 2500
    sessions are active at once. The clock starts after a warm-up, so sessions already
    in progress at 0 are in the stream (their earlier turns are history only), and the first
    `requests` turns from 0 on are kept;
  * **output** - log-normal, mean `output_tokens` = 343 (Mooncake's mean), sigma 0.8;
  * **blocks** - `block_tokens` = 512 (Mooncake's block size, so `write_mooncake` can write it):
    block j is the tenant's block j while it lies wholly in the tenant prompt, else block j of
    the session's own chain. `prefix_tokens` = everything but the new message.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

from cacheroute.planner.workload import paper_workload
from cacheroute.replay.errors import ReplayError
from cacheroute.replay.requestset import FloatArray, IntArray, RequestSet, make_request_set

__all__ = ["KINDS", "WorkloadKind", "WorkloadSpec", "generate", "spec_for"]

WorkloadKind = Literal["paper", "whale", "low-reuse", "conversation"]
KINDS: tuple[WorkloadKind, ...] = ("paper", "whale", "low-reuse", "conversation")


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    """Every knob of the synthetic generator; `spec_for(kind)` gives each kind's defaults."""

    kind: WorkloadKind = "paper"
    keys: int = 4000
    requests: int = 40_000
    rate: float = 100.0
    """Offered load in requests/s (load sweeps then compress time)."""
    sigma: float = 1.65
    max_share: float = 0.003
    paper_whales: int = 8
    """The paper generator's own mild whales (0.20%-0.29% of requests each)."""
    whale_shares: tuple[float, ...] = ()
    whale_system_tokens: float = 4096.0
    whale_turns: float = 1.5
    tenants: int = 0
    """Tenants sharing a prompt among their keys (0: keys // 40)."""
    tenant_tokens: float = 2048.0
    arrival: Literal["poisson", "gamma"] = "poisson"
    cv: float = 1.0
    system_tokens: float = 512.0
    message_tokens: float = 384.0
    output_tokens: float = 96.0
    turns: float = 6.0
    session_rate: float = 0.05
    max_context: int = 16_384
    reuse_fraction: float = 1.0
    oneoff_tokens: float = 2048.0
    block_tokens: int = 256
    think_time: float = 30.0
    """conversation: mean seconds between two turns of a session (log-normal)."""
    long_session_share: float = 0.0
    """conversation: share of sessions whose turn count is log-normal around `long_turns`."""
    long_turns: float = 16.0
    tenant_zipf: float = 1.0
    """conversation: tenant popularity ~ rank ** -tenant_zipf."""
    document_share: float = 0.0
    """conversation: share of user messages that are pasted documents (`document_tokens`)."""
    document_tokens: float = 16_000.0
    notes: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        checks = [
            (self.kind in KINDS, f"kind must be one of {', '.join(KINDS)}"),
            (self.keys >= 1 and self.requests >= 2, "need >= 1 key and >= 2 requests"),
            (self.rate > 0 and self.cv > 0, "rate and cv must be > 0"),
            (sum(self.whale_shares) < 0.9, "whale shares must leave room for the other keys"),
            (0.0 < self.reuse_fraction <= 1.0, "reuse_fraction must be in (0, 1]"),
            (self.turns >= 1 and self.whale_turns >= 1, "turns must be >= 1"),
            (self.block_tokens >= 1 and self.max_context >= self.block_tokens, "bad block size"),
            (self.arrival in ("poisson", "gamma"), "arrival must be poisson or gamma"),
            (self.think_time > 0 and self.long_turns >= 1, "think_time > 0, long_turns >= 1"),
            (0.0 <= self.long_session_share <= 1.0, "long_session_share must be in [0, 1]"),
            (0.0 <= self.document_share < 1.0, "document_share must be in [0, 1)"),
            (self.tenant_zipf >= 0, "tenant_zipf must be >= 0"),
        ]
        for ok, message in checks:
            if not ok:
                raise ReplayError(f"workload spec: {message}")

    def to_dict(self) -> dict[str, Any]:
        """Plain dict for reports."""
        out = asdict(self)
        out["whale_shares"] = list(self.whale_shares)
        out["notes"] = list(self.notes)
        return out


def spec_for(kind: WorkloadKind, **overrides: Any) -> WorkloadSpec:
    """The defaults of one kind, with overrides (None values are ignored)."""
    base: dict[str, Any] = {"kind": kind}
    if kind == "whale":
        base["whale_shares"] = (0.09, 0.06, 0.045, 0.03)
    elif kind == "low-reuse":
        base.update(
            reuse_fraction=0.25, tenant_tokens=0.0, system_tokens=1024.0, turns=3.0, paper_whales=0
        )
    elif kind == "conversation":
        base.update(_CONVERSATION)
    base.update({k: v for k, v in overrides.items() if v is not None})
    return WorkloadSpec(**base)


def generate(spec: WorkloadSpec, rng: np.random.Generator) -> RequestSet:
    """Draw one request stream from `spec` (same spec and seed: same stream)."""
    if spec.kind == "conversation":
        return _conversation(spec, rng)
    shares, system = _key_shares(spec, rng)
    n = spec.requests
    times = _arrivals(spec, n, rng)
    recurring = (
        np.ones(n, dtype=np.bool_)
        if spec.reuse_fraction >= 1.0
        else rng.random(n) < spec.reuse_fraction
    )
    key = rng.choice(shares.size, size=n, p=shares).astype(np.int64)
    message = _lognormal(rng, spec.message_tokens, 0.8, n)
    output = _lognormal(rng, spec.output_tokens, 0.7, n)
    oneoff = _lognormal(rng, spec.oneoff_tokens, 0.8, n)
    n_whales = len(spec.whale_shares)
    turns_mean = np.full(shares.size, spec.turns)
    turns_mean[:n_whales] = spec.whale_turns
    sessions = np.maximum(1, np.ceil(shares * spec.rate / spec.session_rate)).astype(np.int64)
    pick = rng.random(n)
    new_turns = rng.geometric(1.0 / turns_mean[key]).astype(np.int64)
    tenants = spec.tenants or max(1, spec.keys // 40)
    tenant_of = np.arange(shares.size, dtype=np.int64) % tenants
    tenant_of[:n_whales] = -1  # a whale is its own application: no tenant prompt
    tenant_tokens = _lognormal(rng, spec.tenant_tokens, 0.5, tenants) * (spec.tenant_tokens > 0)
    draws = _Draws(
        key=key,
        recurring=recurring,
        message=message.astype(np.int64),
        output=output.astype(np.int64),
        oneoff=oneoff.astype(np.int64),
        pick=pick,
        new_turns=new_turns,
        tenant_of=tenant_of,
        tenant_tokens=tenant_tokens,
        system=system,
        sessions=sessions,
    )
    cols = _layout(draws, _conversations(draws, spec), spec.block_tokens)
    names = _key_names(shares.size, n_whales, tenants)
    keys = [names[k] if recurring[i] else f"oneoff/{i:07d}" for i, k in enumerate(key.tolist())]
    label = f"synthetic {spec.kind} ({spec.keys} keys, {n} requests, {spec.rate:g} req/s)"
    return make_request_set(
        times=times,
        keys=keys,
        prompt_tokens=cols.prompt,
        output_tokens=output.astype(np.int64),
        prefix_tokens=cols.prefix,
        block_offsets=cols.offsets,
        block_ids=cols.blocks,
        block_tokens=spec.block_tokens,
        source=label,
        notes=spec.notes,
    )


def _key_shares(spec: WorkloadSpec, rng: np.random.Generator) -> tuple[FloatArray, FloatArray]:
    """Per-key request shares (whales first) and system-prefix tokens."""
    max_share = max(spec.max_share, 1.0 / spec.keys)
    base = paper_workload(
        spec.keys,
        rng,
        total_rate=1.0,
        sigma=spec.sigma,
        max_share=max_share,
        whales=min(spec.paper_whales, spec.keys // 4),
        mean_prefix_tokens=spec.system_tokens,
    )
    shares = base.rates / base.rates.sum()
    system = base.prefix_tokens.astype(np.float64)
    whales = np.asarray(spec.whale_shares, dtype=np.float64)
    if whales.size:
        if whales.size >= spec.keys:
            raise ReplayError("need more keys than whales")
        rest = shares[whales.size :]
        shares = np.concatenate([whales, rest * (1.0 - whales.sum()) / rest.sum()])
        system[: whales.size] = _lognormal(rng, spec.whale_system_tokens, 0.3, whales.size)
    return shares, system


def _arrivals(spec: WorkloadSpec, n: int, rng: np.random.Generator) -> FloatArray:
    if spec.arrival == "poisson" or math.isclose(spec.cv, 1.0):
        gaps = rng.exponential(1.0 / spec.rate, n)
    else:
        shape = 1.0 / spec.cv**2
        gaps = rng.gamma(shape, 1.0 / (spec.rate * shape), n)
    gaps[0] = 0.0
    out: FloatArray = np.cumsum(gaps)
    return out


def _lognormal(rng: np.random.Generator, mean: float, sigma: float, n: int) -> FloatArray:
    mu = math.log(max(mean, 1.0)) - 0.5 * sigma**2
    out: FloatArray = np.maximum(1.0, np.rint(rng.lognormal(mu, sigma, n)))
    return out


def _key_names(n: int, whales: int, tenants: int) -> list[str]:
    width = len(str(n - 1))
    tw = len(str(tenants - 1))
    return [
        f"app-{i}/shared" if i < whales else f"tenant-{i % tenants:0{tw}d}/conv-{i:0{width}d}"
        for i in range(n)
    ]


@dataclass(frozen=True, slots=True)
class _Draws:
    """The random draws behind a workload: per request, then per key."""

    key: IntArray
    recurring: NDArray[np.bool_]
    message: IntArray
    output: IntArray
    oneoff: IntArray
    pick: FloatArray
    new_turns: IntArray
    tenant_of: IntArray  # per key; -1 = no tenant prompt
    tenant_tokens: FloatArray  # per tenant
    system: FloatArray  # per key
    sessions: IntArray  # per key: parallel sessions


@dataclass(frozen=True, slots=True)
class _Chains:
    """Where each request's blocks come from: its prompt size and its chains' first ids."""

    prompt: IntArray
    prefix: IntArray
    chain_base: IntArray  # per request: the session's (or one-off prompt's) chain
    tenant_t: IntArray  # per key: tenant prompt tokens
    fixed: IntArray  # per key: tenant + system prompt tokens
    tenant_base: IntArray  # per key
    key_base: IntArray  # per key


@dataclass(frozen=True, slots=True)
class _Columns:
    prompt: IntArray
    prefix: IntArray
    offsets: IntArray
    blocks: IntArray


def _conversations(dr: _Draws, spec: WorkloadSpec) -> _Chains:
    """Walk the requests in order, growing each session's history."""
    b = spec.block_tokens
    chain = spec.max_context // b + 1  # block ids one chain can use
    n, n_keys = dr.key.size, dr.system.size
    slot_base = np.zeros(n_keys + 1, dtype=np.int64)
    np.cumsum(dr.sessions, out=slot_base[1:])
    hist = np.zeros(int(slot_base[-1]), dtype=np.int64)
    left = np.zeros(int(slot_base[-1]), dtype=np.int64)
    base = np.full(int(slot_base[-1]), -1, dtype=np.int64)
    half = spec.max_context // 2
    own = np.where(dr.tenant_of >= 0, dr.tenant_tokens[np.maximum(dr.tenant_of, 0)], 0.0)
    tenant_t = np.minimum(np.rint(own).astype(np.int64), half)
    fixed = np.minimum(tenant_t + np.rint(dr.system).astype(np.int64), half)
    # one id chain per tenant, per key and per session, from disjoint ranges
    next_id = (int(dr.tenant_of.max()) + 1) * chain
    key_base = next_id + np.arange(n_keys, dtype=np.int64) * chain
    next_id += n_keys * chain
    prompt = np.zeros(n, dtype=np.int64)
    prefix = np.zeros(n, dtype=np.int64)
    chain_base = np.zeros(n, dtype=np.int64)
    keys_l, msg_l, out_l = dr.key.tolist(), dr.message.tolist(), dr.output.tolist()
    for i in range(n):
        if not dr.recurring[i]:
            prompt[i] = int(dr.oneoff[i])
            chain_base[i] = next_id
            next_id += prompt[i] // b + 1
            continue
        k = keys_l[i]
        s = int(slot_base[k] + min(dr.sessions[k] - 1, int(dr.pick[i] * dr.sessions[k])))
        p = int(fixed[k]) + int(hist[s]) + msg_l[i]
        if left[s] <= 0 or p > spec.max_context:
            base[s] = next_id
            next_id += chain
            hist[s] = 0
            left[s] = dr.new_turns[i]
            p = min(int(fixed[k]) + msg_l[i], spec.max_context)
        prompt[i] = p
        prefix[i] = max(0, p - msg_l[i])
        chain_base[i] = int(base[s])
        hist[s] += msg_l[i] + out_l[i]
        left[s] -= 1
    return _Chains(
        prompt=prompt,
        prefix=prefix,
        chain_base=chain_base,
        tenant_t=tenant_t,
        fixed=fixed,
        tenant_base=np.maximum(dr.tenant_of, 0) * chain,
        key_base=key_base,
    )


def _layout(dr: _Draws, ch: _Chains, b: int) -> _Columns:
    """Block ids: a block belongs to a level (tenant, key) only if it lies wholly inside it."""
    n = dr.key.size
    sizes = ch.prompt // b
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    pos = np.arange(int(offsets[-1]), dtype=np.int64) - np.repeat(offsets[:-1], sizes)
    rec = np.repeat(dr.recurring, sizes)
    k_rep = np.repeat(dr.key, sizes)
    end = (pos + 1) * b
    in_tenant = rec & (end <= ch.tenant_t[k_rep])
    in_key = rec & ~in_tenant & (end <= ch.fixed[k_rep])
    blocks = np.repeat(ch.chain_base, sizes) + pos
    blocks = np.where(in_key, ch.key_base[k_rep] + pos, blocks)
    blocks = np.where(in_tenant, ch.tenant_base[k_rep] + pos, blocks)
    return _Columns(prompt=ch.prompt, prefix=ch.prefix, offsets=offsets, blocks=blocks)


# --------------------------------------------------------------------------- conversation
_CONVERSATION: dict[str, Any] = {
    # Generated at 20 req/s, not 100: load sweeps compress time, which keeps the number of
    # sessions alive at once (rate x think time x turns), and that number against the cluster's
    # prefix-cache room is what decides reuse. 20 req/s x 30 s of think time gives about as many
    # live sessions as a public hour-long Mooncake conversation trace (~3.3 req/s) tiled 5-6
    # times to 60k requests; 100 req/s would give five times more live context than the cache
    # of 30 replicas can hold, and no router could keep a conversation warm.
    "rate": 20.0,
    "tenant_tokens": 3500.0,
    "message_tokens": 700.0,
    "output_tokens": 343.0,
    "turns": 3.0,
    "long_session_share": 0.3,
    "long_turns": 10.0,
    "think_time": 30.0,
    "document_share": 0.015,
    "document_tokens": 32_000.0,
    "tenant_zipf": 1.0,
    "max_context": 131_072,
    "block_tokens": 512,
}
_MAX_TURNS = 256  # turns of one session (a cap on the log-normal tail)
_TENANT_SIGMA = 0.9  # tenant prompts: median ~0.67x the mean, 1 in 10 above ~2x
_MESSAGE_SIGMA = 1.0  # ordinary user messages: a few words to a few thousand tokens
_DOCUMENT_SIGMA = 0.6  # pasted documents: most between ~6k and ~40k tokens
_OUTPUT_SIGMA = 0.8
_THINK_SIGMA = 1.0
_LONG_SIGMA = 0.8  # long sessions' turn counts


def _turns_mean(spec: WorkloadSpec) -> float:
    """Exact mean of `_draw_turns` (E[T] = sum over k of P(T > k), both parts capped)."""
    q = 1.0 - 1.0 / spec.turns
    short = (1.0 - q**_MAX_TURNS) * spec.turns
    mu = math.log(spec.long_turns) - 0.5 * _LONG_SIGMA**2
    tail = 1.0 + sum(
        0.5 * math.erfc((math.log(k) - mu) / (_LONG_SIGMA * math.sqrt(2.0)))
        for k in range(1, _MAX_TURNS)
    )
    share = spec.long_session_share
    return (1.0 - share) * short + share * tail


def _draw_turns(spec: WorkloadSpec, rng: np.random.Generator, n: int) -> IntArray:
    """Turns per session: geometric (mean `turns`) or, for a `long_session_share`, log-normal."""
    short = rng.geometric(1.0 / spec.turns, n)
    mu = math.log(spec.long_turns) - 0.5 * _LONG_SIGMA**2
    tail = np.ceil(rng.lognormal(mu, _LONG_SIGMA, n))
    long = rng.random(n) < spec.long_session_share
    out: IntArray = np.clip(np.where(long, tail, short), 1, _MAX_TURNS).astype(np.int64)
    return out


@dataclass(frozen=True, slots=True)
class _Sessions:
    """Sessions (start order) and their turns' arrival times, flat in session order."""

    tenant: IntArray  # per session
    turns: IntArray  # per session
    first: IntArray  # per session: index of its first turn in the flat arrays
    times: FloatArray  # per turn


def _session_times(spec: WorkloadSpec, rng: np.random.Generator) -> _Sessions:
    """Session starts (Poisson, or gamma with `cv`) at `rate / E[turns]` per second, from a
    warm-up before 0 (so sessions already in progress at 0 are there too), until `requests`
    turns fall in [0, last start]: no later session can put a turn before that point."""
    n = spec.requests
    session_rate = spec.rate / _turns_mean(spec)
    chunk = max(256, math.ceil(1.2 * n / _turns_mean(spec)))
    mu = math.log(spec.think_time) - 0.5 * _THINK_SIGMA**2
    tenants = spec.tenants or max(1, spec.keys // 40)
    popularity = np.arange(1, tenants + 1, dtype=np.float64) ** -spec.tenant_zipf
    popularity /= popularity.sum()
    turns_l: list[IntArray] = []
    times_l: list[FloatArray] = []
    cursor = math.nan
    while True:
        turns = _draw_turns(spec, rng, chunk)
        first = np.zeros(chunk, dtype=np.int64)
        np.cumsum(turns[:-1], out=first[1:])
        gaps = rng.lognormal(mu, _THINK_SIGMA, int(turns.sum()))
        gaps[first] = 0.0
        clock = np.cumsum(gaps)
        since_start = clock - np.repeat(clock[first], turns)
        if math.isnan(cursor):  # warm-up: long enough for nearly every session to span it
            ends = since_start[first + turns - 1]
            cursor = -float(np.quantile(ends, 0.995))
        if spec.arrival == "poisson" or math.isclose(spec.cv, 1.0):
            start_gaps = rng.exponential(1.0 / session_rate, chunk)
        else:  # bursty session starts, as `_arrivals` does for requests
            shape = 1.0 / spec.cv**2
            start_gaps = rng.gamma(shape, 1.0 / (session_rate * shape), chunk)
        starts = cursor + np.cumsum(start_gaps)
        cursor = float(starts[-1])
        turns_l.append(turns)
        times_l.append(np.repeat(starts, turns) + since_start)
        times = np.concatenate(times_l)
        if int(np.count_nonzero((times >= 0.0) & (times <= cursor))) >= n:
            break
    turns = np.concatenate(turns_l)
    first = np.zeros(turns.size, dtype=np.int64)
    np.cumsum(turns[:-1], out=first[1:])
    tenant = rng.choice(tenants, size=turns.size, p=popularity).astype(np.int64)
    return _Sessions(tenant=tenant, turns=turns, first=first, times=times)


def _conversation(spec: WorkloadSpec, rng: np.random.Generator) -> RequestSet:
    """Multi-turn sessions over shared tenant prompts (see the module docstring)."""
    n, b, cap = spec.requests, spec.block_tokens, spec.max_context
    ss = _session_times(spec, rng)
    tenants = spec.tenants or max(1, spec.keys // 40)
    tenant_t = np.minimum(
        _lognormal(rng, spec.tenant_tokens, _TENANT_SIGMA, tenants), cap // 8
    ).astype(np.int64)
    # the first n turns at or after 0, and every earlier turn of their sessions (the history)
    kept = np.flatnonzero(ss.times >= 0.0)
    kept = kept[np.argsort(ss.times[kept], kind="stable")[:n]]
    session_of = np.repeat(np.arange(ss.turns.size, dtype=np.int64), ss.turns)
    last = np.full(ss.turns.size, -1, dtype=np.int64)
    np.maximum.at(last, session_of[kept], kept)
    live = np.flatnonzero(last >= 0)
    lengths = last[live] - ss.first[live] + 1
    turn_idx = np.repeat(ss.first[live] - np.cumsum(lengths) + lengths, lengths) + np.arange(
        int(lengths.sum()), dtype=np.int64
    )
    m = turn_idx.size
    doc = rng.random(m) < spec.document_share
    message = np.where(
        doc,
        _lognormal(rng, spec.document_tokens, _DOCUMENT_SIGMA, m),
        _lognormal(rng, spec.message_tokens, _MESSAGE_SIGMA, m),
    ).astype(np.int64)
    output = _lognormal(rng, spec.output_tokens, _OUTPUT_SIGMA, m).astype(np.int64)
    # walk each live session's turns; a turn past the context cap starts a new conversation
    prompt = np.zeros(m, dtype=np.int64)
    prefix = np.zeros(m, dtype=np.int64)
    conv = np.zeros(m, dtype=np.int64)
    msg_l, out_l, t_l = message.tolist(), output.tolist(), tenant_t.tolist()
    j, next_conv = 0, 0
    for s, length in zip(live.tolist(), lengths.tolist(), strict=True):
        fixed = t_l[int(ss.tenant[s])]
        hist = 0
        c = next_conv
        next_conv += 1
        for _ in range(length):
            p = fixed + hist + msg_l[j]
            if hist and p > cap:
                c, hist = next_conv, 0
                next_conv += 1
                p = fixed + msg_l[j]
            prompt[j] = min(p, cap)
            prefix[j] = fixed + hist
            conv[j] = c
            hist += msg_l[j] + out_l[j]
            j += 1
    # keep the requests at or after 0 (their history stays in their block ids)
    pos_of = np.full(ss.times.size, -1, dtype=np.int64)
    pos_of[turn_idx] = np.arange(m, dtype=np.int64)
    pick = pos_of[kept]
    tenant_of = ss.tenant[session_of[kept]]
    _, conv_dense = np.unique(conv[pick], return_inverse=True)
    offsets, blocks = _conversation_blocks(
        prompt[pick], tenant_t[tenant_of], tenant_of, conv_dense.astype(np.int64), b=b, cap=cap
    )
    tw, cw = len(str(tenants - 1)), len(str(int(conv_dense.max())))
    keys = [
        f"tenant-{t:0{tw}d}/conv-{c:0{cw}d}"
        for t, c in zip(tenant_of.tolist(), conv_dense.tolist(), strict=True)
    ]
    label = (
        f"synthetic conversation ({tenants} tenants, {int(conv_dense.max()) + 1} sessions, "
        f"{n} requests, {spec.rate:g} req/s)"
    )
    return make_request_set(
        times=ss.times[kept],
        keys=keys,
        prompt_tokens=prompt[pick],
        output_tokens=output[pick],
        prefix_tokens=prefix[pick],
        block_offsets=offsets,
        block_ids=blocks,
        block_tokens=b,
        source=label,
        notes=spec.notes,
    )


def _conversation_blocks(
    prompt: IntArray, tenant_t: IntArray, tenant: IntArray, conv: IntArray, *, b: int, cap: int
) -> tuple[IntArray, IntArray]:
    """Block j is the tenant's block j while wholly in the tenant prompt, else the session's."""
    chain = cap // b + 1
    sizes = prompt // b
    offsets = np.zeros(prompt.size + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    pos = np.arange(int(offsets[-1]), dtype=np.int64) - np.repeat(offsets[:-1], sizes)
    in_tenant = (pos + 1) * b <= np.repeat(tenant_t, sizes)
    tenant_ids = np.repeat(tenant, sizes) * chain + pos
    conv_ids = (int(tenant.max()) + 1 + np.repeat(conv, sizes)) * chain + pos
    blocks: IntArray = np.where(in_tenant, tenant_ids, conv_ids)
    return offsets, blocks
