"""Synthetic request streams: `paper`, `whale` and `low-reuse` (seeded, reproducible).

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
    key, and nothing of it ever recurs.

Block ids: block j of a prompt is the tenant's block j while it lies wholly in the tenant prompt,
else the key's block j while it lies wholly in tenant + system prefix, else block j of the
session's own chain; one-off prompts have unique blocks. Tenant prompts are what a cache-blind
balancer still hits (hot everywhere); with the defaults Flat-LB's hit rate lands near the paper's
56-64%, affinity's near its 88%.
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

WorkloadKind = Literal["paper", "whale", "low-reuse"]
KINDS: tuple[WorkloadKind, ...] = ("paper", "whale", "low-reuse")


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
    base.update({k: v for k, v in overrides.items() if v is not None})
    return WorkloadSpec(**base)


def generate(spec: WorkloadSpec, rng: np.random.Generator) -> RequestSet:
    """Draw one request stream from `spec` (same spec and seed: same stream)."""
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
