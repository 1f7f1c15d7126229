"""The serving cluster as numba kernels: R replicas, each a continuous-batching engine with a queue.

Per replica (see service.py for the cost model): a FIFO queue, up to `max_running` running
sequences, each first in prefill (FIFO, one chunk of prefill work per step) then decoding (one
token per step). Between events the step rates are constant, so a replica is advanced from event to
event in closed form: events are prefill done, sequence done, and arrivals. A replica whose next
event lies after the time of interest is left alone (lazy), so advancing the whole cluster to the
next arrival costs O(R) comparisons plus the work of the events that really happen.

The simulator calls `engine_step` once per request: submit request i to replica d at its arrival
time, then advance every replica to the next arrival and report which requests finished (the
in-flight counts of the gateway that sent each one must see its completion before the next
routing decision).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from cacheroute.replay.cache import CacheState, cache_lookup_insert, new_cache
from cacheroute.replay.jit import compiled, njit
from cacheroute.replay.requestset import FloatArray, IntArray, RequestSet
from cacheroute.replay.service import ServiceModel

__all__ = ["Engine"]

_INF = math.inf
_EPS = 1e-12

# per-replica float state (DF) and int state (DI) columns
_CLOCK, _NEXT, _CTX = 0, 1, 2
_RUN, _DEC, _PRE, _QHEAD, _QTAIL, _QLEN, _SEQ = 0, 1, 2, 3, 4, 5, 6
# per-slot float state (SF) and int state (SI)
_WORK, _LEFT, _SCTX = 0, 1, 2
_REQ, _PHASE, _ORDER = 0, 1, 2


@njit
def _rates(
    df: FloatArray, di: IntArray, d: int, sv: FloatArray, chunk_s: float
) -> tuple[float, float]:
    """(prefill work per second, decode tokens per second per sequence) of replica d now."""
    n_dec = di[d, _DEC]
    t_dec = 0.0
    if n_dec > 0:
        t_dec = sv[0] + sv[1] * n_dec + sv[2] * df[d, _CTX]
    if di[d, _PRE] > 0:
        step = t_dec + chunk_s
        return chunk_s / step, (1.0 / step if n_dec > 0 else 0.0)
    if n_dec > 0:
        return 0.0, 1.0 / t_dec
    return 0.0, 0.0


@njit
def _next_event(
    sf: FloatArray, si: IntArray, d: int, pre_rate: float, dec_rate: float
) -> tuple[float, int, int]:
    """(delay, slot, prefill-head slot) of replica d's next event at the current rates."""
    best = _INF
    slot = -1
    head = -1
    order = 0
    for s in range(si.shape[1]):
        if si[d, s, _REQ] < 0:
            continue
        if si[d, s, _PHASE] == 0:
            if head < 0 or si[d, s, _ORDER] < order:
                head = s
                order = si[d, s, _ORDER]
        elif dec_rate > 0.0:
            dt = sf[d, s, _LEFT] / dec_rate
            if dt < best:
                best = dt
                slot = s
    if head >= 0 and pre_rate > 0.0:
        dt = sf[d, head, _WORK] / pre_rate
        if dt < best:
            best = dt
            slot = head
    return best, slot, head


@njit
def _progress(  # noqa: PLR0917 - numba kernels take flat state
    sf: FloatArray, si: IntArray, d: int, dt: float, head: int, pre_rate: float, dec_rate: float
) -> None:
    if dt <= 0.0:
        return
    for s in range(si.shape[1]):
        if si[d, s, _REQ] >= 0 and si[d, s, _PHASE] == 1:
            sf[d, s, _LEFT] -= dt * dec_rate
    if head >= 0:
        sf[d, head, _WORK] -= dt * pre_rate


@njit
def _admit(  # noqa: PLR0917 - numba kernels take flat state
    d: int,
    i: int,
    now: float,
    df: FloatArray,
    di: IntArray,
    sf: FloatArray,
    si: IntArray,
    prompt: IntArray,
    output: IntArray,
    boff: IntArray,
    bids: IntArray,
    block_tokens: int,
    sv: FloatArray,
    out_f: FloatArray,
    out_i: IntArray,
    cap: int,
    tkeys: IntArray,
    tvals: IntArray,
    ekey: IntArray,
    eprev: IntArray,
    enext: IntArray,
    dstate: IntArray,
    scratch: IntArray,
) -> None:
    """Start request i on replica d: prefix-cache lookup, then a running slot in prefill."""
    r = di.shape[0]
    matched = cache_lookup_insert(
        cap, tkeys, tvals, ekey, eprev, enext, dstate, r, d, bids[boff[i] : boff[i + 1]], scratch
    )
    p = prompt[i]
    c = min(matched * block_tokens, p - 1)
    u = p - c
    slot = 0
    while si[d, slot, _REQ] >= 0:
        slot += 1
    si[d, slot, _REQ] = i
    si[d, slot, _PHASE] = 0
    si[d, slot, _ORDER] = di[d, _SEQ]
    di[d, _SEQ] += 1
    sf[d, slot, _WORK] = sv[3] + sv[4] * u + sv[5] * (u * c + 0.5 * u * u)
    sf[d, slot, _LEFT] = output[i] - 1.0
    sf[d, slot, _SCTX] = p + 0.5 * output[i]
    di[d, _RUN] += 1
    di[d, _PRE] += 1
    out_f[i, 0] = now
    out_i[i, 1] = c


