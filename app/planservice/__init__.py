"""The planner service and the plan-topic protocol's Kafka side (`cacheroute.planservice`).

The pure parts live in `cacheroute.planner` (protocol encoding, assembly, smoothing); this package
wires them to Kafka:

  publisher  PlanPublisher: one transaction per version, fencing, version recovery, repair
  leader     Leadership: which instance is active (group ownership of the plans partition)
  rates      RatesSource: every partition of `rates` from a look-back point
  service    PlannerService: the run loop of `cacheroute planner run`
  report     what `plan show` / `plan diff` print
  config     PlannerServiceConfig and its TOML loader
  metrics    Prometheus metrics (private registries)

The reading side that gateways embed (`PlanFollower`, `LivePlan`, one-shot reads) lives in the
dispatcher library (`cacheroute.dispatcher.follower`, `.reader`); it is re-exported here for the
tools that use both sides. The protocol is described in docs/PLAN_PROTOCOL.md.
"""

from cacheroute.dispatcher.follower import FollowerConfig, FollowerStatus, PlanFollower
from cacheroute.dispatcher.follower_metrics import FollowerMetrics
from cacheroute.dispatcher.reader import LivePlan, PlanHistory, read_plan_history, scan_plans
from cacheroute.planservice.config import PlannerServiceConfig, load_service_config
from cacheroute.planservice.metrics import PlannerMetrics
from cacheroute.planservice.publisher import (
    FencedError,
    ForeignRecord,
    PlanPublisher,
    PublishResult,
    Recovery,
    RepairResult,
)
from cacheroute.planservice.service import PlannerService

__all__ = [
    "FencedError",
    "FollowerConfig",
    "FollowerMetrics",
    "FollowerStatus",
    "ForeignRecord",
    "LivePlan",
    "PlanFollower",
    "PlanHistory",
    "PlanPublisher",
    "PlannerMetrics",
    "PlannerService",
    "PlannerServiceConfig",
    "PublishResult",
    "Recovery",
    "RepairResult",
    "load_service_config",
    "read_plan_history",
    "scan_plans",
]
