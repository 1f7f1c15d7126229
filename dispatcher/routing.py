"""Routing decisions inside a gateway — pure: no Kafka, no clock, randomness injected.

`RoutingTable` is an immutable snapshot of one plan version mapped onto the gateway's own list of
destinations: admitted key -> the gateway-local indices of its replica set T(b), in the plan's
selection order. `Router` holds the live table behind ONE reference, so a new plan is swapped in
with a single assignment (atomic under the GIL) and a route() call sees either the old or the new
table, never a mix.

The rules (the paper's dispatch step, our extensions and the fallbacks):
- admitted key -> the least-loaded live member of T(b) by this gateway's in-flight count; ties are
  broken at random, so a key's replicas share its traffic as planned even when a gateway holds few
  requests in flight (with many gateways, the normal case: every count is 0 most of the time);
  a request that names its conversation (`session`, when the key is coarser, e.g. a tenant)
  instead goes to the first member, in the session's rendezvous order, below a CHWBL bound over
  T(b): a key's replicas then share its conversations, and each conversation stays where its
  history is cached (with `cold_cost`, a sole gateway: every conversation of a planned key, and
  every single-replica planned key with or without one, is placed by what it costs instead, like
  a cold key, and stays where its context is while that replica is not overloaded, see
  `_conversation`; the `spill_home` and `context_home` rules below then do not apply);
- ... unless that member is overloaded (our extension, `spill_factor`, default 2): it holds at
  least `spill_factor` x the mean in-flight count of the live destinations (counting this
  request, CHWBL's bound) and at least `spill_min_inflight` (4) requests' worth -> the cold
  path below (so the spilled requests of one key still meet on one replica), counted as
  `spilled` (with the key's context slack, below). A plan balances request *rates* over a
  control interval; the work per request still varies (cache misses, prompt lengths, bursts),
  and a planned key must not pile a queue onto one replica in the meantime;
- with `spill_home` (off by default; only for a gateway that routes all of the cluster's
  traffic): a single-replica planned key that this gateway has spilled before goes to the less
  loaded of its planned destination and its spill home (where the last spill went), each less
  the key's context slack, counted as `spill_home`; a key's first spill takes as its home the
  one of its two consistent cold candidates that fewer keys already use, so homes spread (see
  `_new_home`). The key then has a second warm replica on demand, as a prefix-matching router
  grows one, and its conversations stay where their history is (measured on the long-context
  conversation trace with default keys at one gateway: 37.9 -> 42.5 req/s of SLO capacity;
  41.6 -> 43.5 with `cache_tokens` and `context_home` on as well, docs/EVALUATION.md
  `conv-trace_kb2_g1_no_spill_home`). It relies on in-flight counts that are the destinations'
  real loads; with G gateways each count is a 1/G sample. Homes taken from every cold placement
  (before admission too) scattered conversations there (KV hit rate 0.65 -> 0.58 at 16
  gateways); homes from spills alone changed nothing at 16 gateways (29.5 req/s either way:
  spills are rare below the floor), so it stays off unless the gateway is the only one;
- with `context_home` (off by default; for a sole gateway too): a single-replica key that the
  live plan admits and the previous one did not goes where this gateway sent its conversation
  last, while that is less loaded less the context's slack, counted as `context_home`: a
  conversation admitted while it runs keeps its history instead of recomputing it where the
  plan placed it by load (see the field for what it measured);
- any other key (not admitted, new since the last plan), an admitted key whose whole T(b) is down,
  no plan yet, or a plan older than the staleness limit -> the **cold path** (`cold_affinity`, our
  extension), which gives every key a home without coordination between gateways:
  * with `prefix_blocks` (off by default; for a sole gateway): a key new to this gateway goes
    where the longest run of its prompt's leading blocks went (more than `PREFIX_SHARE` of
    them, under the bound below), counted as `prefix`; and a key whose last destination no
    longer got more than `PREFIX_SHARE` of its prompt's blocks (its context there is gone:
    staying saves nothing) is placed again as below instead of staying;
  * with `cold_cost` too (off by default; for a sole gateway): a key that is placed - new with
    no such prefix home, or placed again - goes where its prompt's missing blocks plus
    `CHURN_WEIGHT` x the destination's recent cache churn are least (under the bound below),
    counted as `cost`, instead of by the group and ring rules that follow;
  * its group's destinations: a key whose group (text before the plan's `group_separator`, e.g.
    the tenant of `tenant-3/conv-9`) has admitted siblings goes to one of the destinations they
    use, chosen by rendezvous hashing - a new conversation lands where its tenant's prompt is
    warm, and every gateway holding the plan picks the same one;
  * else a ring of the destination names (consistent hashing): the key's first destinations
    clockwise from its hash;
  * a key new to this gateway takes the less loaded of its two candidates (the group's top two,
    or the ring's first two): power of two choices, but only ever between the same two replicas;
  * the gateway then keeps the key where it last sent it (its freshest prefix is there), up to
    the bound plus the key's context slack;
  * all of it under a load bound, CHWBL's (Mirrokni et al. 2018): a destination takes a cold key
    only below ceil(`cold_load_factor` x (in flight + 1) / live destinations); past it the key
    walks the ring to the next destination under the bound.
  With `cold_affinity=False` the cold path is the paper's power-of-two-choices;
- every destination down -> power-of-two-choices over all of them (a request is never refused).

"In flight" counts load units: 1 per request by default, or what the gateway says a request
weighs (`acquire(d, units)`), so every rule above balances work. `work_units(key, d, prompt
tokens)` gives the weight that measured best: 1 (the decode) + the prompt tokens *not* expected in
d's cache // `unit_tokens` (a conversation's next turn sent where its last turn went costs only
its new message), and the gateway `settle`s all but the one decode unit at the first streamed
token, when the prefill is done. The load then tracks the prefill queued at each replica, which
is what time to first token waits for.

Context slack (`context_slack`): a key whose last request from this gateway went to d, with a
prompt of P tokens, may exceed the spill and cold bounds at d by P // `unit_tokens` units - what
moving it would cost in recompute - before it leaves (measured on the long-context conversation
workload: hit rate 0.64 -> 0.76 and +5% SLO capacity at one gateway, docs/EVALUATION.md).

Hot-path notes: decisions use plain lists and ints (no numpy scalars, no locks on reads, no
metrics objects); counters are plain ints exported on scrape.
"""

from __future__ import annotations

import bisect
import functools
import hashlib
import importlib
import logging
import math
import random
import sys
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import compress, repeat
from pathlib import Path
from types import ModuleType
from typing import Any, Final, Protocol

import numpy as np
from xxhash import xxh3_64_intdigest

from cacheroute.dispatcher.errors import DispatchError
from cacheroute.dispatcher.prefixes import PrefixIndex
from cacheroute.dispatcher.presized import presized_dict

__all__ = [
    "DEFAULT_SPILL_FACTOR",
    "DEFAULT_SPILL_MIN_INFLIGHT",
    "DEFAULT_UNIT_TOKENS",
    "InFlight",
    "KeyGroups",
    "PlanLike",
    "RouteKind",
    "Router",
    "RoutingTable",
    "build_table",
    "table_from_plan",
]


class PlanLike(Protocol):
    """What routing needs of a planner `Plan` (kept structural: no import of the planner here)."""

    @property
    def version(self) -> int:
        """Plan version."""
        ...

    @property
    def created_ms(self) -> int:
        """When the plan was built (wall clock, ms)."""
        ...

    @property
    def keys(self) -> tuple[str, ...]:
        """Admitted keys."""
        ...

    @property
    def offsets(self) -> Any:
        """numpy int array (n_admitted + 1,): CSR offsets into `targets`."""
        ...

    @property
    def targets(self) -> Any:
        """numpy int array (sum k_b,): destination indices."""
        ...

    @property
    def destinations(self) -> Sequence[Any]:
        """Destinations of the plan by index (items with a `.name`)."""
        ...


log = logging.getLogger(__name__)


class RouteKind:
    """Why a request went where it went (indices into `Router.counts`)."""

    PLAN: Final = 0
    COLD: Final = 1
    PLAN_DOWN: Final = 2
    STALE: Final = 3
    NO_PLAN: Final = 4
    ALL_DOWN: Final = 5
    SPILLED: Final = 6
    BAD_KEY: Final = 7
    """Not a routable string key (e.g. a list or dict): power-of-two-choices."""
    SPILL_HOME: Final = 8
    """A planned key sent to its spill home, the less loaded of the two (`Router.spill_home`)."""
    CONTEXT_HOME: Final = 9
    """A key new in the live plan sent where its context is cached (`Router.context_home`)."""
    PREFIX: Final = 10
    """Of the cold routes: a key new to this gateway sent where its prompt's leading blocks
    went (`Router.prefix_blocks`); also counted as `cold`."""
    COST: Final = 11
    """Of the cold routes: a key placed where its prompt's missing blocks plus the destination's
    recent cache churn cost least (`Router.cold_cost`); also counted as `cold`."""
    NAMES: Final = (
        "plan",
        "cold",
        "plan_down",
        "stale",
        "no_plan",
        "all_down",
        "spilled",
        "bad_key",
        "spill_home",
        "context_home",
        "prefix",
        "cost",
    )


