"""Replay and shadow evaluation: workloads, trace readers, a serving-cluster simulator, policies.

Pure core (no Kafka, no clock; randomness from seeded generators passed in): `requestset` (the
replayable request stream), `workloads` and `traces`/`sources` (where streams come from), `cache`,
`service` and `engine` (the simulated replicas), `policy`/`policies` with `baselines`,
`cacheaware` and `planned` (the eight routing policies; the plan-based ones run the real planner
and dispatcher), `simulator` and `metrics` (one run), `diagnostic` (win/tie/lose from the workload
alone), `evaluate` (sweeps, capacity, verdicts), `report` and `plots`. The shell side is `live`
(push into Kafka, copy a topic) and the CLI commands `evaluate`, `workload` and `replay`.
"""
