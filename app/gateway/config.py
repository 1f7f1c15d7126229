"""Settings of one gateway: its backends, listen address, routing-key rule, limits and timeouts.

They come from a TOML file (`--config`) and/or flags (flags win; `--backend` flags replace the
file's backends). A backend is `name=url`: the name is what plans call the destination (so it must
match the planner's destination names), the URL is the server root of an OpenAI-compatible engine
(`http://host:8000`; a trailing `/v1` is accepted and dropped, since the proxied paths carry it).
"""

from __future__ import annotations

import functools
import os
import socket
import ssl
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from cacheroute.errors import ConfigError
from cacheroute.gateway.keys import DEFAULT_KEY_RULE, KeyRule, parse_key_rules

__all__ = [
    "CONFIG_KEYS",
    "Backend",
    "GatewayConfig",
    "build_config",
    "load_file",
    "parse_backend",
]


@dataclass(frozen=True)
class Backend:
    """One serving replica (a destination of the plan)."""

    name: str
    url: str
    """Server root, no trailing slash: `url + "/v1/chat/completions"` is the endpoint."""
    api_key: str | None = field(default=None, repr=False)
    """Sent as `Authorization: Bearer …` to this backend only (the client's own header is not
    forwarded: it authenticates the client to the gateway, not to the backend)."""
    health_path: str = "/health"
    """GET here must answer 2xx while the backend can serve (vLLM/SGLang: /health; a backend
    without it: /v1/models)."""
    verify_tls: bool = True
    ca_file: Path | None = None

    @functools.cached_property
    def ssl_context(self) -> ssl.SSLContext | bool:
        """aiohttp's `ssl=` for this backend: True verifies against the system trust store
        (ignored for http URLs), False skips verification, a context trusts `ca_file`."""
        if not self.verify_tls:
            return False
        if self.ca_file is not None and self.url.startswith("https://"):
            return ssl.create_default_context(cafile=str(self.ca_file))
        return True


@dataclass(frozen=True)
class GatewayConfig:
    """Everything `cacheroute gateway` needs besides the Kafka settings."""

    backends: tuple[Backend, ...]
    host: str = "127.0.0.1"
    port: int = 8080
    gateway_id: str = ""
    key_rules: tuple[KeyRule, ...] = parse_key_rules(DEFAULT_KEY_RULE)
    max_body_bytes: int = 8 * 1024 * 1024
    health_interval_s: float = 2.0
    health_timeout_s: float = 2.0
    connect_timeout_s: float = 3.0
    read_timeout_s: float = 600.0
    """Longest wait for the next bytes from a backend (a long prefill or a slow decode step)."""
    max_connections: int = 1024
    kafka: bool = True
    """False (`--no-kafka`): no plan following and no events; the cold path only."""
    sole_gateway: bool = False
    """True (`--sole-gateway`): this is the cluster's only gateway, so its in-flight counts are the
    backends' real loads and a planned key may balance between its planned backend and where it
    last spilled (`Router.spill_home`), a conversation the new plan admits stays where its
    history is cached while that is the cheaper choice (`Router.context_home`), and a key new to
    the cold path goes where its prompt's leading blocks went (`Router.prefix_blocks`; blocks of
    `hash_block_tokens`, else 512 tokens), and a cold key that has to be placed goes where its
    prompt's missing blocks plus the backend's recent cache churn cost least (`Router.cold_cost`).
    Leave it off behind a load balancer of several."""
    cache_tokens: int = 0
    """> 0 (`--cache-tokens`), with `sole_gateway`: each backend's KV cache capacity in tokens,
    so the dispatcher counts a conversation's context as cached only while it can still fit
    there (`Router.cache_tokens`). Ignored behind a balancer of several gateways."""
    hash_block_tokens: int = 0
    """> 0 (`--hash-blocks TOKENS`): each event carries the prompt's chained block hashes
    (`openai_api.prefix_block_hashes`), so `evaluate --topic` can replay the recorded prefixes."""
    peers: tuple[str, ...] = ()
    """Base URLs of the other gateways behind the same balancer (`--peer URL`): every
    `peer_loads_s` this gateway reads each one's own in-flight load (`GET /peer/loads`) and
    counts their sum on top of its own (`cacheroute.dispatcher.peers`). Empty: its own only."""
    peer_loads_s: float = 0.25
    """Seconds between two reads of the peers' loads; a peer silent for 3 of them is dropped.
    In the replay at 16 gateways 0.25 s beat 1 s on whale (418 vs 400 req/s; one-second-old loads
    herd spills) and matched it elsewhere."""

    def __post_init__(self) -> None:
        if not self.backends:
            raise ConfigError(
                "no backends: give --backend NAME=URL (repeatable) or [[backends]] in --config"
            )
        for key, kind in _TYPES.items():
            value = getattr(self, key)
            if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
                raise ConfigError(f"{key} must be of type {kind}, got {value!r}")
        names = [b.name for b in self.backends]
        if len(set(names)) != len(names):
            raise ConfigError(f"backend names must be distinct, got {names}")
        if self.cache_tokens < 0:
            raise ConfigError("cache_tokens must be >= 0 (0: contexts count as cached)")
        object.__setattr__(self, "peers", tuple(_peer_url(u) for u in self.peers))
        if self.hash_block_tokens < 0:
            raise ConfigError("hash_block_tokens must be >= 0 (0: no block hashes in events)")
        for key in ("max_body_bytes", "max_connections", "port"):
            if getattr(self, key) < 1:
                raise ConfigError(f"{key} must be >= 1")
        for key in (
            "health_interval_s",
            "health_timeout_s",
            "connect_timeout_s",
            "read_timeout_s",
            "peer_loads_s",
        ):
            if not getattr(self, key) > 0:
                raise ConfigError(f"{key} must be > 0")