SHARDS: Final = 64
SHARD_MASK: Final = SHARDS - 1
ONE_DICT_MAX_KEYS = 80_000
"""`table_from_plan` puts up to this many single-replica keys in one dict, filled a slice at a
time by C-level `dict.update`, ~4x faster than the per-key loop larger plans use over `SHARDS`
dicts (4-5 ms against 14 ms for 61k keys: the loop pays a bytecode round per key). The dict is
made at its final size (`presized_dict`, below `PRESIZE_MAX`): grown from empty, its last resize
copied 43,690 entries at once with the GIL held, 0.6-1.7 ms on a 2-core machine."""
DEFAULT_SPILL_FACTOR = 2.0
"""A planned destination with twice the mean in-flight requests takes no more planned ones."""
DEFAULT_SPILL_MIN_INFLIGHT = 4
"""...as long as it has at least this many requests' worth in flight from this gateway: an engine
batches sequences, so one or two in flight is no queue. With load units (`acquire(d, units)`) a
request's worth is the mean units of the requests in flight, so the floor means the same whatever
a request weighs. (Measured: a floor of 16 requests never let a planned key spill at 4+ gateways,
and long-context keys piled onto one replica; 16 *units*, the old floor, was below one long
prompt, so conversations spilled off their warm replica at once. docs/EVALUATION.md.)"""
DEFAULT_COLD_LOAD_FACTOR = 1.25
"""The cold path's bound, as CHWBL's c: no destination takes a cold key above 1.25x the mean."""
DEFAULT_UNIT_TOKENS = 512
"""Prompt tokens per load unit: prefilling 512 tokens (~20 ms on an H100 for an 8B model) is
about what one request's share of the decode batch costs over a short answer."""
RING_VNODES: Final = 160
"""Points per destination on the cold path's ring (`ring_hash` of `name#j`)."""
PREFIX_SHARE: Final = 0.25
"""`Router.prefix_blocks`: a new cold key follows its prompt's blocks when one destination got
more than this share of them as its leading run, and a known cold key stays where it went last
only while that destination still got more than this share of its blocks. Preble's exploit rule
uses one half; for new keys a quarter was as good or better on every replay source tried (the
long-context conversation trace with session keys at one gateway: 0 -> 39.4, 0.25 -> 40.3,
0.5 -> 39.4 req/s, from 37.7 without)."""
CHURN_WEIGHT: Final = 0.03
"""`Router.cold_cost`: what one block of a destination's recent churn weighs against one prompt
block missing there. Small on purpose: a placement's own prefill decides, and churn mostly breaks
what would be ties (measured at one gateway, SLO capacity, req/s: 0.1 took the recorded demo
traffic 322 -> 301, 0.03 to 330; 0 sent every tie to the first destination, request max/mean
2.6)."""
CONTEXT_CHURN_LIMIT = 1.5
"""`Router.cold_cost`: past the load bound, a conversation keeps its context slack at a
destination (may queue there for its warm cache) only while that destination's recent cache
churn, less the conversation's own prompt blocks, is at most this x the mean of the live
destinations' (`Router._conversation`). Preble's rebalancing rule in our units: a replica taking
in far more new prefill than the others builds a queue that in-flight counts understate (the
attention over long cached contexts and their decode steps are not in the units), and the
conversations there wait behind it rather than recompute elsewhere. Its own blocks are left out
so that a conversation never leaves a replica for the churn its own recompute caused there (with
few conversations, it would move on every turn). Measured on the tenant chat trace at one
gateway (`--quick --seeds 3`, SLO capacity req/s): no limit 51.3, 2.0 52.1, 1.5 53.8; the
conversation trace with default keys 74.1 either way. (Applied below the bound too and with the
conversation's own blocks counted, 2.0 measured 55.4, but that moves a lone conversation on
every turn.)"""
CHURN_HALF_LIFE = 0.2
"""`Router.cold_cost`: a destination's churn halves each time the cluster's caches together take
in this share of their capacity (`prefix_blocks` x destinations, in blocks): about the time a
replica's cache takes to turn over a fifth, so churn says where contexts are being pushed out
now, not an hour ago (2.0 instead: the same capacity on the conversation trace, hit rate 0.612
against 0.616)."""
_COLD_CACHE_KEYS: Final = 1 << 16
"""Entries kept in each of a router's per-key memories (cold keys' ring positions, contexts,
spill homes); a full one starts over empty (`Router._kept`)."""
_FIELD: Final = (1 << 24) - 1
"""A destination index or ring position in a packed memory entry (24 bits; `_cold_entry`)."""
_PROMPT_FIELD: Final = (1 << 40) - 1
"""Prompt tokens in a packed context entry (40 bits; `_context_entry`)."""
_SHED_PER_INSERT: Final = 4
"""Entries of a retired memory freed per insert into a live one (`Router._shed`): a memory of
`_COLD_CACHE_KEYS` entries is gone after a quarter of that many inserts, long before the next
one fills."""


_M64: Final = (1 << 64) - 1

COMPILED_FROM: str | None = None
"""None when this module runs as Python; in the copy setup.py compiles with mypyc, the SHA-256 of
the routing.py it was compiled from (the same decisions, in less time per request)."""


def _updates_are_atomic() -> bool:
    """Whether an in-flight update needs no lock here: True in the compiled module under a GIL.

    Compiled code runs no interpreter loop, and only the interpreter loop hands the GIL to
    another thread (at its eval-breaker checks); the generated C of an update (list get, tagged
    int arithmetic, list set, the decref of an int) calls no Python code and releases nothing.
    So an update, read to write, runs as one step for every other thread, as the lock made it.
    As Python, an update is bytecode, which may be interrupted between its read and its write
    (3.11 checks only at calls and backward jumps, but nothing promises that), so it keeps the
    lock; and so does a free-threaded build (`sys._is_gil_enabled`, 3.13+), which has no GIL to
    rely on. The lock cost ~300-400 ns per decision of the documented path here, about a third
    of it (README, "Gateways: the dispatcher", has the interleaved `bench dispatcher` runs).
    """
    gil = getattr(sys, "_is_gil_enabled", None)
    return COMPILED_FROM is not None and (gil is None or bool(gil()))


_ATOMIC: Final[bool] = _updates_are_atomic()
"""In-flight counters are updated without `Router._lock` (see `_updates_are_atomic`)."""


def compiled_is_stale() -> bool:
    """True when this is the compiled module but routing.py beside it has changed since (an
    editable install edited after `make install`): the process runs the old code."""
    if COMPILED_FROM is None:
        return False
    source = Path(__file__).with_name("routing.py")
    try:
        return hashlib.sha256(source.read_bytes()).hexdigest() != COMPILED_FROM
    except OSError:  # an install without the sources: nothing to be stale against
        return False


def _mix64(x: int) -> int:
    """splitmix64's finaliser: a well-mixed 64-bit score (rendezvous hashing within a group)."""
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def ring_hash(text: str) -> int:
    """The stable 64-bit hash of the cold-path ring (the same in every process and gateway):
    XXH3-64 (seed 0) of the UTF-8 text, as the xxHash specification defines it, so a gateway
    written in another language computes the same ring from its own xxHash library.

    It runs on every cold key's first sight, inside the routing decision: ~100 ns here, where
    the blake2b-64 it replaced took ~600 ns (a new key's decision then cost ~2.5 us, most of
    the slowest 1% of `bench dispatcher`); routing needs spread and stability, not a
    cryptographic hash."""
    return xxh3_64_intdigest(text.encode())


@functools.lru_cache(maxsize=16)
def _ring(names: tuple[str, ...]) -> tuple[list[int], list[int], list[int], list[int], int]:
    """(sorted points, owner index of each point, next other, bucket starts, bucket shift) of
    the cold-path ring over `names`.

    `next other[j]`: the first point clockwise after j whose owner differs from point j's
    (j itself when one destination owns the whole ring), so a key's first two distinct
    destinations are two lookups instead of a walk (a cold key's first sight and spill homes).

    Depends only on the names, so routers over the same destinations share one (callers never
    mutate the lists).
    """
    ring = sorted(
        (ring_hash(f"{name}#{j}"), i) for i, name in enumerate(names) for j in range(RING_VNODES)
    )
    points, owners = [p for p, _ in ring], [o for _, o in ring]
    n = len(owners)
    far = [-1] * (2 * n)  # over the ring unrolled twice: the next point with another owner
    for j in range(2 * n - 2, -1, -1):
        far[j] = j + 1 if owners[(j + 1) % n] != owners[j % n] else far[j + 1]
    nxt = [far[j] % n if far[j] >= 0 else j for j in range(n)]
    # bucket b holds the points whose top bits are b: `ring_start` scans one bucket (about one
    # point) instead of bisecting all of them (~250 ns over 4,800 points of 64-bit ints)
    shift = 64 - max(1, n.bit_length())
    first = [bisect.bisect_left(points, b << shift) for b in range((1 << (64 - shift)) + 1)]
    return points, owners, nxt, first, shift


def ring_start(points: list[int], first: list[int], shift: int, h: int) -> int:
    """`bisect.bisect_left(points, h)` for a ring hash `h` (0 <= h < 2**64) through the ring's
    buckets (`_ring`): every point before `first[b]` is below bucket b's start, so below h, and
    every point from `first[b + 1]` on is at or past the next bucket's start, so above h."""
    b = h >> shift
    i, end = first[b], first[b + 1]
    while i < end and points[i] < h:
        i += 1
    return i


@dataclass(frozen=True)
class RoutingTable:
    """One plan version, mapped onto a gateway's destinations.

    Single-replica keys (the vast majority) map to a plain int, multi-replica keys to a tuple in
    `multi`: ints are not tracked by Python's cyclic GC, so building a 100k-key table does not
    trigger collector passes. A large single-replica map is split into `SHARDS` dicts by key
    hash (`mask`): one 100k-entry dict rehashes everything at once when it grows (over a
    millisecond with the GIL held, stalling every routing thread); shards grow in steps of a few
    thousand entries. Up to `ONE_DICT_MAX_KEYS` admitted keys it is one dict (mask 0), made at
    its final size so it never rehashes, and filled much faster (`table_from_plan`).
    """

    version: int
    created_ms: int
    shards: tuple[dict[str, int], ...]
    multi: dict[str, tuple[int, ...]]
    unknown_destinations: frozenset[str] = frozenset()
    """Destinations the plan names but this gateway does not know (dropped from every T(b))."""
    unplanned_destinations: frozenset[str] = frozenset()
    """Destinations this gateway knows but the plan does not name (they get cold traffic only)."""
    groups: dict[str, tuple[int, ...]] = field(default_factory=dict)
    """Group (the key's text before the last `group_separator`) -> the destinations its admitted
    keys use, in index order: where a key the plan does not admit goes if its group is known."""
    group_separator: str | None = None
    mask: int = SHARD_MASK
    """A key's shard is `hash(key) & mask` (len(shards) - 1; 0: one dict)."""

    def __post_init__(self) -> None:
        if len(self.shards) != self.mask + 1:
            raise DispatchError(f"{len(self.shards)} shards do not match mask {self.mask}")

    def __len__(self) -> int:
        return sum(len(s) for s in self.shards) + len(self.multi)

    def __contains__(self, key: object) -> bool:
        return key in self.shards[hash(key) & self.mask] or key in self.multi

    def targets(self, key: str) -> tuple[int, ...]:
        """T(b) of a key as gateway-local indices (empty for a cold key). Not the hot path."""
        one = self.shards[hash(key) & self.mask].get(key)
        if one is not None:
            return (one,)
        return self.multi.get(key, ())


