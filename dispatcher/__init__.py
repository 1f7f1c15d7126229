"""Dispatcher: the in-gateway library that follows the plan topic and routes each request.

`routing` holds the pure decisions (plan table, cold path, load units), `dispatcher` the
thread-safe `Dispatcher` a gateway embeds, `subscription` the plan follower, and `emitter` the
batching reporter of every request to the `requests` topic.
"""
