"""Benchmarks, together and outside the libraries: each prints one JSON object with its figure
and a baseline measured in the same run (`cacheroute bench ...` runs them).

`planner` (fast build vs the reference, scale, peak memory), `dispatcher` (routing decisions/s),
`emitter` (emit() cost), `streams` (agent ingest vs a plain consumer), `propagation` (planner
commit to applied in every gateway), `gateway` (the HTTP gateway in front of zero-delay engines).
"""
