"""The policy registry: fixed names, one interface (see policy.py), one factory."""

from __future__ import annotations

from cacheroute.replay.baselines import Chwbl, FlatLB, Sticky
from cacheroute.replay.cacheaware import Preble, SGLang
from cacheroute.replay.errors import ReplayError
from cacheroute.replay.planned import Affinity, AffinityReplication, CacheRoute, PaperLPT
from cacheroute.replay.policy import Policy, PolicyContext

__all__ = ["ABLATION", "BASELINES", "POLICY_NAMES", "make_policy"]

_CLASSES: dict[str, type[Policy]] = {
    cls.name: cls
    for cls in (
        FlatLB,
        Sticky,
        Chwbl,
        SGLang,
        Preble,
        Affinity,
        AffinityReplication,
        PaperLPT,
        CacheRoute,
    )
}
POLICY_NAMES: tuple[str, ...] = tuple(_CLASSES)
"""flat-lb, sticky, chwbl, sglang, preble, affinity, affinity+replication(+lpt), cacheroute."""
BASELINES: tuple[str, ...] = ("flat-lb", "sticky", "chwbl", "sglang", "preble")
ABLATION: tuple[str, ...] = (
    "flat-lb",
    "affinity",
    "affinity+replication",
    "affinity+replication+lpt",
    "cacheroute",
)


def make_policy(name: str, ctx: PolicyContext) -> Policy:
    """A fresh policy instance (policies keep state: one per simulated run)."""
    cls = _CLASSES.get(name)
    if cls is None:
        raise ReplayError(f"unknown policy {name!r}; choose from {', '.join(POLICY_NAMES)}")
    return cls(ctx)