def _empty_shards() -> tuple[dict[str, int], ...]:
    return tuple({} for _ in range(SHARDS))


def _split(
    members: Mapping[str, tuple[int, ...]],
) -> tuple[tuple[dict[str, int], ...], dict[str, tuple[int, ...]]]:
    shards = _empty_shards()
    multi: dict[str, tuple[int, ...]] = {}
    for k, v in members.items():
        if len(v) == 1:
            shards[hash(k) & SHARD_MASK][k] = v[0]
        else:
            multi[k] = v
    return shards, multi


def build_table(
    version: int,
    created_ms: int,
    assignments: Iterable[tuple[str, Sequence[str]]],
    plan_destinations: Sequence[str],
    gateway_destinations: Sequence[str],
    *,
    yield_every: int = 0,
    pause: Callable[[], None] | None = None,
    group_separator: str | None = None,
) -> RoutingTable:
    """Map (key, destination names) pairs onto gateway-local indices.

    `pause` is called every `yield_every` keys: the dispatcher passes `time.sleep(0)` so a large
    table built in a background thread releases the GIL often and never stalls route() for long.
    """
    local = {name: i for i, name in enumerate(gateway_destinations)}
    unknown = frozenset(d for d in plan_destinations if d not in local)
    unplanned = frozenset(d for d in gateway_destinations if d not in set(plan_destinations))
    members: dict[str, tuple[int, ...]] = {}
    for n, (key, names) in enumerate(assignments, start=1):
        idx = tuple(local[d] for d in names if d in local)
        if idx:
            members[key] = idx
        if pause is not None and yield_every and n % yield_every == 0:
            pause()
    shards, multi = _split(members)
    groups: dict[str, tuple[int, ...]] = {}
    if group_separator:
        sizes = np.fromiter(map(len, members.values()), dtype=np.int64, count=len(members))
        groups = _groups(
            list(members),
            np.concatenate(([0], np.cumsum(sizes))),
            np.fromiter((t for v in members.values() for t in v), np.int64, int(sizes.sum())),
            group_separator,
        )
    return RoutingTable(
        version, created_ms, shards, multi, unknown, unplanned, groups, group_separator
    )