@njit
def _advance(  # noqa: PLR0917 - one flat event loop
    d: int,
    t: float,
    df: FloatArray,
    di: IntArray,
    sf: FloatArray,
    si: IntArray,
    qnext: IntArray,
    prompt: IntArray,
    output: IntArray,
    boff: IntArray,
    bids: IntArray,
    block_tokens: int,
    sv: FloatArray,
    chunk_s: float,
    out_f: FloatArray,
    out_i: IntArray,
    comp: IntArray,
    ncomp: int,
    cap: int,
    tkeys: IntArray,
    tvals: IntArray,
    ekey: IntArray,
    eprev: IntArray,
    enext: IntArray,
    dstate: IntArray,
    scratch: IntArray,
    first: IntArray,
) -> int:
    """Run replica d's events up to time t; returns the new completion count.

    Requests whose prompt finished prefill (their first token) are appended to `first`, whose
    element 0 holds the count (a gateway learns of a first token when the first byte streams).
    """
    m = si.shape[1]
    while True:
        if di[d, _RUN] == 0:
            df[d, _CLOCK] = max(df[d, _CLOCK], t) if t < _INF else df[d, _CLOCK]
            df[d, _NEXT] = _INF
            return ncomp
        pre_rate, dec_rate = _rates(df, di, d, sv, chunk_s)
        dt, slot, head = _next_event(sf, si, d, pre_rate, dec_rate)
        te = df[d, _CLOCK] + dt
        if te > t:
            _progress(sf, si, d, t - df[d, _CLOCK], head, pre_rate, dec_rate)
            df[d, _CLOCK] = t
            df[d, _NEXT] = te
            return ncomp
        _progress(sf, si, d, dt, head, pre_rate, dec_rate)
        df[d, _CLOCK] = te
        req = si[d, slot, _REQ]
        done = False
        if si[d, slot, _PHASE] == 0:  # prefill finished: first token
            sf[d, slot, _WORK] = 0.0
            si[d, slot, _PHASE] = 1
            di[d, _PRE] -= 1
            out_f[req, 1] = te
            first[0] += 1
            first[first[0]] = req
            if sf[d, slot, _LEFT] <= _EPS:
                done = True
            else:
                di[d, _DEC] += 1
                df[d, _CTX] += sf[d, slot, _SCTX]
        else:
            di[d, _DEC] -= 1
            df[d, _CTX] -= sf[d, slot, _SCTX]
            if di[d, _DEC] == 0:
                df[d, _CTX] = 0.0
            done = True
        if done:
            out_f[req, 2] = te
            si[d, slot, _REQ] = -1
            di[d, _RUN] -= 1
            comp[ncomp] = req
            ncomp += 1
            while di[d, _RUN] < m and di[d, _QLEN] > 0:
                nxt = di[d, _QHEAD]
                di[d, _QHEAD] = qnext[nxt]
                di[d, _QLEN] -= 1
                if di[d, _QLEN] == 0:
                    di[d, _QTAIL] = -1
                _admit(
                    d, nxt, te, df, di, sf, si, prompt, output, boff, bids, block_tokens, sv,
                    out_f, out_i, cap, tkeys, tvals, ekey, eprev, enext, dstate, scratch,
                )  # fmt: skip


@njit
def engine_step(  # noqa: PLR0917 - one call per request: flat state keeps it cheap
    i: int,
    d: int,
    t_next: float,
    times: FloatArray,
    df: FloatArray,
    di: IntArray,
    sf: FloatArray,
    si: IntArray,
    qnext: IntArray,
    prompt: IntArray,
    output: IntArray,
    boff: IntArray,
    bids: IntArray,
    block_tokens: int,
    sv: FloatArray,
    chunk_s: float,
    out_f: FloatArray,
    out_i: IntArray,
    comp: IntArray,
    cap: int,
    tkeys: IntArray,
    tvals: IntArray,
    ekey: IntArray,
    eprev: IntArray,
    enext: IntArray,
    dstate: IntArray,
    scratch: IntArray,
    first: IntArray,
) -> int:
    """Submit request i to replica d at its arrival, advance all replicas to t_next.

    Returns how many requests finished (their indices are in comp[:count]; replica = out_i[., 0]).
    """
    ncomp = 0
    t = times[i]
    ncomp = _advance(
        d, t, df, di, sf, si, qnext, prompt, output, boff, bids, block_tokens, sv, chunk_s,
        out_f, out_i, comp, ncomp, cap, tkeys, tvals, ekey, eprev, enext, dstate, scratch, first,
    )  # fmt: skip
    out_i[i, 0] = d
    if di[d, _RUN] < si.shape[1]:
        _admit(
            d, i, t, df, di, sf, si, prompt, output, boff, bids, block_tokens, sv,
            out_f, out_i, cap, tkeys, tvals, ekey, eprev, enext, dstate, scratch,
        )  # fmt: skip
    else:
        qnext[i] = -1
        if di[d, _QTAIL] >= 0:
            qnext[di[d, _QTAIL]] = i
        else:
            di[d, _QHEAD] = i
        di[d, _QTAIL] = i
        di[d, _QLEN] += 1
    pre_rate, dec_rate = _rates(df, di, d, sv, chunk_s)
    dt, _, _ = _next_event(sf, si, d, pre_rate, dec_rate)
    df[d, _NEXT] = df[d, _CLOCK] + dt
    for e in range(di.shape[0]):
        if df[e, _NEXT] <= t_next:
            ncomp = _advance(
                e, t_next, df, di, sf, si, qnext, prompt, output, boff, bids, block_tokens, sv,
                chunk_s, out_f, out_i, comp, ncomp, cap, tkeys, tvals, ekey, eprev, enext,
                dstate, scratch, first,
            )  # fmt: skip
    return ncomp


