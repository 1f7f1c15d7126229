"""Gateway settings from flags and TOML: backends, overrides, and clear errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cacheroute.errors import ConfigError
from cacheroute.gateway.config import build_config, load_file, parse_backend
from cacheroute.gateway.keys import KeyRule

TOML = """
port = 9000
key = ["header:x-tenant-id", "prefix:512"]
max_body_bytes = 1000

[[backends]]
name = "gpu-0"
url = "https://10.0.0.1:8000/v1/"
api_key_env = "TEST_GATEWAY_KEY"
health_path = "/v1/models"

[[backends]]
name = "gpu-1"
url = "http://10.0.0.2:8000"
verify_tls = false
"""


def test_backend_flag() -> None:
    b = parse_backend("d0=http://127.0.0.1:8000/v1/")
    assert (b.name, b.url, b.api_key, b.health_path) == (
        "d0",
        "http://127.0.0.1:8000",
        None,
        "/health",
    )
    for bad in ("d0", "=http://x", "d0=ftp://x", "d0=http://"):
        with pytest.raises(ConfigError):
            parse_backend(bad)


def test_toml_file_and_flag_overrides(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TEST_GATEWAY_KEY", "sk-secret")
    path = tmp_path / "gw.toml"
    path.write_text(TOML)
    cfg = build_config(load_file(path), port=9100, gateway_id="gw-a", host=None)
    assert cfg.port == 9100  # the flag wins
    assert cfg.gateway_id == "gw-a"
    assert cfg.max_body_bytes == 1000
    assert cfg.key_rules == (KeyRule("header", header="x-tenant-id"), KeyRule("prefix", chars=512))
    g0, g1 = cfg.backends
    assert (g0.url, g0.api_key, g0.health_path) == (
        "https://10.0.0.1:8000",
        "sk-secret",
        "/v1/models",
    )
    assert "sk-secret" not in repr(g0)
    assert g0.ssl_context is True  # verified against the system trust store
    assert g1.ssl_context is False
    flagged = build_config(load_file(path), backends=["x=http://127.0.0.1:1"])
    assert [b.name for b in flagged.backends] == ["x"]  # --backend replaces the file's list


def test_default_gateway_id_names_the_port() -> None:
    cfg = build_config(backends=["d0=http://127.0.0.1:1"], port=8123)
    assert cfg.gateway_id.startswith("gw-")
    assert cfg.gateway_id.endswith("-8123")
    assert cfg.kafka is True
    assert cfg.host == "127.0.0.1"


@pytest.mark.parametrize(
    ("file", "flags", "message"),
    [
        ({}, {}, "no backends"),
        (
            {"backends": [{"name": "a", "url": "http://h"}, {"name": "a", "url": "http://i"}]},
            {},
            "distinct",
        ),
        ({"backends": [{"name": "a", "url": "http://h", "colour": 1}]}, {}, "unknown keys"),
        ({"bogus": 1, "backends": []}, {}, "unknown config keys"),
        ({"port": "80", "backends": [{"name": "a", "url": "http://h"}]}, {}, "port"),
        (
            {"backends": [{"name": "a", "url": "http://h", "api_key_env": "NOT_SET_ANYWHERE_42"}]},
            {},
            "not set",
        ),
        ({"backends": [{"name": "a", "url": "http://h"}]}, {"key": "cookie:x"}, "routing-key rule"),
        ({"backends": [{"name": "a", "url": "http://h"}]}, {"health_interval_s": 0.0}, "> 0"),
    ],
)
def test_config_errors(file: dict[str, Any], flags: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        build_config(file, **flags)


def test_invalid_toml_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text("port = = 3")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_file(path)


def test_sole_gateway_turns_on_the_dispatchers_spill_and_context_homes() -> None:
    from cacheroute.gateway.server import Gateway  # noqa: PLC0415 - aiohttp
    from cacheroute.settings import Settings  # noqa: PLC0415

    plain = build_config(None, backends=["d0=http://127.0.0.1:1"], kafka=False)
    sole = build_config({"sole_gateway": True}, backends=["d0=http://127.0.0.1:1"], kafka=False)
    assert (plain.sole_gateway, sole.sole_gateway) == (False, True)
    with pytest.raises(ConfigError, match="sole_gateway"):
        build_config({"sole_gateway": "yes"}, backends=["d0=http://127.0.0.1:1"])
    for config, expected in ((plain, False), (sole, True)):
        gw = Gateway(config, Settings())
        try:
            assert gw.dispatcher.router.spill_home is expected
            assert gw.dispatcher.router.context_home is expected
        finally:
            gw.close()


def test_hash_blocks_come_from_the_file_or_the_flag_and_are_never_negative() -> None:
    one = ["d0=http://127.0.0.1:1"]
    assert build_config(None, backends=one).hash_block_tokens == 0
    assert build_config({"hash_block_tokens": 512}, backends=one).hash_block_tokens == 512
    flagged = build_config({"hash_block_tokens": 512}, backends=one, hash_block_tokens=16)
    assert flagged.hash_block_tokens == 16
    with pytest.raises(ConfigError, match="hash_block_tokens must be >= 0"):
        build_config({"hash_block_tokens": -1}, backends=one)
    with pytest.raises(ConfigError, match="hash_block_tokens"):
        build_config({"hash_block_tokens": "512"}, backends=one)


def test_cache_tokens_reach_the_router_of_a_sole_gateway_only() -> None:
    from cacheroute.gateway.server import Gateway  # noqa: PLC0415 - aiohttp
    from cacheroute.settings import Settings  # noqa: PLC0415

    one = ["d0=http://127.0.0.1:1"]
    sole = build_config({"cache_tokens": 65536, "sole_gateway": True}, backends=one, kafka=False)
    shared = build_config({"cache_tokens": 65536}, backends=one, kafka=False)
    with pytest.raises(ConfigError, match="cache_tokens must be >= 0"):
        build_config({"cache_tokens": -1}, backends=one)
    for config, expected in ((sole, 65536), (shared, None)):
        gw = Gateway(config, Settings())
        try:
            assert gw.dispatcher.router.cache_tokens == expected
        finally:
            gw.close()


def test_peers_come_from_flags_or_the_file_and_must_be_urls() -> None:
    file = {"backends": [{"name": "d0", "url": "http://127.0.0.1:8001"}]}
    config = build_config({**file, "peers": ["http://10.0.0.7:8080/"], "peer_loads_s": 0.5})
    assert config.peers == ("http://10.0.0.7:8080",)
    assert config.peer_loads_s == 0.5
    flags = build_config(file, peers=("https://gw-2:8443",))
    assert flags.peers == ("https://gw-2:8443",)
    assert build_config(file).peers == ()
    with pytest.raises(ConfigError, match="not an http"):
        build_config(file, peers=("10.0.0.7:8080",))
    with pytest.raises(ConfigError, match="peer_loads_s"):
        build_config(file, peer_loads_s=0.0)
