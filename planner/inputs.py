"""Checking and normalising what the planner is given, before any planning happens.

Bad input is rejected with a PlannerError that names the offending key; nothing is dropped silently.
The checks are vectorised so that they cost a few milliseconds at 1M keys. The reference planner
has its own plain loop but builds its messages with the same functions, so both say the same thing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np

from cacheroute.planner.errors import PlannerError
from cacheroute.planner.params import PlannerParams
from cacheroute.planner.plan import Destination, FloatArray

__all__ = [
    "PlanInputs",
    "bad_key_error",
    "bad_rate_error",
    "bad_tokens_error",
    "duplicate_key_error",
    "normalize_destinations",
    "prepare_inputs",
]


@dataclass(frozen=True, slots=True)
class PlanInputs:
    """Validated planner input: keys with their rates (and prefix tokens), and the destinations."""

    keys: Sequence[str]
    rates: FloatArray  # (n_keys,) finite, >= 0
    tokens: FloatArray | None  # (n_keys,) reusable prefix tokens per key, finite, >= 0
    destinations: tuple[Destination, ...]
    capacities: FloatArray | None
    """Capacity weights (R,), or None when all are equal: then the plan is Algorithm 1 bit for bit
    (loads are compared directly, the cold tail is total / R) rather than merely close to it."""
    capacity_total: float


def bad_key_error(index: int, key: object) -> PlannerError:
    """A key that is not a non-empty string."""
    return PlannerError(f"key at position {index} is {key!r}; keys must be non-empty strings")


def bad_rate_error(key: str, rate: float) -> PlannerError:
    """A rate that is NaN, infinite or negative."""
    return PlannerError(f"key {key!r} has rate {rate!r}; rates must be finite and >= 0", key=key)


def bad_tokens_error(key: str, tokens: float) -> PlannerError:
    """A prefix-token count that is NaN, infinite or negative."""
    return PlannerError(
        f"key {key!r} has prefix_tokens {tokens!r}; they must be finite and >= 0", key=key
    )


def duplicate_key_error(key: str, first: int, second: int) -> PlannerError:
    """The same key given twice (two rates for one key cannot both be right)."""
    return PlannerError(f"duplicate key {key!r} at positions {first} and {second}", key=key)


def normalize_destinations(destinations: Sequence[str | Destination]) -> tuple[Destination, ...]:
    """Accept names or Destination records; reject empty, duplicate or zero-capacity entries."""
    out: list[Destination] = []
    seen: set[str] = set()
    for i, d in enumerate(destinations):
        dest = cast(object, Destination(d) if isinstance(d, str) else d)  # may be anything
        name = cast(object, dest.name) if isinstance(dest, Destination) else None
        if not isinstance(dest, Destination) or not isinstance(name, str) or not name:
            raise PlannerError(f"destination at position {i} is {d!r}; give a non-empty name")
        if dest.name in seen:
            raise PlannerError(f"duplicate destination {dest.name!r}")
        cap = cast(object, dest.capacity)
        if isinstance(cap, bool) or not isinstance(cap, int | float):
            raise PlannerError(f"destination {dest.name!r} has capacity {cap!r}; give a number")
        if not (math.isfinite(cap) and cap > 0):
            raise PlannerError(f"destination {dest.name!r} has capacity {cap!r}; it must be > 0")
        seen.add(dest.name)
        out.append(Destination(dest.name, float(cap)))
    if not out:
        raise PlannerError("no destinations: a plan needs at least one")
    return tuple(out)


def prepare_inputs(
    keys: Sequence[str],
    rates: Sequence[float] | FloatArray,
    destinations: Sequence[str | Destination],
    params: PlannerParams,
    prefix_tokens: Sequence[float] | FloatArray | None = None,
) -> PlanInputs:
    """Validate everything and return arrays the fast planner can use as they are."""
    dests = normalize_destinations(destinations)
    if not isinstance(keys, list | tuple):
        keys = list(keys)
    n = len(keys)
    if n == 0:
        raise PlannerError("no keys to plan: give at least one key with its rate")
    arr = _as_float_array(rates, "rates", n)
    if set(map(type, keys)) != {str}:
        i = next(i for i, k in enumerate(keys) if type(k) is not str)
        raise bad_key_error(i, keys[i])
    bad = ~np.isfinite(arr) | (arr < 0)
    if bad.any():
        i = int(np.argmax(bad))
        raise bad_rate_error(keys[i], float(arr[i]))
    unique = set(keys)
    if "" in unique:
        raise bad_key_error(keys.index(""), "")
    if len(unique) != n:
        _raise_first_duplicate(keys)
    tokens = None
    if prefix_tokens is not None:
        tokens = _as_float_array(prefix_tokens, "prefix_tokens", n)
        bad = ~np.isfinite(tokens) | (tokens < 0)
        if bad.any():
            i = int(np.argmax(bad))
            raise bad_tokens_error(keys[i], float(tokens[i]))
    elif params.admission == "bytes":
        raise PlannerError("admission 'bytes' needs prefix_tokens for every key")
    caps = [d.capacity for d in dests]
    homogeneous = all(c == caps[0] for c in caps)
    return PlanInputs(
        keys=keys,
        rates=arr,
        tokens=tokens,
        destinations=dests,
        capacities=None if homogeneous else np.array(caps, dtype=np.float64),
        capacity_total=math.fsum(caps),
    )


def _as_float_array(values: Sequence[float] | FloatArray, what: str, n: int) -> FloatArray:
    try:
        arr = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise PlannerError(f"{what} must be numbers: {exc}") from None
    if arr.shape != (n,):
        raise PlannerError(f"{what} has shape {arr.shape}, expected one value per key ({n})")
    return arr


def _raise_first_duplicate(keys: Sequence[str]) -> None:
    first: dict[str, int] = {}
    for i, k in enumerate(keys):
        if k in first:
            raise duplicate_key_error(k, first[k], i)
        first[k] = i
