"""Streams: the faust-streaming agent that turns request events into per-key window rates.

Empty until the streams issue lands (batching gateway emitter + windowed rate agent); the folder
exists now so the package layout and namespace mapping are fixed from the first commit.
"""
