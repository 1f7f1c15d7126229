"""Planner configuration: one frozen dataclass, validated once when it is made."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from cacheroute.planner.errors import PlannerError

__all__ = ["ADMISSION_MODES", "DEFAULT_FAIR_SHARE", "Admission", "PlannerParams"]

Admission = Literal["rate", "bytes"]
ADMISSION_MODES: tuple[Admission, ...] = ("rate", "bytes")

DEFAULT_FAIR_SHARE = 0.5
"""The deployed `fair_share`: no replica of a key carries more than half the mean destination load.

Why half and not the whole mean: the replicas are the pieces LPT packs, and a destination can end
up with the mean plus nearly one piece. With pieces up to the mean, a plan of few keys (tenants
behind long system prompts, their conversations kept apart by session hints) came out at an
expected max/mean of 1.24-1.49, and at 16 gateways, whose dispatchers each see 1/16 of the
in-flight load and so cannot spill the excess, CacheRoute then served less than Flat-LB (a
long-context chat trace of 8 tenants behind 4-block system prompts, `--quick --seeds 3`, G = 16:
12.5 req/s against Flat-LB 13.8 and CHWBL 15.7; with half the mean 19.3, with a quarter 24.3;
tests/data/traces/tenant_chat_6000.jsonl, the same shape: 16.1 -> 20.3 against CHWBL 18.8). Finer
pieces cost cached copies of the key's prefix: a quarter lost 6-7% on the conversation workload and
the chat-shaped trace at G = 16, half stayed within 3% of the whole mean there and on every other
source, and raised whale at G = 4 from 424 to 442 req/s. The figures are in the README's evaluation
section.
"""


@dataclass(frozen=True, slots=True)
class PlannerParams:
    """Everything Algorithm 1 and the re-planner need besides the rates and the destinations.

    The fields mirror the `PlanParams` record of the plan header (schemas/plan_header.avsc), so a
    gateway rebuilds them from the header and validates k_b exactly as the planner sized it.
    """

    q_cap: float
    """Capacity knee of one replica of a key (requests/s): `k_b = max(1, ceil(rate_b / q_cap))`."""
    warm_slots: int
    """W, warm slots per destination; the cluster budget is `C = R * W` slots."""
    control_interval_s: float = 60.0
    """Planning interval; the publish advisor weighs staleness over this horizon."""
    imbalance_tolerance: float = 1.05
    """Re-planning moves keys until max/mean expected load is within this factor (>= 1)."""
    hysteresis: float = 0.2
    """h in [0, 1): an admitted key stays admitted until its rate < (1 - h) * admission cut-off.

    Only used when re-planning from a previous plan; a fresh plan is Algorithm 1 exactly.
    """
    admission: Admission = "rate"
    """`rate` (the paper) or `bytes` (order by rate * reusable prefix tokens per slot)."""
    fair_share: float | None = None
    """Also split a key whose load per replica would exceed `fair_share` x the mean destination load.

    Algorithm 1 sizes a key only against the knee (`k_b = ceil(rate_b / q_cap)`); a key below the
    knee but above the mean load of a destination then lands whole on one destination and no
    placement can balance the cluster (our whale runs: max/mean 1.39). With this set, the sizing
    cap is `min(q_cap, fair_share x total_rate / R)` (see `sizing_cap`). None: the paper's rule.
    """
    group_separator: str | None = None
    """Co-locate sibling keys: keys with the same text before the last `group_separator`.

    Routing keys are often hierarchical (`tenant/conversation`) and siblings share a prompt prefix
    (the tenant's system prompt). Placing them on the same destinations, while that keeps every
    destination within `imbalance_tolerance` of the mean, saves one cached copy of the shared
    prefix per destination. None (or keys without the separator): LPT exactly as in Algorithm 1.
    """

    def __post_init__(self) -> None:
        if isinstance(self.q_cap, bool) or not (math.isfinite(self.q_cap) and self.q_cap > 0):
            raise PlannerError(f"q_cap must be a finite number > 0, got {self.q_cap!r}")
        if isinstance(self.warm_slots, bool) or not isinstance(self.warm_slots, int):
            raise PlannerError(f"warm_slots must be an integer, got {self.warm_slots!r}")
        if self.warm_slots < 0:
            raise PlannerError(f"warm_slots must be >= 0, got {self.warm_slots}")
        if not (math.isfinite(self.control_interval_s) and self.control_interval_s > 0):
            raise PlannerError(f"control_interval_s must be > 0, got {self.control_interval_s!r}")
        if not (math.isfinite(self.imbalance_tolerance) and self.imbalance_tolerance >= 1.0):
            raise PlannerError(
                f"imbalance_tolerance must be a finite number >= 1, got {self.imbalance_tolerance!r}"
            )
        if not (0.0 <= self.hysteresis < 1.0):
            raise PlannerError(f"hysteresis must be in [0, 1), got {self.hysteresis!r}")
        if self.fair_share is not None and (
            isinstance(self.fair_share, bool)
            or not (math.isfinite(self.fair_share) and self.fair_share > 0)
        ):
            raise PlannerError(f"fair_share must be a finite number > 0, got {self.fair_share!r}")
        if self.group_separator is not None and not self.group_separator:
            raise PlannerError(
                f"group_separator must be a non-empty string, got {self.group_separator!r}"
            )
        if self.admission not in ADMISSION_MODES:
            raise PlannerError(
                f"admission must be one of {', '.join(ADMISSION_MODES)}, got {self.admission!r}"
            )

    def sizing_cap(self, total_rate: float, n_destinations: int) -> float:
        """The rate one replica of a key may carry: q_cap, or less with `fair_share` set.

        Every component that checks k_b (the planner, Plan.validate on gateways) calls this with
        the plan's exactly rounded total rate, so all of them get the same bits.
        """
        if self.fair_share is None or total_rate <= 0.0 or n_destinations < 1:
            return self.q_cap
        fair = self.fair_share * total_rate / n_destinations
        return min(self.q_cap, fair) if fair > 0.0 else self.q_cap

    def capacity_slots(self, n_destinations: int) -> int:
        """C = R * W: how many (key, destination) warm slots the cluster has."""
        return n_destinations * self.warm_slots
