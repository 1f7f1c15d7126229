"""CacheRoute: planned prefix-affinity routing for multi-replica LLM serving.

This package (folder `app/`) is the shell that wires the areas together: settings, the CLI and the
local Kafka broker manager. The areas themselves are `cacheroute.schemas`, `cacheroute.streams`,
`cacheroute.planner` and `cacheroute.dispatcher` (folders `schemas/`, `streams/`, ... at the top).
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("cacheroute")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"

__all__ = ["__version__"]
