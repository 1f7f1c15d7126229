"""`cacheroute gateway`: an OpenAI-compatible reverse proxy that routes by the live plan.

Each request gets a routing key (keys.py), goes through the `Dispatcher` that follows the plans
topic to one backend (proxy.py), is counted in flight until its last streamed byte, and is
reported to the `requests` topic through the `Emitter` with the cached tokens the backend said it
served (usage.py). Failed backends are marked down and health-checked back up (health.py).
"""
