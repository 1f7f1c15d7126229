"""`cacheroute engine`: a stand-in for one GPU serving replica (OpenAI-compatible, simulated).

It serves /v1/chat/completions, /v1/completions (streamed and not), /v1/models, /health and
/metrics like vLLM does, with a simulated prefix cache (cache.py) and prefill/decode timing
(config.py), so the gateway, the dispatcher and the whole pipeline can be run and tested on
machines without accelerators. It stands in for the GPU only: the HTTP side is real.
"""
