"""Property tests: the fast planner equals the reference and every invariant holds."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from cacheroute.planner import (
    Destination,
    Plan,
    PlannerParams,
    build_plan,
    reference_build_plan,
)
from cacheroute.planner.admission import admit, order_desc, replica_counts
from cacheroute.planner.kernels import compiled, python_kernels
from cacheroute.planner.workload import default_q_cap, paper_workload

# Rates drawn from a few fixed values too, so that ties (by rate, then by load) are common.
RATE = st.one_of(
    st.floats(0.0, 50.0, allow_nan=False, allow_infinity=False),
    st.sampled_from([0.0, 0.5, 1.0, 2.0, 3.0, 7.5]),
)


@st.composite
def problems(
    draw: st.DrawFn,
) -> tuple[list[str], list[float], list[str | Destination], PlannerParams, list[float]]:
    keys = draw(
        st.lists(st.text("abcdefgh", min_size=1, max_size=4), min_size=1, max_size=40, unique=True)
    )
    rates = draw(st.lists(RATE, min_size=len(keys), max_size=len(keys)))
    tokens = draw(
        st.lists(
            st.sampled_from([0.0, 64.0, 512.0, 2048.0]), min_size=len(keys), max_size=len(keys)
        )
    )
    r = draw(st.integers(1, 7))
    names = [f"d{i}" for i in range(r)]
    dests: list[str | Destination] = list(names)
    if draw(st.booleans()):
        caps = draw(st.lists(st.sampled_from([0.5, 1.0, 2.0, 3.0]), min_size=r, max_size=r))
        dests = [Destination(n, c) for n, c in zip(names, caps, strict=True)]
    params = PlannerParams(
        q_cap=draw(st.sampled_from([0.7, 1.0, 2.5, 10.0, 100.0])),
        warm_slots=draw(st.integers(0, 8)),
        admission=draw(st.sampled_from(["rate", "bytes"])),
    )
    return keys, rates, dests, params, tokens


def greedy_admitted(
    keys: list[str], rates: list[float], r: int, params: PlannerParams, tokens: list[float]
) -> set[str]:
    """The admission rule restated independently: walk by priority, admit what fits."""

    def k(rate: float) -> int:
        return min(max(1, math.ceil(rate / params.q_cap)), r)

    def priority(i: int) -> float:
        if params.admission == "rate":
            return rates[i]
        return rates[i] * tokens[i] / k(rates[i])

    used, out = 0, set()
    for i in sorted(range(len(keys)), key=lambda i: (-priority(i), keys[i])):
        if used + k(rates[i]) <= r * params.warm_slots:
            used += k(rates[i])
            out.add(keys[i])
    return out


@settings(max_examples=300, deadline=None)
@given(problems())
def test_fast_equals_reference_and_invariants_hold(
    problem: tuple[list[str], list[float], list[str | Destination], PlannerParams, list[float]],
) -> None:
    keys, rates, dests, params, tokens = problem
    fast = build_plan(keys, rates, dests, params, prefix_tokens=tokens)
    ref = reference_build_plan(keys, rates, dests, params, prefix_tokens=tokens)
    assert fast == ref
    fast.validate()
    r = len(dests)
    # Sum of k_b within the budget; distinct destinations; k sizing: all in validate(), and:
    assert fast.slots_used <= r * params.warm_slots
    assert set(fast.keys) == greedy_admitted(keys, rates, r, params, tokens)
    # Nothing dropped: admitted + cold = everything, loads add up to the total.
    assert fast.stats.keys == len(keys)
    assert math.isclose(fast.admitted_rate + fast.cold_rate, math.fsum(rates), abs_tol=1e-9)
    assert math.isclose(float(fast.loads.sum()), math.fsum(rates), rel_tol=1e-9, abs_tol=1e-9)
    for i, key in enumerate(fast.keys):
        targets = fast.targets_of(i)
        assert len(set(targets)) == len(targets)
        expected_k = min(max(1, math.ceil(rates[keys.index(key)] / params.q_cap)), r)
        assert len(targets) == expected_k


@settings(max_examples=60, deadline=None)
@given(problems())
def test_plain_python_kernels_give_the_same_plan(
    problem: tuple[list[str], list[float], list[str | Destination], PlannerParams, list[float]],
) -> None:
    keys, rates, dests, params, tokens = problem
    jit = build_plan(keys, rates, dests, params, prefix_tokens=tokens)
    plain = build_plan(keys, rates, dests, params, prefix_tokens=tokens, kernels=python_kernels())
    assert jit == plain


@settings(max_examples=100, deadline=None)
@given(
    st.lists(RATE, min_size=1, max_size=60),
    st.integers(0, 30),
    st.integers(1, 5),
)
def test_partitioned_admission_equals_the_full_walk(
    rates_list: list[float], capacity: int, r: int
) -> None:
    rates = np.array(rates_list)
    keys = [f"k{i % 7}{i}" for i in range(rates.size)]
    kern = compiled()
    full, used_full = admit(
        rates, rates, keys, q_cap=1.5, r=r, capacity=capacity, kernels=kern, candidate_margin=10**9
    )
    part, used_part = admit(
        rates, rates, keys, q_cap=1.5, r=r, capacity=capacity, kernels=kern, candidate_margin=0
    )
    assert full.tolist() == part.tolist()
    assert used_full == used_part
    k = replica_counts(rates[full], 1.5, r)
    assert int(k.sum()) == used_full <= capacity


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.floats(0, 1e12, allow_nan=False) | st.sampled_from([1e-300, 1e300, 0.1]),
        min_size=1,
        max_size=50,
    ),
    st.data(),
)
def test_exact_sum_kernel_matches_math_fsum(values: list[float], data: st.DataObject) -> None:
    admitted = np.array(
        data.draw(st.lists(st.booleans(), min_size=len(values), max_size=len(values)))
    )
    arr = np.array(values)
    for kern in (compiled(), python_kernels()):
        total, cold, overflow = kern.fsum_split(arr, admitted)
        assert not overflow
        assert total == math.fsum(values)
        assert cold == math.fsum(v for v, a in zip(values, admitted, strict=True) if not a)


def test_order_desc_breaks_ties_by_key() -> None:
    keys = ["d", "b", "c", "a", "e"]
    priority = np.array([1.0, 2.0, 1.0, 2.0, 0.0])
    order = order_desc(np.arange(5), priority, keys)
    assert [keys[i] for i in order] == ["a", "b", "c", "d", "e"]


def test_benchmark_workload_gives_identical_plans() -> None:
    work = paper_workload(20_000, np.random.default_rng(7))
    dests = [f"d{i}" for i in range(30)]
    params = PlannerParams(q_cap=default_q_cap(float(work.rates.sum())), warm_slots=300)
    fast = build_plan(work.keys, work.rates, dests, params)
    ref = reference_build_plan(work.keys, work.rates.tolist(), dests, params)
    assert fast.routing_equal(ref)
    assert isinstance(fast, Plan)
    assert int(np.count_nonzero(fast.replicas() > 1)) >= 1  # the whales are split
    fast.validate()
    byte_params = PlannerParams(params.q_cap, 300, admission="bytes")
    fast_b = build_plan(work.keys, work.rates, dests, byte_params, prefix_tokens=work.prefix_tokens)
    ref_b = reference_build_plan(
        work.keys,
        work.rates.tolist(),
        dests,
        byte_params,
        prefix_tokens=work.prefix_tokens.tolist(),
    )
    assert fast_b.routing_equal(ref_b)
