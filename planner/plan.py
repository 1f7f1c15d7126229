"""The routing plan: what Algorithm 1 outputs, its invariants, and how two plans differ.

A plan of 100k+ admitted keys is held as flat numpy arrays in CSR form (`offsets`, `targets`) rather
than a dict of lists: building, comparing and validating it then costs a few vectorised passes
instead of one Python object per key, which is what lets the fast planner stay fast at 1M keys.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from cacheroute.planner.errors import PlannerError
from cacheroute.planner.params import PlannerParams

__all__ = [
    "BoolArray",
    "Destination",
    "FloatArray",
    "IntArray",
    "Plan",
    "PlanStats",
    "max_over_mean",
]

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]
BoolArray = NDArray[np.bool_]

# Relative slack for "loads add up": loads are sums of many float additions in placement order,
# the check recomputes them in another order, so they agree to rounding, not bit for bit.
_REL_TOL = 1e-9


_KEY_SLICE = 2048
"""Keys per slice of the distinct-key check in `validate` (one slice ~0.3 ms)."""


def _no_pause() -> None:
    return None


@dataclass(frozen=True, slots=True)
class Destination:
    """A serving replica (or replica group) by the name gateways use, with a capacity weight.

    `capacity` is relative: a destination with 2.0 is expected to carry twice the load of one with
    1.0. Equal weights (the paper's homogeneous cluster) give exactly Algorithm 1.
    """

    name: str
    capacity: float = 1.0


@dataclass(frozen=True, slots=True)
class PlanStats:
    """Counters about how a plan was made; they travel with the plan so operators can see them."""

    keys: int
    """Keys the planner was given (admitted + cold); nothing is dropped silently."""
    capped_keys: int = 0
    """Keys whose `k_b` exceeded the number of destinations and was capped (a warning is logged)."""
    cutoff: float = 0.0
    """Admission cut-off: the lowest admission priority among admitted keys (0 if none)."""
    kept_keys: int = 0
    """Re-planning: admitted keys whose destination set is the same as in the previous plan."""
    new_keys: int = 0
    """Re-planning: admitted keys the previous plan did not admit."""
    dropped_keys: int = 0
    """Re-planning: keys the previous plan admitted and this one does not."""
    resized_keys: int = 0
    """Re-planning: kept keys whose `k_b` changed."""
    displaced_replicas: int = 0
    """Re-planning: replicas that had to leave their destination (removed, or over the bound)."""
    balanced: bool | None = None
    """Re-planning: whether max/mean load ended within the tolerance (None: fresh plan)."""


def max_over_mean(loads: FloatArray, capacities: FloatArray | None = None) -> float:
    """Worst destination's load relative to the cluster mean (capacity-weighted); 1.0 is perfect."""
    if loads.size == 0:
        return 1.0
    caps = np.ones_like(loads) if capacities is None else capacities
    total = float(loads.sum())
    if total <= 0.0:
        return 1.0
    mean = total / float(caps.sum())
    return float(np.max(loads / caps)) / mean


@dataclass(frozen=True, slots=True, eq=False)
class Plan:
    """One plan version: admitted keys, their destinations in selection order, expected loads.

    Admitted keys are listed in placement order: rate descending, equal rates by key ascending.
    Key `keys[i]` is routed to `targets[offsets[i]:offsets[i + 1]]` (indices into `destinations`,
    distinct, in the order they were chosen); its `k_b` is the length of that slice. Every key not
    listed is cold and goes to cluster-wide power-of-two-choices; its rate is part of `cold_rate`,
    spread over the destinations by capacity in `loads`.
    """

    version: int
    created_ms: int
    params: PlannerParams
    destinations: tuple[Destination, ...]
    keys: tuple[str, ...]
    rates: FloatArray  # (n_admitted,) rate the planner used per admitted key
    offsets: IntArray  # (n_admitted + 1,) CSR offsets into targets
    targets: IntArray  # (sum k_b,) destination indices
    loads: FloatArray  # (R,) expected requests/s per destination, cold tail included
    total_rate: float
    cold_rate: float
    stats: PlanStats

    def __post_init__(self) -> None:
        # A published plan must not change under a reader's feet: freeze the arrays too.
        for arr in (self.rates, self.offsets, self.targets, self.loads):
            arr.setflags(write=False)

    # --- views -------------------------------------------------------------------------------
    @property
    def n_admitted(self) -> int:
        """How many keys the plan admits."""
        return len(self.keys)

    @property
    def slots_used(self) -> int:
        """Sum of k_b over admitted keys (<= C)."""
        return int(self.offsets[-1])

    @property
    def admitted_rate(self) -> float:
        """Total rate of the admitted keys (exactly rounded sum)."""
        return math.fsum(self.rates.tolist())

    @property
    def capacities(self) -> FloatArray:
        """Destination capacity weights as an array, in destination order."""
        return np.array([d.capacity for d in self.destinations], dtype=np.float64)

    @property
    def destination_names(self) -> tuple[str, ...]:
        """Destination names in index order."""
        return tuple(d.name for d in self.destinations)

    def replicas(self) -> IntArray:
        """k_b per admitted key, in plan order."""
        return np.diff(self.offsets)

    def targets_of(self, i: int) -> tuple[int, ...]:
        """Destination indices of the i-th admitted key, in selection order."""
        return tuple(int(d) for d in self.targets[self.offsets[i] : self.offsets[i + 1]])

    def assignments(self) -> dict[str, tuple[int, ...]]:
        """key -> destination indices in selection order (builds a dict: for tests and output)."""
        flat = self.targets.tolist()
        bounds = self.offsets.tolist()
        return {k: tuple(flat[bounds[i] : bounds[i + 1]]) for i, k in enumerate(self.keys)}

    def max_over_mean(self) -> float:
        """Expected-load imbalance of this plan (capacity-weighted max/mean)."""
        return max_over_mean(self.loads, self.capacities)

    # --- equality ----------------------------------------------------------------------------
    def routing_equal(self, other: Plan) -> bool:
        """Same keys, destinations, rates, targets and loads, bit for bit (version/time ignored)."""
        return (
            self.params == other.params
            and self.destinations == other.destinations
            and self.keys == other.keys
            and np.array_equal(self.rates, other.rates)
            and np.array_equal(self.offsets, other.offsets)
            and np.array_equal(self.targets, other.targets)
            and np.array_equal(self.loads, other.loads)
            and self.total_rate == other.total_rate
            and self.cold_rate == other.cold_rate
            and self.stats == other.stats
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Plan):
            return NotImplemented
        return (
            self.version == other.version
            and self.created_ms == other.created_ms
            and self.routing_equal(other)
        )

    __hash__ = None  # type: ignore[assignment]  # holds arrays: equal plans need not hash alike

    # --- invariants --------------------------------------------------------------------------
    def validate(
        self, *, pause: Callable[[], None] | None = None, distinct_keys: bool = True
    ) -> None:
        """Check every invariant a consumer relies on; raise PlannerError naming the first broken.

        Used by the tests on every plan they build, by the planner service before it publishes and
        by followers before they apply a version. `pause` is called between steps (and between
        slices of the key set): gateways pass a GIL yield so validating a large plan in a
        background thread never stalls their routing threads for long.

        `distinct_keys=False` skips checking that admitted keys are distinct; followers pass it
        (`PlanAssembler`). That check is a set of every key, about a third of a follower's
        validation CPU at 60k keys, and what it protects is already guaranteed where it matters:
        the planner checks it before publishing (with `distinct_keys=True`), the chunks are
        checksummed, and a forged plan that lists a key twice is harmless to a gateway - the
        routing table keeps the key's later entry (one dict entry per key, no crash: see
        tests/unit/planner/test_follower_fast_path.py), every other invariant (counts, bounds,
        destination indices, per-key distinct destinations, loads) is still checked, and such a
        forger could as well have published the same keys once, each with the later entry.
        """
        yield_ = pause or _no_pause
        _check(self.version >= 0, f"version must be >= 0, got {self.version}")
        r = len(self.destinations)
        _check(r >= 1, "a plan needs at least one destination")
        names = [d.name for d in self.destinations]
        _check(len(set(names)) == r, "destination names must be distinct")
        for d in self.destinations:
            _check(bool(d.name), "destination names must be non-empty")
            _check(
                math.isfinite(d.capacity) and d.capacity > 0,
                f"destination {d.name!r} has capacity {d.capacity!r}; it must be finite and > 0",
            )
        n = len(self.keys)
        if not distinct_keys:
            pass
        elif pause is None:
            _check(len(set(self.keys)) == n, "admitted keys must be distinct")
        else:
            # 64 small sets: one big set rehashes everything at once when it grows
            shards: list[set[str]] = [set() for _ in range(64)]
            for lo in range(0, n, _KEY_SLICE):
                for key in self.keys[lo : lo + _KEY_SLICE]:
                    shards[hash(key) & 63].add(key)
                yield_()
            _check(sum(map(len, shards)) == n, "admitted keys must be distinct")
            del shards
        _check(self.stats.keys >= n, "stats.keys counts fewer keys than are admitted")
        _check(self.rates.shape == (n,), "rates must have one entry per admitted key")
        _check(self.offsets.shape == (n + 1,), "offsets must have n_admitted + 1 entries")
        _check(self.loads.shape == (r,), "loads must have one entry per destination")
        _check(int(self.offsets[0]) == 0, "offsets must start at 0")
        k = np.diff(self.offsets)
        _check(bool(np.all(k >= 1)), "every admitted key needs at least one destination")
        _check(self.targets.shape == (int(self.offsets[-1]),), "targets must match offsets")
        _check(bool(np.all(k <= r)), "k_b must not exceed the number of destinations")
        capacity = self.params.capacity_slots(r)
        _check(self.slots_used <= capacity, f"sum k_b = {self.slots_used} exceeds C = {capacity}")
        if self.targets.size:
            _check(
                bool(self.targets.min() >= 0 and self.targets.max() < r),
                "targets must index destinations",
            )
        seg = np.repeat(np.arange(n, dtype=np.int64), k)
        yield_()
        multi = np.repeat(k > 1, k)  # only keys with several destinations can repeat one
        codes = (seg * r + self.targets)[multi]
        _check(np.unique(codes).size == codes.size, "a key's destinations must be distinct")
        yield_()
        _check(bool(np.all(np.isfinite(self.rates)) and np.all(self.rates >= 0)), "bad rates")
        cap = self.params.sizing_cap(self.total_rate, r)
        expected_k = np.clip(np.ceil(self.rates / cap), 1, r).astype(np.int64)
        bad_k = np.flatnonzero(expected_k != k)
        if bad_k.size:
            i = int(bad_k[0])
            raise PlannerError(
                f"key {self.keys[i]!r} has k_b = {k[i]} but its rate {self.rates[i]!r} "
                f"needs {expected_k[i]}",
                key=self.keys[i],
            )
        yield_()
        self._validate_order(yield_)
        yield_()
        self._validate_loads(seg, k, yield_)

    def _validate_order(self, yield_: Callable[[], None] = _no_pause) -> None:
        """Admitted keys are listed by rate descending, equal rates by key ascending."""
        rates = self.rates
        _check(bool(np.all(rates[1:] <= rates[:-1])), "admitted keys must be in rate order")
        keys = self.keys
        for n, i in enumerate(np.flatnonzero(rates[1:] == rates[:-1]).tolist(), start=1):
            _check(keys[i] < keys[i + 1], "equal-rate keys must be in key order")
            if n % _KEY_SLICE == 0:
                yield_()

    def _validate_loads(
        self, seg: IntArray, k: IntArray, yield_: Callable[[], None] = _no_pause
    ) -> None:
        """Loads are finite, non-negative and add up to the admitted shares plus the cold tail."""
        loads = self.loads
        _check(bool(np.all(np.isfinite(loads)) and np.all(loads >= 0)), "loads must be >= 0")
        _check(math.isfinite(self.total_rate) and self.cold_rate >= 0, "bad total or cold rate")
        tol = _REL_TOL * max(self.total_rate, 1e-300)
        # Followers (who pass a pause) take numpy's sum, ~100x cheaper than the exact fsum (~3 ms
        # at 60k keys, a tenth of a version's CPU in a gateway). The rates are finite and >= 0
        # (checked above), so its error is at most n * eps * admitted (< 1e-11 relative at 100k
        # keys), far inside the 1e-9 tolerance: the check decides as with fsum except within that
        # sliver of the boundary.
        admitted = self.admitted_rate if yield_ is _no_pause else float(np.sum(self.rates))
        _check(
            abs(admitted + self.cold_rate - self.total_rate) <= tol,
            f"admitted {admitted!r} + cold {self.cold_rate!r} != total {self.total_rate!r}",
        )
        caps = self.capacities
        shares = (self.rates / k)[seg] if seg.size else np.zeros(0)
        yield_()
        expected = np.bincount(self.targets, weights=shares, minlength=len(loads))
        expected = expected + self.cold_rate * caps / caps.sum()
        worst = float(np.max(np.abs(expected - loads)))
        _check(worst <= tol, f"loads do not add up (off by {worst!r})")
        _check(abs(float(loads.sum()) - self.total_rate) <= tol, "loads do not sum to total rate")

    def to_summary(self) -> dict[str, Any]:
        """A few numbers that describe the plan (for logs, the CLI and benchmarks)."""
        return {
            "version": self.version,
            "keys": self.stats.keys,
            "admitted_keys": self.n_admitted,
            "slots_used": self.slots_used,
            "slots": self.params.capacity_slots(len(self.destinations)),
            "total_rate": self.total_rate,
            "admitted_rate": self.admitted_rate,
            "cold_rate": self.cold_rate,
            "capped_keys": self.stats.capped_keys,
            "max_over_mean": self.max_over_mean(),
        }


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise PlannerError(f"invalid plan: {message}")
