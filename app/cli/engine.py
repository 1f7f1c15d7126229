"""`cacheroute engine`: run the stand-in for one GPU serving replica."""

from __future__ import annotations

import logging

import click

from cacheroute.engine.config import EngineConfig

__all__ = ["engine"]

log = logging.getLogger(__name__)


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Listen address.")
@click.option("--port", type=click.IntRange(1, 65535), default=8000, show_default=True)
@click.option("--name", default=None, help="Name in logs [engine-PORT].")
@click.option(
    "--model", default="cacheroute-sim", show_default=True, help="The one model id it serves."
)
@click.option(
    "--cache-tokens",
    type=click.IntRange(min=0),
    default=262_144,
    show_default=True,
    help="Prefix-cache capacity in tokens (LRU over 16-token blocks; 0: no cache).",
)
@click.option(
    "--prefill-us-per-token",
    type=click.FloatRange(min=0),
    default=40.0,
    show_default=True,
    help="Prefill time per uncached prompt token, microseconds (time to first token).",
)
@click.option(
    "--decode-ms",
    type=click.FloatRange(min=0),
    default=8.0,
    show_default=True,
    help="Time between two output tokens, milliseconds.",
)
@click.option(
    "--max-running",
    type=click.IntRange(min=1),
    default=64,
    show_default=True,
    help="Requests running at once; the rest wait (vllm:num_requests_waiting).",
)
@click.option(
    "--default-max-tokens",
    type=click.IntRange(min=1),
    default=16,
    show_default=True,
    help="Output tokens when a request gives no max_tokens.",
)
@click.option(
    "--max-output-tokens",
    type=click.IntRange(min=1),
    default=4096,
    show_default=True,
    help="Upper bound of max_tokens.",
)
@click.option(
    "--zero-delay", is_flag=True, help="No prefill or decode time at all (for benchmarks)."
)
def engine(
    host: str,
    port: int,
    name: str | None,
    model: str,
    cache_tokens: int,
    prefill_us_per_token: float,
    decode_ms: float,
    max_running: int,
    default_max_tokens: int,
    max_output_tokens: int,
    zero_delay: bool,
) -> None:
    """A stand-in for one GPU serving replica, for machines without accelerators.

    Serves the OpenAI-compatible POST /v1/chat/completions and /v1/completions (streamed as SSE
    and not), GET /v1/models, /health and Prometheus /metrics with vLLM's metric names. It
    simulates a prefix cache (chained hashes of 64-character = 16-token blocks, LRU, capacity
    --cache-tokens) and timing: time to first token = queueing + uncached prompt tokens x
    --prefill-us-per-token, then one output token every --decode-ms. Responses report usage with
    prompt_tokens_details.cached_tokens, as vLLM does with --enable-prompt-tokens-details.
    Tokens are counted as 4 characters each. Stop with Ctrl-C or SIGTERM.
    """
    from cacheroute.engine.server import build_app  # noqa: PLC0415 - aiohttp only when serving
    from cacheroute.serve import serve  # noqa: PLC0415

    config = EngineConfig(
        name=name or f"engine-{port}",
        model=model,
        host=host,
        port=port,
        cache_tokens=cache_tokens,
        prefill_us_per_token=prefill_us_per_token,
        decode_ms=decode_ms,
        max_running=max_running,
        default_max_tokens=default_max_tokens,
        max_output_tokens=max_output_tokens,
        zero_delay=zero_delay,
    )
    app, _ = build_app(config)

    async def started() -> None:
        log.warning(
            "engine %s serving model %r on http://%s:%d (cache %d tokens, %s)",
            config.name,
            model,
            host,
            port,
            cache_tokens,
            "zero delay"
            if zero_delay
            else f"prefill {prefill_us_per_token} us/token, decode {decode_ms} ms/token",
        )

    try:
        serve(app, host, port, on_started=started)
    except OSError as exc:
        raise click.ClickException(str(exc.strerror or exc)) from exc
