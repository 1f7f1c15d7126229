"""Streams: the faust-streaming agent that turns request events into per-key window rates.

`state` holds the pure per-partition windows and inter-arrival estimator (no Kafka), `app` the
Faust agent around it with exact changelog recovery and the dead-letter path.
"""