_TYPES: dict[str, type | tuple[type, ...]] = {
    "host": str,
    "port": int,
    "gateway_id": str,
    "max_body_bytes": int,
    "health_interval_s": (int, float),
    "health_timeout_s": (int, float),
    "connect_timeout_s": (int, float),
    "read_timeout_s": (int, float),
    "max_connections": int,
    "kafka": bool,
    "sole_gateway": bool,
    "hash_block_tokens": int,
    "cache_tokens": int,
    "peers": (tuple, list),
    "peer_loads_s": (int, float),
}

CONFIG_KEYS: dict[str, str] = {
    "host": "listen address [127.0.0.1]",
    "port": "listen port [8080]",
    "gateway_id": "id in events and logs [gw-HOSTNAME-PORT]",
    "key": f'routing-key rule(s), a string or a list ["{DEFAULT_KEY_RULE}"]',
    "max_body_bytes": "largest request body; larger ones get 413 [8388608]",
    "health_interval_s": "seconds between health checks of every backend [2]",
    "health_timeout_s": "a health check slower than this fails [2]",
    "connect_timeout_s": "connecting to a backend [3]",
    "read_timeout_s": "longest silence of a backend while it answers [600]",
    "max_connections": "pooled connections to all backends [1024]",
    "kafka": "false: no plan following and no events [true]",
    "sole_gateway": "true: the cluster's only gateway (planned keys may use a spill home) [false]",
    "hash_block_tokens": "> 0: prefix block hashes of this many tokens in each event [0]",
    "cache_tokens": "> 0, with sole_gateway: each backend's KV cache capacity in tokens [0]",
    "peers": "base URLs of the other gateways, whose loads this one counts [none]",
    "peer_loads_s": "seconds between reads of the peers' loads [0.25]",
    "[[backends]]": "name, url, and optional api_key, api_key_env, health_path, verify_tls, "
    "ca_file",
}