@dataclass
class Router:
    """The routing state of one gateway: destinations, liveness, in-flight counts, live table."""

    destinations: Sequence[str]
    rng: random.Random = field(default_factory=random.Random)
    table: RoutingTable | None = None
    stale: bool = False
    """Set by the owner (from plan age vs the staleness limit); True routes everything by P2C."""
    spill_factor: float | None = DEFAULT_SPILL_FACTOR
    """Overload bound for planned routes, as a multiple of the mean in-flight count (None: off)."""
    spill_min_inflight: int = DEFAULT_SPILL_MIN_INFLIGHT
    """Below this many in-flight requests a destination is never overloaded (engines batch them)."""
    cold_affinity: bool = True
    """Cold keys by bounded-load consistent hashing (False: power-of-two-choices, the paper)."""
    cold_load_factor: float = DEFAULT_COLD_LOAD_FACTOR
    cold_choices: int = 2
    """Candidates of a key new to this gateway: 2 = the less loaded of its two consistent
    choices (power of two choices, both fixed by hashing), 1 = its first choice only."""
    unit_tokens: int = DEFAULT_UNIT_TOKENS
    """Prompt tokens per load unit in `work_units` (one unit is also a request's decode)."""
    context_slack: bool = True
    """A key may stay where its context is cached until that destination's load exceeds the
    bound by what recomputing the context would cost (`work_units`); False: the plain bounds."""
    spill_home: bool = False
    """Only for a gateway that routes *all* of the cluster's traffic (one gateway): a planned
    single-replica key that this gateway has spilled before goes to the less loaded of its
    planned destination and that spill home, each less the key's context slack there. See the
    module docstring for why it needs the whole view."""
    context_home: bool = False
    """Only for a gateway that routes *all* of the cluster's traffic (one gateway): a
    single-replica key that the live plan admits and the previous plan did not (newly admitted:
    until now the cold path routed it) goes where this gateway sent its conversation last -
    its context home, where the cold path left its history - instead of its planned destination,
    while the context home's load less the context's slack there is below the planned
    destination's load. Counted as `context_home`.

    Why: on long-context chat traffic most admitted keys are conversations admitted while they
    run, and the plan, placing them by load alone, moved each one's next turn away from its cache
    (at one gateway, two thirds of the turns that changed replica were such moves; KV hit rate
    0.60 -> 0.63 with this rule). Only for newly admitted keys: a key the plan already held is
    where the plan put it, and following contexts there would undo the plan's balance (tried:
    whale requests max/mean 1.16 -> 1.31). With G gateways each one's context covers only its
    share of a conversation's turns and its loads are a 1/G sample; measured at 4 gateways it
    cost 1-3% of capacity, so it is for a sole gateway, as `spill_home` is."""
    cache_tokens: int | None = None
    """Only for a gateway that routes *all* of its destinations' traffic (one gateway): the KV
    cache capacity of one destination, in tokens (vLLM logs it at start-up as its GPU KV cache
    size). With it, what a key's context still has cached at a destination is estimated with
    LRU in mind - the tokens sent there since push it out - instead of assuming it stays until
    the key goes elsewhere. A long-context conversation whose history was evicted is then
    charged its recompute, and others are not sent to queue behind it. Measured at one gateway
    (SLO capacity, req/s): the long-context conversation trace at full size, 42.5 -> 43.5 with
    default keys and 35.2 -> 37.7 with session keys; the conversation workload 63.8 -> 65.5 at
    `--quick --seeds 3` but 65.7 -> 64.2 (one load step) in one full-size run. At 4 and 16
    gateways, each counting only its own share of the inserts and missing the other gateways'
    refreshes of the same key, it was mixed (-9% to +4%), so it is for a sole gateway."""

    prefix_blocks: int = 0
    """> 0: prefix affinity for cold keys. The router remembers, per destination, the last
    `prefix_blocks` prompt blocks (chained block hashes) it sent there (`remember`; an LRU like
    the approximate prefix trees of SGLang's and Preble's routers, of this gateway's own
    requests), and a cold key it has not routed before goes where the longest run of its
    prompt's leading blocks went, if that run is more than `PREFIX_SHARE` of the blocks and
    that destination is under the cold bound; counted as `prefix` (and `cold`). A new
    conversation then starts where its system prompt, or its tenant's shared prompt, is warm
    even when its key (a session) says nothing of it and the plan has no group for it. A cold
    key it has routed before stays where it went last only while that destination got more
    than `PREFIX_SHARE` of its prompt's blocks: past that its history there was pushed out,
    staying saves nothing, and it is placed again by the cold path (group, ring, bound).
    0: off. Needs `blocks` in `route_index`; planned keys are not affected. Measured in the
    replay at one gateway (SLO capacity, req/s, full size): the first rule took recorded demo
    traffic 274 -> 315, the long-context conversation trace with session keys 37.7 -> 40.3,
    paper-like 339 -> 347; the second one then 315 -> 322 and 40.3 -> 41.3, paper-like 347 ->
    339 (one load step, a tie with `preble`), the low-reuse workload unchanged (docs/EVALUATION.md).
    Placing cold keys by cost instead (load plus the prefill of the blocks not sent there, as
    Preble's explore step does) was measured and is not used: new keys by cost took the demo
    traffic 315 -> 262 and made the low-reuse workload a `deploy` (1.12x Flat-LB)."""

    cold_cost: bool = False
    """Only for a gateway that routes *all* of the cluster's traffic, with `prefix_blocks`: a
    cold key that has to be placed - new to this gateway with no destination holding more than
    `PREFIX_SHARE` of its prompt's leading blocks, or a known key whose context at its last
    destination is gone or that is past the bound there - goes to the destination under the
    cold bound where it costs least: the prompt's leading blocks this gateway did not send there
    (what it would prefill) plus `CHURN_WEIGHT` x the blocks that destination took in recently
    (its cache churn, decayed with `CHURN_HALF_LIFE`; both from the prefix index). Counted as
    `cost` (and `cold`). Without it such a key goes to its group's or the ring's destinations.
    With `spill_home` too, a key's first spill home is the least churned destination
    (`_new_home`).

    Why: on long-context conversation traffic a replica's cache holds a handful of
    conversations, and whether a conversation's next turn still finds its history depends on
    how much the replica took in since. At one gateway on the conversation trace keyed per
    conversation (20 req/s), the turns that stayed where their history was lost 0.16 of all
    prompt tokens to eviction, against 0.03 for a prefix-matching router like Preble, whose new
    and evicted conversations go where load plus missing prefill is least: the group and ring
    rules re-started conversations without regard for where contexts were being pushed out.
    Placed by missing blocks, churn breaking the ties: eviction loss 0.16 -> 0.12, hit rate
    0.575 -> 0.616, request max/mean 1.35 -> 1.12, p99 TTFT 6.8 -> 6.2 s. SLO capacity at full
    size (req/s): that trace 41.3 -> 44.2, recorded demo traffic 322 -> 337, conversation
    workload 68.8 -> 70.3, paper-like 339 -> 347, Mooncake arXiv 46.1 -> 47.1, low-reuse
    265 -> 290 (still a tie with Flat-LB, 1.095x); whale, Azure, both chat traces and the
    conversation trace with default keys unchanged. (Load in place of churn, as Preble's
    explore step has it, took the demo traffic to 281 and made the low-reuse workload a
    `deploy`.) With G gateways each index and churn count sees only 1/G of the inserts, as with
    `prefix_blocks`, so it is for a sole gateway."""

    def __post_init__(self) -> None:
        self._validate()
        self.names: list[str] = list(self.destinations)
        self.index: dict[str, int] = {d: i for i, d in enumerate(self.names)}
        self.inflight: list[int] = [0] * len(self.names)
        self._held: list[InFlight] = [InFlight(self, i, 1, n) for i, n in enumerate(self.names)]
        """One shared one-unit `InFlight` per destination (`hold`)."""
        self.up: list[bool] = [True] * len(self.names)
        self.live: list[int] = list(range(len(self.names)))
        self.n_live = len(self.live)
        """len(`live`), kept beside it for the planned path's spill test (one call less per
        decision; set right after `live`, and only that heuristic reads it)."""
        self.counts: list[int] = [0] * len(RouteKind.NAMES)
        self.total_inflight = 0
        self.total_requests = 0
        """Requests in flight (one per `acquire`, whatever its units)."""
        self._lock = threading.Lock()
        self._peer_units: list[int] = [0] * len(self.names)
        """Per destination, the load the other gateways last said they hold there
        (`set_peer_loads`): counted in `inflight` and `total_inflight` on top of this
        gateway's own."""
        self._peer_requests = 0
        """The other gateways' requests in flight, counted in `total_requests`."""
        (
            self._ring_points,
            self._ring_owners,
            self._ring_next,
            self._ring_first,
            self._ring_shift,
        ) = _ring(tuple(self.names))
        self._cold_start: dict[str, int] = {}
        """Cold key -> its ring position, last destination and ring hash, packed in one int
        (`_cold_entry`): a dict of str -> int is never tracked by the cyclic collector, where
        tuple values made every young-generation pass visit the fresh ones (2-3 ms measured
        when 19k had piled up)."""
        self._salts: list[int] = [ring_hash(name) for name in self.names]
        self._context: dict[str, int] = {}
        """Key -> (destination, prompt tokens, the destination's `_inserted` count after it) of
        its last request from this gateway, packed in one int (`_context_entry`; untracked by
        the collector, as `_cold_start`)."""
        self._inserted: list[int] = [0] * len(self.names)
        """Per destination: prompt tokens this gateway sent there that were not expected in its
        cache (what the engine inserted into its cache), a running total."""
        self._homes: dict[str, int] = {}
        """Planned key -> where this gateway last spilled it (`spill_home`)."""
        self._home_keys: list[int] = [0] * len(self.names)
        """Per destination: how many keys have it as their spill home (`_new_home`)."""
        self._retiring: list[Any] = []
        """Full per-key memories replaced by empty ones, freed a few entries at a time
        (`_kept`, `_shed`)."""
        self._prefixes = (
            PrefixIndex(len(self.names), self.prefix_blocks) if self.prefix_blocks > 0 else None
        )
        self._prefix_lock = threading.Lock()
        """Serialises `remember` and the match (an insert updates two structures)."""
        self._churn: list[float] = [0.0] * len(self.names)
        """Per destination (`cold_cost`): blocks new to it by the prefix index, decayed, as of
        `_churn_at`."""
        self._churn_at: list[int] = [0] * len(self.names)
        self._churn_clock = 0
        """Blocks new to their destination over all of this gateway's `remember` calls."""
        self._churn_half = CHURN_HALF_LIFE * len(self.names) * max(1, self.prefix_blocks)
        self.previous_table: RoutingTable | None = None
        """The table `table` replaced, set by whoever swaps plans in (the dispatcher, the
        replay) just before the swap: `context_home` asks it which keys are new in the live
        plan (None: none are treated as new)."""

    def _validate(self) -> None:
        """Refuse settings no route could honour, with what to set instead."""
        if not self.destinations:
            raise DispatchError("a router needs at least one destination")
        if self.prefix_blocks < 0:
            raise DispatchError(f"prefix_blocks must be >= 0, got {self.prefix_blocks!r}")
        if self.cold_cost and self.prefix_blocks == 0:
            raise DispatchError("cold_cost places keys by the prefix index: set prefix_blocks > 0")
        if self.spill_factor is not None and not (
            math.isfinite(self.spill_factor) and self.spill_factor >= 1.0
        ):
            raise DispatchError(f"spill_factor must be >= 1 or None, got {self.spill_factor!r}")
        if self.spill_min_inflight < 1:
            raise DispatchError(f"spill_min_inflight must be >= 1, got {self.spill_min_inflight}")
        if len(set(self.destinations)) != len(self.destinations):
            raise DispatchError("destination names must be distinct")
        if self.cold_choices not in (1, 2):
            raise DispatchError(f"cold_choices must be 1 or 2, got {self.cold_choices!r}")
        if self.unit_tokens < 1:
            raise DispatchError(f"unit_tokens must be >= 1, got {self.unit_tokens!r}")
        if self.cache_tokens is not None and self.cache_tokens < 1:
            raise DispatchError(f"cache_tokens must be >= 1 or None, got {self.cache_tokens!r}")
        if not (math.isfinite(self.cold_load_factor) and self.cold_load_factor >= 1.0):
            raise DispatchError(f"cold_load_factor must be >= 1, got {self.cold_load_factor!r}")
        if len(self.destinations) * RING_VNODES > _FIELD:  # ring positions fit `_cold_entry`
            raise DispatchError(
                f"a router takes at most {_FIELD // RING_VNODES} destinations, "
                f"got {len(self.destinations)}"
            )

    def install(self, table: RoutingTable) -> None:
        """Make `table` the live plan: one reference assignment, atomic under the GIL, so a
        route() sees the old table or the new one, never a mix. The table it replaces becomes
        `previous_table` with `context_home` (set first: a route() in between sees both as the old
        one); without, no reference to the old table is kept."""
        self.previous_table = self.table if self.context_home else None
        self.table = table

    # --------------------------------------------------------------------------- decisions
    def route_index(  # noqa: PLR0911, PLR0912 - one return per rule; the hot path written out
        self, key: object, session: object = None, blocks: Sequence[int] | None = None
    ) -> int:
        """The destination index for `key` (see the module docstring for the rules).

        `session`: what identifies the request's conversation when the key is coarser (a tenant
        header, a system-prompt hash): a planned key's replicas then share its traffic by
        conversation instead of request by request (`_by_session`), and the key's context
        (`work_units`, context slack) is tracked per conversation. None (or the key itself): by
        load alone. `blocks`: the prompt's chained block hashes, for `prefix_blocks` (a key new
        to the cold path goes where they went; call `remember` after routing).

        Never raises: a key that cannot be routed as a string (unhashable, not a str, a str
        subclass whose hash fails) goes by power-of-two-choices and is counted as `bad_key`, and a
        session that is not a str is ignored. (Hence `object` in the signature: compiled with
        mypyc, a `str` parameter would raise TypeError at the call. A try block costs nothing on
        Python 3.11 until something raises.)"""
        if not isinstance(key, str):
            self.counts[7] += 1
            return self._p2c()
        try:
            ctx = key if session is None or not isinstance(session, str) else session
            table = self.table
            if table is not None and not self.stale:
                best = table.shards[hash(key) & table.mask].get(key)
                if best is not None and self.cold_cost:
                    # a sole gateway: a single-replica key (or its conversation) by cost too
                    best, load = self._conversation((best,), ctx, blocks)
                elif best is not None:  # single-replica key (the common case)
                    if self.up[best]:
                        load = self.inflight[best]
                        if self.spill_home and (home := self._home(key, ctx, best, load)) >= 0:
                            self.counts[8] += 1
                            return home
                        if self.context_home and (home := self._context_at(key, ctx, best)) >= 0:
                            self.counts[9] += 1
                            return home
                    else:
                        best = -1
                else:
                    members = table.multi.get(key)
                    if members is None:
                        self.counts[1] += 1
                        return self._cold(key, ctx, blocks)
                    if ctx is key or ctx == key:
                        best, load = self._least_loaded(members)
                    elif self.cold_cost:
                        best, load = self._conversation(members, ctx, blocks)
                    else:
                        best, load = self._by_session(members, ctx)
                if best < 0:
                    self.counts[2] += 1
                    return self._cold(key, ctx, blocks)
                f = self.spill_factor
                if self.context_slack:  # its cached context at `best` buys it slack (`_slack`)
                    context = self._context.get(ctx, -1)
                    if context >= 0 and (context & _FIELD) == best:
                        load -= self._cached(context, best) // self.unit_tokens
                if (
                    f is not None
                    and load * self.n_live >= f * (self.total_inflight + 1)
                    # and at least spill_min_inflight requests' worth of units (see its doc)
                    and load * self.total_requests >= self.spill_min_inflight * self.total_inflight
                ):
                    self.counts[6] += 1
                    spilled = self._spill(key, ctx)
                    if self.cold_cost:  # a sole gateway: the conversation's context is there now
                        self._hold_context(ctx, spilled)
                    return spilled
                self.counts[0] += 1
                return best
            self.counts[4 if table is None else 3] += 1  # no plan yet, or a stale one
            return self._cold(key, ctx, blocks)
        except Exception:  # route() must never raise, whatever the key
            self.counts[7] += 1
            return self._p2c()

    def _spill(self, key: str, ctx: str) -> int:
        """A planned request past the spill bounds: the cold path (remembered as the key's
        spill home with `spill_home`, where a key's first spill picks its home, see
        `_new_home`)."""
        if not self.spill_home:
            return self._cold(key, ctx)
        d = self._new_home(key) if key not in self._homes else -1
        if d < 0:
            d = self._cold(key, ctx)
        homes = self._kept(self._homes)
        if homes is not self._homes:  # it was full: started over, so no key has a home
            self._homes = homes
            self._home_keys = [0] * len(self.names)
        old = homes.get(key, -1)
        if old != d:
            if old >= 0:
                self._home_keys[old] -= 1
            self._home_keys[d] += 1
            self._homes[key] = d
        return d

    def _new_home(self, key: str) -> int:
        """The spill home of a key spilled for the first time: of its two consistent cold
        candidates (its group's top two, else its first two ring destinations), the one that is
        already the spill home of fewer keys, if it is up and below the cold bound; else -1 (the
        cold path decides).

        Why: a spill home takes the key's overflow for as long as the key stays hot, so homes
        are long-lived load, and the cold path alone puts them wherever the keys' hashes fall.
        On `whale` at one gateway, the busiest destination took twice the mean spill-home
        prefill. Choosing the less used of two fixed candidates is the power of two choices
        applied to homes (a maximum of about log log n homes per destination instead of
        log n / log log n): at the reference load, prefill max/mean 1.150 -> 1.131 and SLO
        capacity 373 -> 382 req/s at full size (1.39 -> 1.28 at `--quick --seeds 3`); the long-
        context conversation trace at one gateway 42.5 -> 43.5 with default keys, 38.6 -> 37.7
        (one load step) with session keys (docs/EVALUATION.md).

        With `cold_cost` the router counts each destination's recent cache churn, which is its
        recent uncached prefill, and a sole gateway need not agree with anyone on candidates: the
        home is then the destination under the cold bound that churned least. On `whale` at one
        gateway, prefill max/mean at the reference load 1.19 -> 1.06 at full size (1.16 -> 1.11
        at `--quick --seeds 3`, where SLO capacity is the same, 456 req/s; one load step lower
        at full size, 382 -> 373); paper-like 1.24 -> 1.07 at the same capacity; the
        conversation trace with default keys 43.5 -> 44.5 req/s. (The least churned of all
        destinations, falling back to the cold path when it was past the bound, measured about
        the same: whale 1.07, paper-like 1.10.)
        """
        if not self.live:
            return -1
        bound = self._cold_bound()
        h = ring_hash(key)
        start = ring_start(self._ring_points, self._ring_first, self._ring_shift, h)
        if self.cold_cost:
            under = [x for x in self.live if self.inflight[x] < bound]
            if not under:
                return -1
            d = min(under, key=self.churn)
        else:
            first, second = self._two_candidates(key, h, start)
            homes = self._home_keys
            d = second if second >= 0 and homes[second] < homes[first] else first
            if not self.up[d] or self.inflight[d] >= bound:
                return -1
        self._cold_start = self._kept(self._cold_start)
        self._cold_start[key] = _cold_entry(start, d)  # later cold routes start there
        return d

    def _home(self, key: str, ctx: str, best: int, load: int) -> int:
        """The key's spill home if it is less loaded than `best` (each less the context slack
        of `ctx` there), else -1. The spill home is where this gateway last spilled the key: its
        prefix is warm there too."""
        home = self._homes.get(key, -1)
        if home < 0 or home == best or not self.up[home]:
            return -1
        if self.inflight[home] - self._slack(ctx, home) < load - self._slack(ctx, best):
            return home
        return -1

    def _context_at(self, key: str, ctx: str, best: int) -> int:
        """`context_home`: where `ctx`'s context is, if `key` is new in the live plan and that
        destination, less the context's slack there, is less loaded than `best`; else -1."""
        context = self._context.get(ctx, -1)
        here = context & _FIELD
        if context < 0 or here == best or not self.up[here]:
            return -1
        previous = self.previous_table
        if previous is None or key in previous:
            return -1
        slack = self._cached(context, here) // self.unit_tokens
        return here if self.inflight[here] - slack < self.inflight[best] else -1

    def _slack(self, key: str, index: int) -> int:
        """Load units `key` may exceed a bound by at `index`: what recomputing its context there
        would cost (0 unless this gateway's last request of the key went to `index`).

        Moving a conversation costs its whole prefix in prefill at the new replica, while
        staying costs the wait behind the extra load at the warm one: a key stays while that
        extra load is below the recompute. Short keys barely differ from the plain bound; a
        long-context conversation tolerates a longer queue before it gives up its cache (the
        trade Preble's rebalancing rule makes in GPU seconds).
        """
        if not self.context_slack:
            return 0
        return self._cached(self._context.get(key, -1), index) // self.unit_tokens

    def _cached(self, context: int, index: int) -> int:
        """Tokens of a key's last prompt (`context`) expected in destination `index`'s cache.

        All of it without `cache_tokens`; with it (an LRU cache of that many tokens) the tokens
        inserted there since evict it from its tail: min(prompt, cache_tokens - inserted since),
        at least 0. A long-context conversation whose history no longer fits next to what came
        after it is then charged its recompute instead of being sent to queue behind its own
        cache miss.
        """
        if context < 0 or (context & _FIELD) != index:  # -1: no context
            return 0
        prompt = (context >> 24) & _PROMPT_FIELD
        cap = self.cache_tokens
        if cap is None:
            return prompt
        left = cap - (self._inserted[index] - (context >> 64))
        return prompt if left >= prompt else max(left, 0)

    def _least_loaded(self, members: tuple[int, ...]) -> tuple[int, int]:
        """(member, its load): the least loaded live member, uniform among ties (-1: none up)."""
        up = self.up
        inflight = self.inflight
        best = -1
        load = 0
        ties = 0
        for m in members:
            if up[m]:
                here = inflight[m]
                if best < 0 or here < load:
                    best = m
                    load = here
                    ties = 1
                elif here == load:  # reservoir sampling: each tied member with p = 1 / ties
                    ties += 1
                    if self.rng.random() * ties < 1.0:
                        best = m
        return best, load

    def _by_session(self, members: tuple[int, ...], session: str) -> tuple[int, int]:
        """(member, its load) for one conversation of a planned key: bounded-load rendezvous.

        The members are ranked by rendezvous hashing of the session, the same on every gateway
        without coordination, and the first one below the bound takes it: CHWBL's bound
        ceil(`cold_load_factor` x (the members' load + 1) / live members), plus the session's
        context slack where its context is. A conversation then stays with the replica that
        holds its history while the key's traffic still spreads over T(b) as planned; picking the
        least loaded member per request instead scatters one conversation's turns over all of
        T(b), and each turn recomputes the whole history (seen on a long-context conversation
        trace keyed by system prompt: a third less capacity than a prefix-matching router).
        Past the bound on every member: the least loaded.

        """
        up, inflight, salts = self.up, self.inflight, self._salts
        total = n = 0
        for m in members:
            if up[m]:
                total += inflight[m]
                n += 1
        if n == 0:
            return -1, 0
        bound = math.ceil(self.cold_load_factor * (total + 1) / n)
        h = ring_hash(session)
        ranked = sorted((m for m in members if up[m]), key=lambda m: _mix64(h ^ salts[m]))
        for m in reversed(ranked):
            if inflight[m] < bound + self._slack(session, m):
                return m, inflight[m]
        return self._least_loaded(members)

    def _conversation(
        self, members: tuple[int, ...], session: str, blocks: Sequence[int] | None
    ) -> tuple[int, int]:
        """(destination, its load) for one conversation (`session`: a request's conversation,
        or a single-replica key itself) of a planned key at a sole gateway (`cold_cost`);
        (-1, 0): no member of T(b) is up (the caller takes the cold path, as without
        `cold_cost`).

        A sole gateway sees all the traffic and need agree with no other gateway on where a
        conversation goes, so it treats each conversation as Preble does a request, with the
        plan as the prior:
        * it stays where its context is, on T(b) or not, while that destination is below the
          cluster's cold bound (CHWBL's, over all live destinations) - or below the bound plus
          the conversation's context slack there while that destination's recent cache churn,
          less the conversation's own prompt blocks, is at most `CONTEXT_CHURN_LIMIT` x the
          mean (the slack is a licence to queue for a warm cache, revoked where the queue is
          growing fastest);
        * else (a new conversation, or one that must move) it is placed like a cold key:
          among the live destinations under the bound, where its prompt's missing blocks plus
          `CHURN_WEIGHT` x recent churn cost least (`_by_cost`). T(b) holds the key's prefix,
          so its members win unless they are busier than that prefix is worth;
        * without the prompt's blocks: the least loaded live member of T(b).
        The destination then holds the conversation's context (no tokens yet: `work_units`
        adds them), so a caller that passes no prompt tokens still keeps its turns together.

        Why: keeping a conversation on T(b) by member load alone (what gateways among several
        must do to agree) left the few replicas of a heavy tenant with queues of long-context
        turns (at 53 req/s the slowest 1% waited 30 s for 0.6 s of prefill each; preble's, 14
        s). On the tenant chat trace at one gateway (`--quick --seeds 3`) SLO capacity
        46.0 -> 53.8 req/s (preble 56.3), the first draw of that shape 44.2 -> 55.2 (preble
        57.7), the conversation trace with default keys 70.8 -> 74.1; the Mooncake arXiv and
        chat-sampled traces and the synthetic workloads unchanged. Single-replica keys placed
        so too (instead of their planned destination and spill home): whale 456 -> 478 (prefill
        max/mean 1.07 -> 1.10), the conversation workload 68.7 -> 73.1 (preble 70.8), the
        conversation trace with session keys 70.5 -> 73.7 (preble 66.4); paper-like 477 and
        the traces above unchanged.
        """
        up, inflight = self.up, self.inflight
        live = self.live
        if not any(up[m] for m in members):  # T(b) is down: the caller's cold path (`plan_down`)
            return -1, 0
        bound = self._cold_bound()
        context = self._context.get(session, -1)
        if context >= 0:
            here = context & _FIELD
            if up[here]:
                load = inflight[here]
                if load < bound:
                    return here, load
                if load < bound + self._slack(session, here):
                    limit = CONTEXT_CHURN_LIMIT * sum(self.churn(x) for x in live)
                    own = len(blocks) if blocks else 0  # at most what it put there itself
                    if (self.churn(here) - own) * len(live) <= limit:
                        return here, load
        best = -1
        if blocks and (lengths := self._match(blocks)) is not None:
            best = self._by_cost(lengths, len(blocks), bound)
        if best < 0:
            best, _ = self._least_loaded(members)  # one is up
        self._hold_context(session, best)
        return best, inflight[best]

    def _hold_context(self, session: str, index: int) -> None:
        """Record destination `index` as where `session`'s context is (no tokens yet:
        `work_units` adds them), so a caller that passes no prompt tokens keeps its turns
        together; used where a sole gateway places a conversation (`_conversation`) or spills
        one of its turns."""
        self._context = self._kept(self._context)
        self._context[session] = _context_entry(index, 0, self._inserted[index])

    def route(self, key: object, session: object = None) -> str:
        """The destination name for `key` (and the request's `session`, see `route_index`)."""
        return self.names[self.route_index(key, session)]

    def _match(self, blocks: Sequence[int]) -> list[int] | None:
        """Per destination, how many of the prompt's leading `blocks` this gateway sent there
        (`prefix_blocks`), or None when it keeps no prefix memory. One place takes the lock
        that `remember` takes, so the cold path and conversation placement read alike."""
        prefixes = self._prefixes
        if prefixes is None:
            return None
        with self._prefix_lock:
            return prefixes.match(list(blocks))

    def _cold(self, key: str, ctx: str | None = None, blocks: Sequence[int] | None = None) -> int:
        """The cold path: where the key's prompt went (`prefix_blocks`), the key's group, else
        bounded-load consistent hashing (or P2C)."""
        live = self.live
        if not self.cold_affinity or not live:
            return self._p2c()
        # `_cold_bound()` written out: this path runs for every cold or spilled request
        bound = math.ceil(self.cold_load_factor * (self.total_inflight + 1) / len(live))
        seen = self._cold_start.get(key, -1)
        n = len(blocks) if blocks else 0
        lengths = self._match(blocks) if n and blocks else None
        if seen < 0:
            self._cold_start = self._kept(self._cold_start)
            h = ring_hash(key)
            start = ring_start(self._ring_points, self._ring_first, self._ring_shift, h)
            if lengths is not None:
                d = self._by_prefix(lengths, n, bound)
                if d >= 0:
                    self.counts[10] += 1
                    self._cold_start[key] = _cold_entry(start, d)
                    return d
        else:
            start, last = seen >> 24, seen & _FIELD
            # its context at `last` is gone (by what this gateway sent where; `prefix_blocks`):
            # staying saves nothing, so it is placed again like any cold key
            stay = lengths is None or lengths[last] > PREFIX_SHARE * n
            # where this gateway sent the key last holds its freshest prefix: stay while it may
            # (slack is never negative: under the bound alone needs no `_slack` call)
            if (
                stay
                and self.up[last]
                and (
                    (load := self.inflight[last]) < bound
                    or load < bound + self._slack(ctx or key, last)
                )
            ):
                return last
            h = ring_hash(key)  # placed again: its hash is not kept (`_cold_entry`)
        if self.cold_cost and lengths is not None:
            d = self._by_cost(lengths, n, bound)
            if d >= 0:
                self.counts[11] += 1
                self._cold_start[key] = _cold_entry(start, d)
                return d
        d = self._cold_place(key, h, start, bound, fresh=seen < 0)
        self._cold_start[key] = _cold_entry(start, d)
        return d

    def _by_prefix(self, lengths: Sequence[int], blocks: int, bound: int) -> int:
        """The live destination this gateway sent the longest run of a prompt's `blocks`
        blocks to (`lengths[d]`; ties: the less loaded), if the run is more than `PREFIX_SHARE`
        of them and it is under `bound`; else -1."""
        inflight = self.inflight
        best = most = -1
        for d in self.live:
            n = lengths[d]
            if n > most or (n == most and inflight[d] < inflight[best]):
                best, most = d, n
        if most <= PREFIX_SHARE * blocks or inflight[best] >= bound:
            return -1
        return best

    def _by_cost(self, lengths: Sequence[int], blocks: int, bound: int) -> int:
        """`cold_cost`: the live destination under `bound` with the least missing blocks (of the
        prompt's `blocks`, `lengths[d]` held there) + `CHURN_WEIGHT` x its churn; -1: none."""
        inflight = self.inflight
        best = -1
        least = 0.0
        for d in self.live:
            if inflight[d] < bound:
                cost = blocks - lengths[d] + CHURN_WEIGHT * self.churn(d)
                if best < 0 or cost < least:
                    best, least = d, cost
        return best

    def churn(self, index: int) -> float:
        """Destination `index`'s recent cache churn in blocks (`cold_cost`), decayed to now."""
        age = (self._churn_clock - self._churn_at[index]) / self._churn_half
        return self._churn[index] * math.pow(0.5, age)

    def remember(self, index: int, blocks: Sequence[int] | None) -> None:
        """Record that a request whose prompt has these chained block hashes went to `index`
        (`prefix_blocks`; a no-op when it is off or there are no blocks), and with `cold_cost`
        the blocks that were new there as its churn. Never raises."""
        prefixes = self._prefixes
        if prefixes is None or not blocks:
            return
        try:
            with self._prefix_lock:
                added = prefixes.insert(index, list(blocks))
                if added and self.cold_cost:
                    now = self._churn_clock
                    self._churn[index] = self.churn(index) + added
                    self._churn_clock = self._churn_at[index] = now + added
        except Exception:  # a hostile block list (not ints): no memory of it, no crash
            log.debug("remember(%r): blocks not recorded", index, exc_info=True)

    def _kept(self, memory: dict[str, int]) -> dict[str, int]:
        """The per-key memory to insert into: `memory`, or when it is full an empty one that
        replaces it (its caller stores it), while the full one is set aside for `_shed` to free a
        few entries per later insert. Called before each insert into a memory.

        Routing is exactly as if a full memory were cleared. Why not `clear()`: freeing 65,536
        entries of (int, int, int) tuples at once took 2-6 ms with the GIL held, on the request
        path of whichever request found the memory full (seen as a 5-6 ms stall of a routing
        thread in `bench dispatcher`). The new memory is made with room for a full one
        (`presized_dict`): one that filled once is likely to fill again, and grown from empty it
        would copy up to 43,690 entries at a time on the requests that make it resize.
        """
        if len(memory) >= _COLD_CACHE_KEYS:
            self._retiring.append(memory)
            return presized_dict(_COLD_CACHE_KEYS)
        if self._retiring:
            self._shed()
        return memory

    def _shed(self) -> None:
        """Free up to `_SHED_PER_INSERT` entries of the retired memories (never raises)."""
        retiring = self._retiring
        try:
            old = retiring[-1]
            for _ in range(_SHED_PER_INSERT):
                if not old:
                    if retiring and retiring[-1] is old:
                        retiring.pop()
                    return
                old.popitem()
        except (IndexError, KeyError):  # another thread freed the same entries
            return

    def _cold_bound(self) -> int:
        """CHWBL's bound on the cold path: a destination may take a cold key while its load is
        below ceil(`cold_load_factor` x (in flight + 1) / live destinations). Needs a live one."""
        return math.ceil(self.cold_load_factor * (self.total_inflight + 1) / len(self.live))

    def _cold_place(self, key: str, h: int, start: int, bound: int, *, fresh: bool) -> int:
        """Where a cold key goes: its group's choice, else the first ring destination under
        the bound. A key new to this gateway takes the less loaded of its two consistent
        candidates (its group's top two, else its first two ring destinations): new keys then
        balance load, while every gateway still chooses between the same two replicas only."""
        up, inflight = self.up, self.inflight
        if fresh and self.cold_choices == 2:
            first, second = self._two_candidates(key, h, start)
            if (
                second >= 0
                and up[second]
                and inflight[second] < bound
                and not (up[first] and inflight[first] <= inflight[second])
            ):
                return second
        else:
            first, second = self._group_top2(key, h)
        if first >= 0 and up[first] and inflight[first] < bound:
            return first
        owners = self._ring_owners
        n = len(owners)
        for j in range(start, start + n):
            d = owners[j % n]
            if up[d] and inflight[d] < bound:
                return d
        return self._p2c()  # unreachable while the counts are consistent: the mean is below

    def _two_candidates(self, key: str, h: int, start: int) -> tuple[int, int]:
        """A key's two consistent cold candidates: its group's top two, else its first two ring
        destinations from ring point `start` (second -1: there is no other)."""
        first, second = self._group_top2(key, h)
        if first < 0:
            return self._ring_top2(start)
        return first, second

    def _group_top2(self, key: str, h: int) -> tuple[int, int]:
        """The key's best two destinations within its group (rendezvous hashing); -1: none.

        Every gateway holding this plan ranks the group's destinations the same way for the key,
        without coordination, so a new conversation of a known tenant lands where the tenant's
        prompt is warm.
        """
        table = self.table
        if table is None or not table.groups or self.stale:
            return -1, -1
        group, sep, _ = key.rpartition(table.group_separator or "/")
        members = table.groups.get(group) if sep else None
        if not members:
            return -1, -1
        salts = self._salts
        first = second = -1
        s1 = s2 = -1
        for m in members:
            sc = _mix64(h ^ salts[m])
            if sc > s1:
                second, s2 = first, s1
                first, s1 = m, sc
            elif sc > s2:
                second, s2 = m, sc
        return first, second

    def _ring_top2(self, start: int) -> tuple[int, int]:
        """The first two distinct destinations clockwise from ring point `start`."""
        owners = self._ring_owners
        j = start % len(owners)
        k = self._ring_next[j]
        return owners[j], (owners[k] if k != j else -1)

    def _p2c(self) -> int:
        live = self.live
        n = len(live)
        if n == 0:
            self.counts[5] += 1
            n_all = len(self.names)
            a = int(self.rng.random() * n_all)
            b = int(self.rng.random() * n_all)
            return a if self.inflight[a] <= self.inflight[b] else b
        if n == 1:
            return live[0]
        rnd = self.rng.random
        i = int(rnd() * n)
        j = int(rnd() * (n - 1))
        if j >= i:
            j += 1  # two distinct candidates
        a, b = live[i], live[j]
        return a if self.inflight[a] <= self.inflight[b] else b

    def work_units(self, key: str, index: int, prompt_tokens: int, session: object = None) -> int:
        """Load units of a `prompt_tokens` prompt of `key` sent to destination `index`.

        What a request costs a replica is the prefill of its *uncached* tokens plus its decode,
        not its prompt length: a conversation's next turn, sent where its previous turn went,
        finds that turn's prompt in the prefix cache and costs only the new message. So the
        units are 1 (the decode) + the tokens not expected in the destination's cache //
        `unit_tokens`, with the cached part estimated as the prompt of the key's previous request
        from this gateway if that request went to the same destination (0 otherwise). Records
        this request as the key's latest (its context for `_slack`); a gateway calls it once per
        request, after `route_index`, and `settle`s all but one unit at the first streamed token
        (the prefill is done; the decode unit stays until the end). With a `session` (as given to
        `route_index`) the context is the session's, not the key's.
        """
        ctx = session if isinstance(session, str) else key
        cached = self._cached(self._context.get(ctx, -1), index)
        self._context = self._kept(self._context)
        uncached = prompt_tokens - cached if prompt_tokens > cached else 0
        self._inserted[index] += uncached
        self._context[ctx] = _context_entry(index, prompt_tokens, self._inserted[index])
        return 1 + uncached // self.unit_tokens

    def hold(
        self,
        key: object,
        units: int = 1,
        *,
        prompt_tokens: object = None,
        session: object = None,
        blocks: Sequence[int] | None = None,
    ) -> InFlight:
        """`Dispatcher.request` (see it; each dispatcher binds its `request` to this): route,
        weigh, count in flight, and return the held request. Here, in the module compiled with
        mypyc, so the documented path is one native call."""
        i = self.route_index(key, session, blocks)
        if blocks is not None:
            self.remember(i, blocks)
        if prompt_tokens is not None:
            try:  # (a key that is not a str went by P2C: one unit)
                count = int(prompt_tokens)  # type: ignore[call-overload]
                units = self.work_units(key, i, count, session) if isinstance(key, str) else 1
            except (TypeError, ValueError, OverflowError):  # a hostile count: one request
                units = 1
        self.acquire(i, units)  # compiled: a direct C call
        if units == 1:
            return self._held[i]  # immutable, shared: no allocation on the common path
        return InFlight(self, i, units, self.names[i])

    # --------------------------------------------------------------------------- in-flight
    def acquire(self, index: int, units: int = 1) -> None:
        """A request was sent to destination `index`; it counts `units` of load until released.

        One unit per request balances request counts. A gateway that knows what a request costs
        (for example its prompt length in blocks) passes that instead, and every rule above then
        balances work: a long prompt weighs what it costs the replica.
        """
        if _ATOMIC:  # compiled: atomic as it is (`_updates_are_atomic`)
            self._add(index, units)
            return
        lock = self._lock
        lock.acquire()  # not `with`: 70 ns less per use on CPython 3.11 (the hot path)
        try:
            self._add(index, units)
        finally:
            lock.release()

    def _add(self, index: int, units: int) -> None:
        """Count one more request, of `units`, at destination `index`; atomic or under the
        lock (`acquire`)."""
        self.inflight[index] += units
        self.total_inflight += units
        self.total_requests += 1

    def settle(self, index: int, units: int) -> None:
        """Part of a request's load at destination `index` is done (e.g. its prompt's prefill,
        at the first streamed token); the request stays in flight with the rest."""
        if _ATOMIC:  # compiled: atomic as it is (`_updates_are_atomic`)
            self._drop(index, units)
            return
        with self._lock:
            self._drop(index, units)

    def release(self, index: int, units: int = 1) -> None:
        """A request to destination `index` finished (its `units`; never goes below zero)."""
        if _ATOMIC:  # compiled: atomic as it is (`_updates_are_atomic`)
            self._remove(index, units)
            return
        lock = self._lock
        lock.acquire()  # no `with`: this runs once per request
        try:
            self._remove(index, units)
        finally:
            lock.release()

    def _remove(self, index: int, units: int) -> None:
        """One request of `units` at destination `index` is done; atomic or under the lock."""
        self._drop(index, units)
        if self.total_requests > 0:
            self.total_requests -= 1

    def set_peer_loads(self, units: Sequence[object], requests: object) -> None:
        """Count what the other gateways hold in flight, on top of this gateway's own load.

        `units[d]`: the sum of the other gateways' latest in-flight units at destination d (as
        their `own_loads` reported them); `requests`: their requests in flight. Replaces the
        previous peer figures. Every rule that reads loads (least-loaded member, spill, cold
        bound) then sees the cluster's load instead of this gateway's share of it: with G
        gateways behind a round-robin balancer each one sends 1/G of the traffic, so its own
        counts hold 1/G of a replica's queue, and a burst that 15 other gateways are also
        sending into looks idle. The routing path itself is unchanged: the peers' figures are
        folded into the same counters here, off the request path. Negative or non-numeric
        entries count as 0.
        """
        n = len(self.names)
        if len(units) != n:
            raise DispatchError(f"peer loads name {len(units)} destinations, this router has {n}")
        new = [u if isinstance(u, int) and u > 0 else 0 for u in units]
        req = requests if isinstance(requests, int) and requests > 0 else 0
        with self._lock:
            old = self._peer_units
            inflight = self.inflight
            for d in range(n):
                inflight[d] += new[d] - old[d]
            self.total_inflight += sum(new) - sum(old)
            self.total_requests += req - self._peer_requests
            self._peer_units = new
            self._peer_requests = req

    def own_loads(self) -> tuple[list[int], int]:
        """(per destination, requests): this gateway's own in-flight load, without its peers'
        (what it reports to them; never below 0)."""
        with self._lock:
            own = [max(0, a - b) for a, b in zip(self.inflight, self._peer_units, strict=True)]
            return own, max(0, self.total_requests - self._peer_requests)

    def _drop(self, index: int, units: int) -> None:
        """Take up to `units` off destination `index` (never below zero); atomic or under the lock."""
        held = self.inflight[index]
        take = units if units <= held else held
        self.inflight[index] = held - take
        self.total_inflight -= take

    # ---------------------------------------------------------------------------- liveness
    def mark_down(self, name: str) -> bool:
        """Exclude a destination at once; False if the name is unknown."""
        return self._set_up(name, False)

    def mark_up(self, name: str) -> bool:
        """Include a destination again; False if the name is unknown."""
        return self._set_up(name, True)

    def _set_up(self, name: str, up: bool) -> bool:
        i = self.index.get(name)
        if i is None:
            return False
        with self._lock:
            if self.up[i] != up:
                self.up[i] = up
                self.live = [j for j, u in enumerate(self.up) if u]  # one reference swap
                self.n_live = len(self.live)
                log.warning("destination %s marked %s", name, "up" if up else "down")
        return True

    def is_up(self, name: str) -> bool:
        """Whether a destination is currently routable."""
        i = self.index.get(name)
        return i is not None and self.up[i]


