"""Our two planner extensions: fair-share sizing and sibling co-location.

Both are off in `PlannerParams` by default (Algorithm 1 exactly, which the golden and property
tests hold to the reference); these tests pin down what each one adds and that it stays exact,
deterministic, balanced and readable by a gateway.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cacheroute.planner import Destination, PlannerParams, build_plan, reference_build_plan
from cacheroute.planner.errors import PlannerError
from cacheroute.planner.kernels import compiled, python_kernels
from cacheroute.planner.params import DEFAULT_FAIR_SHARE
from cacheroute.planner.protocol import decode_chunks, encode_plan, plan_from_records
from cacheroute.planner.siblings import group_of, sibling_groups
from cacheroute.schemas import PlanHeader, codec_for

DESTS = [f"d{i}" for i in range(6)]


def tenant_keys(
    tenants: int, per_tenant: int, rng: np.random.Generator
) -> tuple[list[str], list[float]]:
    keys = [f"tenant-{t:02d}/conv-{c:03d}" for t in range(tenants) for c in range(per_tenant)]
    rates = rng.lognormal(0.0, 1.0, len(keys)).tolist()
    return keys, rates


def groups_per_destination(plan_assignments: dict[str, tuple[int, ...]]) -> list[int]:
    seen: dict[int, set[str]] = {}
    for key, targets in plan_assignments.items():
        for d in targets:
            seen.setdefault(d, set()).add(group_of(key, "/"))
    return [len(v) for _, v in sorted(seen.items())]


# --- fair-share sizing -----------------------------------------------------------------------


def test_fair_share_splits_a_whale_below_the_knee() -> None:
    # 40 keys of 0.25 req/s and a whale of 8 req/s over 6 destinations: mean load 18 / 6 = 3.
    keys = ["whale", *[f"k{i}" for i in range(40)]]
    rates = [8.0, *[0.25] * 40]
    paper = build_plan(keys, rates, DESTS, PlannerParams(q_cap=10.0, warm_slots=8))
    fair = build_plan(keys, rates, DESTS, PlannerParams(q_cap=10.0, warm_slots=8, fair_share=1.0))
    paper.validate()
    fair.validate()
    assert paper.replicas()[0] == 1  # the paper's rule: 8 < q_cap, one replica
    assert paper.max_over_mean() == pytest.approx(8.0 / 3.0)
    assert fair.replicas()[0] == math.ceil(8.0 / 3.0)  # 3 replicas of 2.67 <= the mean 3
    assert fair.max_over_mean() <= 3.25 / 3  # 2.67 + one 0.25 key: the granularity of LPT
    assert list(fair.replicas()[1:]) == [1] * 40  # keys below the mean are untouched


def test_half_the_mean_lets_lpt_balance_few_keys_that_the_whole_mean_cannot() -> None:
    # Hand-derived, 4 destinations, mean load 1, the knee out of the way. At the whole mean: A and
    # B (1.5 each) get 2 replicas of 0.75, C (1.0) one of 1.0; LPT in rate order puts A on d0 d1,
    # B on d2 d3 and C on d0: loads 1.75 0.75 0.75 0.75. At half the mean (the deployed default):
    # A and B 3 replicas of 0.5, C 2 of 0.5; A on d0 d1 d2, B on d3 d0 d1, C on d2 d3: all 1.0.
    keys, rates = ["A", "B", "C"], [1.5, 1.5, 1.0]
    dests = DESTS[:4]
    whole = build_plan(keys, rates, dests, PlannerParams(q_cap=100.0, warm_slots=8, fair_share=1.0))
    half = build_plan(
        keys, rates, dests, PlannerParams(q_cap=100.0, warm_slots=8, fair_share=DEFAULT_FAIR_SHARE)
    )
    assert DEFAULT_FAIR_SHARE == 0.5
    assert whole.replicas().tolist() == [2, 2, 1]
    assert whole.loads.tolist() == [1.75, 0.75, 0.75, 0.75]
    assert half.replicas().tolist() == [3, 3, 2]
    assert half.loads.tolist() == [1.0, 1.0, 1.0, 1.0]
    assert half.assignments() == {"A": (0, 1, 2), "B": (3, 0, 1), "C": (2, 3)}


def test_fair_share_never_raises_the_cap_above_q_cap() -> None:
    keys, rates = ["a", "b"], [30.0, 30.0]
    p = PlannerParams(q_cap=4.0, warm_slots=16, fair_share=2.0)  # fair cap 2 x 60 / 6 = 20
    assert p.sizing_cap(60.0, 6) == 4.0
    plan = build_plan(keys, rates, DESTS, p)
    plan.validate()
    assert list(plan.replicas()) == [6, 6]  # ceil(30 / 4) = 8, capped at R = 6


@pytest.mark.parametrize("bad", [0.0, -1.0, math.nan, math.inf, True])
def test_fair_share_must_be_a_positive_number(bad: float) -> None:
    with pytest.raises(PlannerError, match="fair_share"):
        PlannerParams(q_cap=1.0, warm_slots=1, fair_share=bad)


def test_group_separator_must_not_be_empty() -> None:
    with pytest.raises(PlannerError, match="group_separator"):
        PlannerParams(q_cap=1.0, warm_slots=1, group_separator="")


def test_a_plan_validates_k_b_against_its_own_sizing_cap() -> None:
    keys = ["whale", *[f"k{i}" for i in range(10)]]
    rates = [8.0, *[1.0] * 10]
    fair = build_plan(keys, rates, DESTS, PlannerParams(q_cap=10.0, warm_slots=8, fair_share=1.0))
    forged = build_plan(keys, rates, DESTS, PlannerParams(q_cap=10.0, warm_slots=8))
    # The paper-sized plan claims fair-share params: its k_b no longer matches them.
    lying = replace(forged, params=fair.params)
    with pytest.raises(PlannerError, match="k_b"):
        lying.validate()


# --- sibling co-location ----------------------------------------------------------------------


def test_sibling_groups_only_count_groups_with_two_members() -> None:
    groups, n = sibling_groups(["a/x", "a/y", "b/z", "plain", "c/d/e", "c/d/f"], "/")
    assert n == 2
    assert groups.tolist() == [0, 0, -1, -1, 1, 1]  # "b" is alone, "plain" has no group


def test_grouping_keeps_tenants_together_within_the_bound() -> None:
    rng = np.random.default_rng(7)
    keys, rates = tenant_keys(tenants=12, per_tenant=40, rng=rng)
    plain = build_plan(keys, rates, DESTS, PlannerParams(q_cap=1e9, warm_slots=200))
    grouped = build_plan(
        keys, rates, DESTS, PlannerParams(q_cap=1e9, warm_slots=200, group_separator="/")
    )
    plain.validate()
    grouped.validate()
    assert grouped.keys == plain.keys  # admission is unchanged: only placement differs
    assert grouped.max_over_mean() <= 1.05 + 1e-9
    assert sum(groups_per_destination(grouped.assignments())) < 0.6 * sum(
        groups_per_destination(plain.assignments())
    )


def test_without_separators_grouping_is_plain_lpt_bit_for_bit() -> None:
    rng = np.random.default_rng(3)
    keys = [f"key-{i}" for i in range(500)]
    rates = rng.lognormal(0.0, 1.5, 500).tolist()
    plain = build_plan(keys, rates, DESTS, PlannerParams(q_cap=2.0, warm_slots=60))
    grouped = build_plan(
        keys, rates, DESTS, PlannerParams(q_cap=2.0, warm_slots=60, group_separator="/")
    )
    assert np.array_equal(plain.targets, grouped.targets)
    assert np.array_equal(plain.loads, grouped.loads)


@settings(max_examples=40, deadline=None)
@given(
    tenants=st.integers(1, 8),
    per_tenant=st.integers(1, 12),
    q_cap=st.floats(0.3, 20.0),
    seed=st.integers(0, 2**31),
)
def test_grouped_kernel_equals_its_python_form(
    tenants: int, per_tenant: int, q_cap: float, seed: int
) -> None:
    """The compiled loop is the plain-Python one, bit for bit (ties included)."""
    rng = np.random.default_rng(seed)
    keys, rates = tenant_keys(tenants, per_tenant, rng)
    params = PlannerParams(q_cap=q_cap, warm_slots=6, group_separator="/", fair_share=1.0)
    fast = build_plan(keys, rates, DESTS, params, kernels=compiled())
    slow = build_plan(keys, rates, DESTS, params, kernels=python_kernels())
    fast.validate()
    assert fast == slow
    again = build_plan(keys, [r * 1.1 for r in rates], DESTS, params, prev=fast)
    again.validate()
    again_slow = build_plan(
        keys, [r * 1.1 for r in rates], DESTS, params, prev=slow, kernels=python_kernels()
    )
    assert again == again_slow


def test_replanning_keeps_siblings_and_moves_little() -> None:
    rng = np.random.default_rng(11)
    keys, rates = tenant_keys(tenants=10, per_tenant=30, rng=rng)
    params = PlannerParams(q_cap=1e9, warm_slots=200, group_separator="/", fair_share=1.0)
    first = build_plan(keys, rates, DESTS, params)
    # Drift the rates a little and add a new conversation to tenant 3.
    drifted = (np.asarray(rates) * rng.lognormal(0.0, 0.1, len(rates))).tolist()
    second = build_plan([*keys, "tenant-03/conv-999"], [*drifted, 0.5], DESTS, params, prev=first)
    second.validate()
    assert second.max_over_mean() <= 1.05 + 1e-9
    before = first.assignments()
    after = second.assignments()
    kept = sum(1 for k, t in before.items() if after.get(k) == t)
    assert kept >= 0.9 * len(before)
    siblings = {d for k, t in before.items() if k.startswith("tenant-03/") for d in t}
    assert after["tenant-03/conv-999"][0] in siblings  # the newcomer joins its tenant


def test_extensions_survive_the_plan_topic_round_trip() -> None:
    """A gateway rebuilds the params from the header and validates k_b with the same cap."""
    keys = ["whale", *[f"t{i % 3}/k{i}" for i in range(30)]]
    rates = [12.0, *[0.5] * 30]
    params = PlannerParams(q_cap=10.0, warm_slots=8, fair_share=1.0, group_separator="/")
    plan = build_plan(keys, rates, DESTS, params, version=4)
    assert plan.replicas()[0] > 1  # split by fair share, not by q_cap
    enc = encode_plan(plan, max_chunk_bytes=1024)
    header = codec_for(PlanHeader).decode(enc.header_bytes)
    assert (header.params.fair_share, header.params.group_separator) == (1.0, "/")
    back = plan_from_records(header, decode_chunks(header, enc.chunks))
    assert back == plan


@settings(max_examples=60, deadline=None)
@given(
    tenants=st.integers(1, 9),
    per_tenant=st.integers(1, 15),
    loners=st.integers(0, 20),
    q_cap=st.floats(0.2, 30.0),
    warm_slots=st.integers(0, 12),
    fair_share=st.sampled_from([None, 0.5, 1.0, 2.0]),
    tolerance=st.sampled_from([1.0, 1.05, 1.3]),
    weighted=st.booleans(),
    seed=st.integers(0, 2**31),
)
def test_fast_planner_equals_the_reference_with_extensions(  # noqa: PLR0917 - hypothesis inputs
    tenants: int,
    per_tenant: int,
    loners: int,
    q_cap: float,
    warm_slots: int,
    fair_share: float | None,
    tolerance: float,
    weighted: bool,
    seed: int,
) -> None:
    """The reference (plain Python) and the fast planner agree bit for bit with both extensions."""
    rng = np.random.default_rng(seed)
    keys, rates = tenant_keys(tenants, per_tenant, rng)
    keys += [f"solo-{i}" for i in range(loners)]
    rates += rng.lognormal(0.0, 1.0, loners).tolist()
    dests: list[str | Destination] = (
        [Destination(f"d{i}", float(1 + i % 3)) for i in range(5)] if weighted else list(DESTS)
    )
    params = PlannerParams(
        q_cap=q_cap,
        warm_slots=warm_slots,
        imbalance_tolerance=tolerance,
        fair_share=fair_share,
        group_separator="/",
    )
    fast = build_plan(keys, rates, dests, params)
    ref = reference_build_plan(keys, rates, dests, params)
    fast.validate()
    assert fast == ref