def _url(name: str, url: str) -> str:
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(
            f"backend {name!r}: URL {url!r} is not http(s)://host[:port][/path], e.g. "
            "http://127.0.0.1:8000"
        )
    path = parts.path.rstrip("/")
    if path.endswith("/v1"):
        path = path[:-3]
    return f"{parts.scheme}://{parts.netloc}{path}"


def _peer_url(url: object) -> str:
    """A peer gateway's base URL, checked (http(s)://host[:port])."""
    text = url.strip() if isinstance(url, str) else ""
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(
            f"peer {url!r} is not an http(s)://host[:port] URL of another gateway, e.g. "
            "http://10.0.0.7:8080"
        )
    return text.rstrip("/")


def parse_backend(text: str) -> Backend:
    """`NAME=URL` from a --backend flag."""
    name, sep, url = text.partition("=")
    name = name.strip()
    if not sep or not name or not url.strip():
        raise ConfigError(f"--backend {text!r} is not NAME=URL, e.g. d0=http://127.0.0.1:8000")
    return Backend(name=name, url=_url(name, url))


def _backend_from_table(item: object, i: int) -> Backend:
    if not isinstance(item, dict):
        raise ConfigError(f"[[backends]] entry {i} is not a table")
    unknown = set(item) - {
        "name",
        "url",
        "api_key",
        "api_key_env",
        "health_path",
        "verify_tls",
        "ca_file",
    }
    if unknown:
        raise ConfigError(f"[[backends]] entry {i}: unknown keys {sorted(unknown)}")
    name, url = item.get("name"), item.get("url")
    if not isinstance(name, str) or not name or not isinstance(url, str):
        raise ConfigError(f"[[backends]] entry {i} needs string `name` and `url`")
    key = item.get("api_key")
    env = item.get("api_key_env")
    if env is not None:
        key = os.environ.get(str(env))
        if not key:
            raise ConfigError(
                f"backend {name!r}: environment variable {env} (api_key_env) is not set"
            )
    health = item.get("health_path", "/health")
    if not isinstance(health, str) or not health.startswith("/"):
        raise ConfigError(f"backend {name!r}: health_path must start with '/'")
    ca = item.get("ca_file")
    return Backend(
        name=name,
        url=_url(name, url),
        api_key=str(key) if key else None,
        health_path=health,
        verify_tls=bool(item.get("verify_tls", True)),
        ca_file=Path(ca) if ca else None,
    )


def load_file(path: Path) -> dict[str, Any]:
    """The TOML file's contents (a clear ConfigError when it is not valid TOML)."""
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML ({exc})") from exc


def build_config(
    file: Mapping[str, Any] | None = None,
    *,
    backends: Sequence[str] = (),
    **flags: Any,
) -> GatewayConfig:
    """File values, overridden by flags that are not None; `backends` flags replace the file's."""
    file = dict(file or {})
    known = {k for k in CONFIG_KEYS if not k.startswith("[")} | {"backends"}
    unknown = set(file) - known
    if unknown:
        raise ConfigError(
            f"unknown config keys {sorted(unknown)}; known: {sorted(known)} "
            "(see `cacheroute gateway --help`)"
        )
    values: dict[str, Any] = {k: v for k, v in file.items() if k not in ("backends", "key")}
    if "key" in file:
        values["key_rules"] = parse_key_rules(file["key"])
    for k, v in flags.items():
        if v is None:
            continue
        if k == "key":
            values["key_rules"] = parse_key_rules(v)
        else:
            values[k] = v
    if backends:
        values["backends"] = tuple(parse_backend(b) for b in backends)
    else:
        table = file.get("backends", [])
        if not isinstance(table, list):
            raise ConfigError("`backends` must be an array of tables: [[backends]]")
        values["backends"] = tuple(_backend_from_table(t, i) for i, t in enumerate(table))
    try:
        config = GatewayConfig(**values)
    except TypeError as exc:
        raise ConfigError(f"bad gateway settings: {exc}") from exc
    if not config.gateway_id:
        config = replace(config, gateway_id=f"gw-{socket.gethostname()}-{config.port}")
    return config