def _cold_entry(start: int, destination: int) -> int:
    """A cold key's memory entry, one int (`Router._cold_start`): its ring position above its
    last destination (24 bits each; `Router` refuses more destinations than that leaves room
    for). 48 bits: a machine word in the compiled module, where the 112-bit entry that also
    held the key's hash was an arbitrary-precision int on every read. The hash is computed
    again in the rare case it is needed (the key is placed again)."""
    return (start << 24) | destination


def _context_entry(destination: int, prompt_tokens: int, inserted: int) -> int:
    """A key's context entry, one int (`Router._context`): the destination's `_inserted` count
    after it, above the prompt's tokens (clamped to 0 .. 2**40 - 1) and the destination."""
    prompt = min(max(prompt_tokens, 0), _PROMPT_FIELD)
    return (inserted << 64) | (prompt << 24) | destination


def _no_pause() -> None:
    return None


def table_from_plan(
    plan: PlanLike,
    gateway_destinations: Sequence[str],
    *,
    yield_every: int = 0,
    pause: Callable[[], None] | None = None,
    key_groups: KeyGroups | None = None,
) -> RoutingTable:
    """A RoutingTable from a planner `Plan` (CSR arrays: keys, offsets, targets).

    numpy maps the plan's destination indices to this gateway's and finds each key's single
    target (-1: several, or none known here) in one pass; the dict (up to `ONE_DICT_MAX_KEYS`
    keys: made at its final size, `presized_dict`, then one `dict.update` per slice) or the
    shard dicts (key by key) are then filled in plan order, `yield_every` keys at a time with
    `pause()` between slices (the dispatcher passes a GIL yield paced by time), so a background
    build never holds the GIL for long. (Measured: bucketing the keys by shard first and filling
    each shard with one `dict(zip(...))` is no faster - gathering the key objects out of plan
    order misses the cache on every key.) A key listed twice (no planner writes one) ends where
    its later occurrence says. `key_groups` (the dispatcher keeps one
    across versions) remembers each key's sibling group, so only keys new to this gateway are
    split (`KeyGroups`); it is used only when its separator is the plan's.
    """
    pause = pause or _no_pause
    keys = plan.keys
    # made first, with a pause after it: its memory (~2.5 MB at 61k keys) is zeroed as it is
    # made, 0.3-1.2 ms measured when the pages are new to the process
    one_dict = len(keys) <= ONE_DICT_MAX_KEYS
    table0: dict[str, int] = presized_dict(len(keys)) if one_dict else {}
    pause()
    names = [d.name for d in plan.destinations]
    local = {name: i for i, name in enumerate(gateway_destinations)}
    lut = np.array([local.get(n, -1) for n in names] + [-1], dtype=np.int64)
    offsets = np.asarray(plan.offsets, dtype=np.int64)
    targets = (
        lut[np.asarray(plan.targets, dtype=np.int64)]
        if len(plan.targets)
        else np.zeros(0, np.int64)
    )
    k = np.diff(offsets)
    step = yield_every or len(keys) or 1
    single = np.full(len(keys), -1, dtype=np.int64)
    one = np.flatnonzero(k == 1)
    pause()
    if len(one):
        single[one] = targets[offsets[one]]
    pause()
    mask = 0 if one_dict else SHARD_MASK
    shards: tuple[dict[str, int], ...]
    if mask == 0:
        shards = (table0,)  # room for every admitted key: no resize on the way
        fill = table0.update
        for lo in range(0, len(keys), step):
            ts = single[lo : lo + step]
            pairs = zip(keys[lo : lo + step], ts.tolist(), strict=True)
            known = ts >= 0
            fill(pairs if known.all() else compress(pairs, known.tolist()))
            pause()
    else:
        shards = _empty_shards()
        for lo in range(0, len(keys), step):
            for key, t in zip(keys[lo : lo + step], single[lo : lo + step].tolist(), strict=True):
                if t >= 0:
                    shards[hash(key) & SHARD_MASK][key] = t
            pause()
    multi: dict[str, tuple[int, ...]] = {}
    for n, i in enumerate(np.flatnonzero(k > 1).tolist(), start=1):
        idx = tuple(t for t in targets[offsets[i] : offsets[i + 1]].tolist() if t >= 0)
        if len(idx) == 1:
            shards[hash(keys[i]) & mask][keys[i]] = idx[0]
        elif idx:
            multi[keys[i]] = idx
        if n % step == 0:
            pause()
    unknown = frozenset(n for n in names if n not in local)
    planned = set(names)
    unplanned = frozenset(d for d in gateway_destinations if d not in planned)
    sep = getattr(getattr(plan, "params", None), "group_separator", None)
    groups: dict[str, tuple[int, ...]] = {}
    if sep:
        cache = key_groups if key_groups is not None and key_groups.separator == sep else None
        groups = _groups(keys, offsets, targets, sep, step=step, pause=pause, cache=cache)
    return RoutingTable(
        plan.version, plan.created_ms, shards, multi, unknown, unplanned, groups, sep, mask
    )