@dataclass(slots=True)
class Engine:
    """The cluster's state for one replay (arrays the kernels mutate) and its per-request results.

    `out_f[i]` = (start of service, first token, last token) in seconds; `out_i[i]` = (replica,
    cached prompt tokens).
    """

    requests: RequestSet
    service: ServiceModel
    destinations: int
    df: FloatArray
    di: IntArray
    sf: FloatArray
    si: IntArray
    qnext: IntArray
    sv: FloatArray
    out_f: FloatArray
    out_i: IntArray
    comp: IntArray
    first: IntArray
    """first[0] = how many requests got their first token in the last step; first[1:] = which."""
    cache: CacheState
    scratch: IntArray
    _args: tuple[Any, ...] | None = None
    """The kernel's arguments after (i, d, t_next), bound once: a request's step is one call."""
    _kernel: Callable[..., int] | None = None
    """`engine_step` compiled for those arguments (see `compiled`)."""

    @classmethod
    def create(cls, requests: RequestSet, service: ServiceModel, destinations: int) -> Engine:
        """Idle replicas with empty caches."""
        r, m, n = destinations, service.max_running, requests.n
        di = np.zeros((r, 7), dtype=np.int64)
        di[:, _QHEAD] = -1
        di[:, _QTAIL] = -1
        df = np.zeros((r, 3), dtype=np.float64)
        df[:, _NEXT] = _INF
        si = np.zeros((r, m, 3), dtype=np.int64)
        si[:, :, _REQ] = -1
        sizes = np.diff(requests.block_offsets)
        sv = np.array(
            [
                service.decode_base_s,
                service.decode_per_seq_s,
                service.decode_per_ctx_token_s,
                service.prefill_fixed_s,
                service.prefill_per_token_s,
                service.attention_per_pair_s,
            ],
            dtype=np.float64,
        )
        out_f = np.full((n, 3), np.nan, dtype=np.float64)
        return cls(
            requests=requests,
            service=service,
            destinations=r,
            df=df,
            di=di,
            sf=np.zeros((r, m, 3), dtype=np.float64),
            si=si,
            qnext=np.full(n, -1, dtype=np.int64),
            sv=sv,
            out_f=out_f,
            out_i=np.zeros((n, 2), dtype=np.int64),
            comp=np.zeros(n + 1, dtype=np.int64),
            first=np.zeros(n + 1, dtype=np.int64),
            cache=new_cache(r, service.cache_tokens // requests.block_tokens),
            scratch=np.zeros(int(sizes.max()) + 1 if sizes.size else 1, dtype=np.int64),
        )

    def step(self, i: int, d: int, t_next: float) -> int:
        """Submit request i to replica d and advance to t_next; finished requests are comp[:count]."""
        args, kernel = self._args, self._kernel
        if args is None or kernel is None:
            q, c = self.requests, self.cache
            args = self._args = (
                q.times, self.df, self.di, self.sf, self.si, self.qnext, q.prompt_tokens,
                q.output_tokens, q.block_offsets, q.block_ids, q.block_tokens, self.sv,
                self.service.chunk_s, self.out_f, self.out_i, self.comp, c.cap, c.tkeys, c.tvals,
                c.ekey, c.eprev, c.enext, c.dstate, self.scratch, self.first,
            )  # fmt: skip
            kernel = self._kernel = compiled(engine_step, 0, 0, 0.0, *args)
        self.first[0] = 0
        return kernel(i, d, t_next, *args)

    def first_tokens(self) -> list[int]:
        """Requests whose first token came in the last `step` (prefill done), in time order."""
        out: list[int] = self.first[1 : int(self.first[0]) + 1].tolist()
        return out

    def queued(self) -> IntArray:
        """Requests waiting in each replica's queue right now."""
        out: IntArray = self.di[:, _QLEN].copy()
        return out

    def running(self) -> IntArray:
        """Requests running on each replica right now."""
        out: IntArray = self.di[:, _RUN].copy()
        return out
