"""`cacheroute gateway`: the OpenAI-compatible reverse proxy that routes by the live plan."""

from __future__ import annotations

import logging
from pathlib import Path

import click

from cacheroute.errors import CacheRouteError
from cacheroute.gateway.config import CONFIG_KEYS, build_config, load_file
from cacheroute.gateway.keys import DEFAULT_KEY_RULE
from cacheroute.kafkaio import check_credentials
from cacheroute.settings import Settings

__all__ = ["gateway"]

log = logging.getLogger(__name__)


def _config_help() -> str:
    return "\n".join(f"  {k}: {v}" for k, v in CONFIG_KEYS.items())


@click.command(epilog="Config file keys (TOML; flags override them):\n\n\b\n" + _config_help())
@click.option(
    "--backend",
    "backends",
    multiple=True,
    metavar="NAME=URL",
    help="A serving replica, repeatable: NAME is its destination name in plans, URL its server "
    "root (http://host:8000). Replaces the config file's [[backends]].",
)
@click.option(
    "--config",
    "config_path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="TOML file with the settings below and [[backends]] tables (api keys, TLS).",
)
@click.option("--host", default=None, help="Listen address [127.0.0.1].")
@click.option("--port", type=click.IntRange(1, 65535), default=None, help="Listen port [8080].")
@click.option("--gateway-id", default=None, help="Id in events and logs [gw-HOSTNAME-PORT].")
@click.option(
    "--key",
    default=None,
    metavar="RULES",
    help="Routing-key rules, first match wins: header:NAME, user, prefix[:CHARS] "
    f"[{DEFAULT_KEY_RULE}].",
)
@click.option(
    "--max-body-bytes",
    type=click.IntRange(min=1),
    default=None,
    help="Larger bodies get 413 [8 MiB].",
)
@click.option(
    "--health-interval",
    "health_interval_s",
    type=click.FloatRange(min=0.05),
    default=None,
    help="Seconds between health checks of each backend [2].",
)
@click.option(
    "--connect-timeout",
    "connect_timeout_s",
    type=click.FloatRange(min=0.01),
    default=None,
    help="Seconds to connect to a backend [3].",
)
@click.option(
    "--read-timeout",
    "read_timeout_s",
    type=click.FloatRange(min=0.01),
    default=None,
    help="Longest silence of a backend while it answers, seconds [600].",
)
@click.option(
    "--no-kafka",
    is_flag=True,
    help="Do not follow plans or send events: route by the cold path only (tests, benchmarks).",
)
@click.option(
    "--sole-gateway",
    is_flag=True,
    help="This is the cluster's only gateway: its in-flight counts are the backends' real loads, "
    "so a planned key may balance between its planned backend and where it last spilled, "
    "a conversation the new plan admits stays where its history is cached while that is cheaper, "
    "a new conversation starts where its prompt's leading blocks went (prefix affinity), and "
    "each conversation of a planned key goes where its missing blocks cost least and stays with "
    "its context unless that backend is overloaded.",
)
@click.option(
    "--cache-tokens",
    type=click.IntRange(min=0),
    default=None,
    metavar="TOKENS",
    help="With --sole-gateway: each backend's KV cache capacity in tokens (vLLM logs it at "
    "start-up), so a conversation's context counts as cached only while it can still fit there "
    "[0: off].",
)
@click.option(
    "--hash-blocks",
    "hash_block_tokens",
    type=click.IntRange(min=0),
    default=None,
    metavar="TOKENS",
    help="Send each request's prefix block hashes (chained, TOKENS-token blocks at 4 characters "
    "a token; the trace readers use 512) in its event, so `cacheroute evaluate --topic` can "
    "replay the recorded traffic with its prefixes; 0: off [0].",
)
@click.option(
    "--peer",
    "peers",
    multiple=True,
    metavar="URL",
    help="Base URL of another gateway behind the same balancer (repeatable). Every "
    "--peer-loads-s this gateway reads each peer's own in-flight load per backend (GET "
    "/peer/loads) and routes on the sum with its own: with G gateways each one's own counts "
    "hold 1/G of a backend's queue. Measured in the replay at 16 gateways (every 0.25 s): +4% to "
    "+33% SLO capacity, +1.6% on whale (README).",
)
@click.option(
    "--peer-loads-s",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Seconds between reads of the peers' loads; a peer silent for three is dropped [0.25].",
)
@click.pass_obj
def gateway(
    settings: Settings,
    backends: tuple[str, ...],
    config_path: Path | None,
    host: str | None,
    port: int | None,
    gateway_id: str | None,
    key: str | None,
    max_body_bytes: int | None,
    health_interval_s: float | None,
    connect_timeout_s: float | None,
    read_timeout_s: float | None,
    no_kafka: bool,
    sole_gateway: bool,
    cache_tokens: int | None,
    hash_block_tokens: int | None,
    peers: tuple[str, ...],
    peer_loads_s: float | None,
) -> None:
    """Run an OpenAI-compatible gateway in front of the serving replicas.

    Proxies POST /v1/chat/completions and /v1/completions (streamed SSE passed through chunk by
    chunk, and not streamed) to the backend the dispatcher picks for the request's routing key:
    the live plan from the plans topic (--bootstrap, --topic-prefix), else the cold path. Every
    request is reported to the requests topic with the cached tokens the backend returned in its
    usage. Also serves GET /v1/models (merged), /health, /ready and Prometheus /metrics. A backend
    that refuses a connection or answers 5xx is marked down (the request is retried once on
    another) until its health check passes again. The response header x-cacheroute-backend
    names the backend that answered. GET /peer/loads answers its own in-flight load per backend;
    with --peer it reads its peers' and routes on the sum. Stop with Ctrl-C or SIGTERM.
    """
    from cacheroute.gateway.server import Gateway  # noqa: PLC0415 - aiohttp only when serving
    from cacheroute.serve import serve  # noqa: PLC0415

    file = load_file(config_path) if config_path is not None else None
    config = build_config(
        file,
        backends=backends,
        host=host,
        port=port,
        gateway_id=gateway_id,
        key=key,
        max_body_bytes=max_body_bytes,
        health_interval_s=health_interval_s,
        connect_timeout_s=connect_timeout_s,
        read_timeout_s=read_timeout_s,
        kafka=False if no_kafka else None,
        sole_gateway=True if sole_gateway else None,
        cache_tokens=cache_tokens,
        hash_block_tokens=hash_block_tokens,
        peers=peers or None,
        peer_loads_s=peer_loads_s,
    )
    if config.kafka:
        # A refused login is one line now; without this the plan follower retries it until its
        # discovery gives up and blames "no Kafka broker answers" about 10 s later.
        check_credentials(settings, doing="starting the gateway")
    try:
        gw = Gateway(config, settings)
    except CacheRouteError as exc:
        raise CacheRouteError(
            f"{exc} (or run with --no-kafka: no plans, no events, cold-path routing)"
        ) from exc
    try:
        app = gw.app()

        async def started() -> None:
            log.warning(
                "gateway %s listening on http://%s:%d; backends %s; key rule %s; %s",
                config.gateway_id,
                config.host,
                config.port,
                ", ".join(f"{b.name}={b.url}" for b in config.backends),
                ",".join(str(r) for r in config.key_rules),
                f"following {settings.topics['plans']}, events to {settings.topics['requests']}"
                if config.kafka
                else "no Kafka: cold-path routing, no events",
            )

        serve(app, config.host, config.port, on_started=started)
    except OSError as exc:
        raise click.ClickException(str(exc.strerror or exc)) from exc
    finally:
        gw.close()