class InFlight:
    """One routed request held in flight (what `Dispatcher.request` returns).

    A context manager whose `__enter__` gives the destination name and whose `__exit__` releases
    the request's load. Immutable, so the one-unit objects are shared per destination: the
    documented path allocates nothing and runs no generator machinery.
    """

    __slots__ = ("destination", "index", "router", "units")

    def __init__(self, router: Router, index: int, units: int, destination: str) -> None:
        self.router = router
        self.index = index
        self.units = units
        self.destination = destination

    def first_token(self) -> None:
        """The answer's first byte arrived: the prompt is prefilled, so all but one unit (the
        decode) stop counting. The load then tracks the prefill queued at each destination,
        which is what time to first token waits for. Optional; call it at most once."""
        if self.units > 1:  # one-unit objects are shared and never change
            self.router.settle(self.index, self.units - 1)
            self.units = 1

    def __enter__(self) -> str:
        return self.destination

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self.router.release(self.index, self.units)  # compiled: a direct C call

    def release(self) -> None:
        """Release the request's load (for callers that do not use `with`); call it once."""
        self.router.release(self.index, self.units)

    def __repr__(self) -> str:
        return f"InFlight({self.destination!r}, units={self.units})"


class KeyGroups:
    """Key -> sibling group id, kept across plan versions by one gateway (`table_from_plan`).

    A key's group (its text before the last separator) never changes, and successive plans
    share nearly all their keys, so a gateway that remembers each key's group only splits the
    keys new to it: a version then costs one C-level dict probe per key instead of cutting a new
    string per key (~16 vs ~25 ms for a 61k-key plan here: the probe of a freshly decoded key
    still hashes and compares it). Group ids are stable for the cache's life; a fresh cache
    numbers groups in order of first appearance (`_groups` uses one when it is given none).
    Both maps are dropped (and refill from that plan) when the keys remembered exceed
    twice the plan's keys plus `slack`: keys that left the plan do not pile up, and the memory
    stays within about two plans' worth of keys.
    """

    def __init__(self, separator: str, slack: int = 1 << 14) -> None:
        if not separator:
            raise DispatchError("a group separator must be a non-empty string")
        self.separator = separator
        self.slack = slack
        self._key_ids: dict[str, int] = {}
        """Key -> its group id; -1: the key has no separator."""
        self._group_ids: dict[str, int] = {}
        """Group text -> id; ids are positions in `names`."""
        self.names: list[str] = []
        self.split = 0
        """Keys split so far (only keys not seen before are: the point of the cache)."""

    def __len__(self) -> int:
        return len(self._key_ids)

    def codes(
        self, keys: Sequence[str], *, step: int = 0, pause: Callable[[], None] = _no_pause
    ) -> np.ndarray[Any, np.dtype[np.int64]]:
        """Each key's group id (-1: none), learning the keys not seen before (new groups get
        ids in order of first appearance)."""
        if len(self._key_ids) > 2 * len(keys) + self.slack:
            self._key_ids.clear()
            self._group_ids.clear()
            self.names.clear()
        n = len(keys)
        step = step or n or 1
        out = np.empty(n, dtype=np.int64)
        known = self._key_ids.get
        for lo in range(0, n, step):
            part = keys[lo : lo + step]
            got = np.fromiter(map(known, part, repeat(-2)), dtype=np.int64, count=len(part))
            new = np.flatnonzero(got == -2)
            if len(new) == len(part):
                got = self._learn(part)
            elif len(new):  # keys new to this gateway only
                got[new] = self._learn([part[j] for j in new.tolist()])
            out[lo : lo + len(part)] = got
            pause()
        return out

    def _learn(self, keys: Sequence[str]) -> np.ndarray[Any, np.dtype[np.int64]]:
        """Group ids of `keys`, remembered: the splitting in C-level passes (`map`), a Python
        step only per distinct new group."""
        m = len(keys)
        self.split += m
        cuts = list(map(str.rfind, keys, [self.separator] * m))
        heads = list(map(str.__getitem__, keys, map(slice, cuts)))
        # a key without the separator has no group (its "head" is junk): only the others' heads
        # become groups, in order of first appearance (dict.fromkeys dedupes in C)
        ids = self._group_ids
        fresh = [h for h in dict.fromkeys(compress(heads, map((0).__le__, cuts))) if h not in ids]
        ids.update(zip(fresh, range(len(self.names), len(self.names) + len(fresh)), strict=True))
        self.names.extend(fresh)
        got = np.fromiter(map(ids.get, heads, repeat(-1, m)), dtype=np.int64, count=m)
        got[np.asarray(cuts, dtype=np.int64) < 0] = -1
        self._key_ids.update(zip(keys, got.tolist(), strict=True))
        return got


