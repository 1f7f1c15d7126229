"""Planner: Algorithm 1 (replica sizing, top-rate admission, LPT placement) as pure numpy code.

Pure core: no Kafka client, no clock, no global random state. Time (`created_ms`), randomness (a
numpy Generator) and the previous plan are passed in; the planner service and the CLI wire it up.

    plan = build_plan(keys, rates, ["d0", "d1"], PlannerParams(q_cap=8.0, warm_slots=256))
    plan.validate()
    nxt = build_plan(keys, new_rates, ["d0", "d1"], plan.params, prev=plan)  # few moves
    if advise(plan, nxt, keys, new_rates).publish: ...

Modules: plan (Plan, invariants), params, inputs (validation), admission (sizing, order, walk),
kernels (the numba-compiled loops), build (fast Algorithm 1), reference (the plain heapq oracle),
churn (re-planning from the live plan), diff, loads, advisor (publish or not), jsonform (dict
form), workload and experiment (paper-like synthetic rates and the drift experiment).
"""

from cacheroute.planner.advisor import Advice, advise
from cacheroute.planner.build import build_plan
from cacheroute.planner.diff import PlanDiff, plan_diff
from cacheroute.planner.errors import PlannerError
from cacheroute.planner.jsonform import PLAN_FORMAT, plan_from_dict, plan_to_dict
from cacheroute.planner.loads import expected_loads
from cacheroute.planner.params import PlannerParams
from cacheroute.planner.plan import Destination, Plan, PlanStats, max_over_mean
from cacheroute.planner.reference import reference_build_plan

__all__ = [
    "PLAN_FORMAT",
    "Advice",
    "Destination",
    "Plan",
    "PlanDiff",
    "PlanStats",
    "PlannerError",
    "PlannerParams",
    "advise",
    "build_plan",
    "expected_loads",
    "max_over_mean",
    "plan_diff",
    "plan_from_dict",
    "plan_to_dict",
    "reference_build_plan",
]
