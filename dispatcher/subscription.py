"""The dispatcher's Kafka side: follow the plans topic and hand each verified version to it.

A thin adapter over `cacheroute.dispatcher.follower.PlanFollower` (which reads the compacted topic
from the beginning with read_committed, applies only complete, checksummed versions, and keeps the
last good plan through broker outages). Each new version is passed to `Dispatcher.apply_plan` on the
follower's thread, so decoding and table building never run on a request path.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from cacheroute.dispatcher.follower import FollowerConfig, LivePlan, PlanFollower
from cacheroute.settings import Settings

if TYPE_CHECKING:
    from cacheroute.dispatcher.dispatcher import Dispatcher

__all__ = ["follow_plans"]

log = logging.getLogger(__name__)


def follow_plans(
    dispatcher: Dispatcher, settings: Settings, *, client_id: str = "cacheroute-gateway"
) -> PlanFollower:
    """Start a follower thread that keeps `dispatcher` on the newest plan; returns the follower."""

    def on_plan(live: LivePlan) -> None:
        try:
            dispatcher.apply_plan(live.plan, live.header.params.control_interval_s)
        except Exception:  # never let a bad plan kill the follower; the old table stays live
            log.exception("applying plan v%d failed; keeping v%s", live.version, dispatcher.version)

    follower = PlanFollower(
        settings,
        FollowerConfig(build_index=False, client_id=client_id),
        on_plan=on_plan,
    )
    dispatcher.subscription = follower
    return follower.start()