@functools.cache
def compiled_groups() -> ModuleType | None:
    """`group_codes` when numba is installed (imported on first use), else None: then keys are
    split in Python (`KeyGroups`), with the same groups at about three times the CPU."""
    try:  # by name: the module compiled with mypyc is type-checked without its optional parts
        return importlib.import_module("cacheroute.dispatcher.group_codes")
    except ImportError:
        return None


def _groups(
    keys: Sequence[str],
    offsets: Sequence[int] | np.ndarray[Any, np.dtype[np.int64]],
    targets: np.ndarray[Any, np.dtype[np.int64]],
    sep: str,
    *,
    step: int = 0,
    pause: Callable[[], None] = _no_pause,
    cache: KeyGroups | None = None,
) -> dict[str, tuple[int, ...]]:
    """Group -> the (gateway-local, sorted) destinations of its admitted keys; groups with no
    destination known here are left out. Groups come in order of first appearance, or with
    `cache` (whose separator must be `sep`) in the order the cache first saw them.

    Key i's destinations are `targets[offsets[i]:offsets[i + 1]]` (-1 = unknown here); its group
    is its text before the last `sep` (a key without `sep` has none). `pause` runs between
    slices of `step` keys.

    Why it is built this way: a gateway rebuilds this for every plan version, and a Python loop
    that splits each key and fills a set per group took ~100 ms for a 61k-key plan on a 2-core
    machine, four times the rest of the table. Here the key -> group step is C-level passes per
    slice of keys (each slice short, so a routing thread waiting for the GIL gets it soon), or
    one dict probe per key with `cache`, and the destination sets are the distinct
    (group, destination) codes (`group_codes.group_pairs` with numba: a presence table, no
    sort; else one `np.unique`).
    """
    step = step or len(keys) or 1
    compiled = compiled_groups()
    found = None if compiled is None else compiled.group_codes(keys, sep, step=step, pause=pause)
    if found is not None:
        codes, names = found
    else:
        if cache is None:  # (not `cache or`: an empty cache is falsy)
            cache = KeyGroups(sep)
        codes = cache.codes(keys, step=step, pause=pause)
        names = cache.names
    offs = np.asarray(offsets, dtype=np.int64)
    width = int(targets.max()) + 1 if len(targets) else 1
    if found is not None and compiled is not None:  # the same pairs, without the GIL
        pairs = compiled.group_pairs(codes, offs, np.asarray(targets, np.int64), width)
    else:
        per_target = np.repeat(codes, np.diff(offs))
        ok = (per_target >= 0) & (targets >= 0)
        pairs = np.unique(per_target[ok] * width + targets[ok])
    if not len(pairs):  # sorted: by group, then destination
        return {}
    group_of = pairs // width
    starts = np.flatnonzero(np.diff(group_of, prepend=-1))
    ends = np.append(starts[1:], len(pairs))
    dests = (pairs % width).tolist()
    out: dict[str, tuple[int, ...]] = {}
    for j, (g, a, b) in enumerate(
        zip(group_of[starts].tolist(), starts.tolist(), ends.tolist(), strict=True), start=1
    ):
        out[names[g]] = tuple(dests[a:b])
        if j % step == 0:
            pause()
    return out


if compiled_is_stale():
    log.warning(
        "cacheroute.dispatcher.routing: the compiled module is older than routing.py beside it, "
        "so this process routes with the old code; rebuild it with `make install` (or "
        "`pip install -e .`)"
    )
