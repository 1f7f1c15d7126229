"""The routing-key rule: the same key for the same request on every gateway, never a crash."""

from __future__ import annotations

from typing import Any

import pytest

from cacheroute.errors import ConfigError
from cacheroute.gateway.keys import (
    MAX_KEY_CHARS,
    KeyRule,
    parse_key_rules,
    routing_key,
    session_hint,
)
from cacheroute.openai_api import estimate_tokens, leading_text, prompt_text

SYSTEM = {"role": "system", "content": "You are terse."}
FIRST = {"role": "user", "content": "What is a KV cache?"}
# blake2b(b"You are terse.\nWhat is a KV cache?", digest_size=16), pinned: gateways of different
# versions must keep computing the same key for the same conversation
PINNED = "p:43e5c6ee17c84e21103fc1f344abf4cb"


def chat(*messages: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": list(messages), **extra}


def test_rules_parse_in_order_and_end_with_prefix() -> None:
    rules = parse_key_rules("header:X-Session-Id, user")
    assert rules == (KeyRule("header", header="x-session-id"), KeyRule("user"), KeyRule("prefix"))
    assert parse_key_rules(["prefix:100"]) == (KeyRule("prefix", chars=100),)
    assert [str(r) for r in parse_key_rules("header:x-tenant-id")] == [
        "header:x-tenant-id",
        "prefix:2048",
    ]


@pytest.mark.parametrize("bad", ["", "header", "header:", "user:x", "prefix:0", "prefix:-3", "ip"])
def test_bad_rules_are_config_errors(bad: str) -> None:
    with pytest.raises(ConfigError):
        parse_key_rules(bad)


def test_header_then_user_then_prefix() -> None:
    rules = parse_key_rules("header:x-session-id,user")
    body = chat(SYSTEM, FIRST, user="alice")
    assert routing_key(rules, {"x-session-id": "tenant-4/conv-9"}, body, chat=True) == (
        "tenant-4/conv-9",
        rules[0],
    )
    assert routing_key(rules, {"x-session-id": "  "}, body, chat=True) == ("alice", rules[1])
    assert routing_key(rules, {}, chat(SYSTEM, FIRST), chat=True) == (PINNED, rules[2])


def test_prefix_key_is_stable_over_a_conversation_and_changes_with_the_system_prompt() -> None:
    rules = parse_key_rules("prefix")
    turn1 = chat(SYSTEM, FIRST)
    turn3 = chat(
        SYSTEM,
        FIRST,
        {"role": "assistant", "content": "Saved attention keys and values."},
        {"role": "user", "content": "Why does it help?"},
    )
    other = chat({"role": "system", "content": "You are verbose."}, FIRST)
    key1 = routing_key(rules, {}, turn1, chat=True)[0]
    assert key1 == PINNED
    assert routing_key(rules, {}, turn3, chat=True)[0] == key1
    assert routing_key(rules, {}, other, chat=True)[0] != key1


def test_prefix_key_reads_only_the_leading_characters() -> None:
    rules = parse_key_rules("prefix:10")
    a = {"model": "m", "prompt": "0123456789 and then one thing"}
    b = {"model": "m", "prompt": "0123456789 but then another"}
    c = {"model": "m", "prompt": "012345678X and then one thing"}
    ka, kb, kc = (routing_key(rules, {}, x, chat=False)[0] for x in (a, b, c))
    assert ka == kb != kc


def test_long_or_unencodable_keys_are_hashed() -> None:
    rules = parse_key_rules("header:x-session-id")
    key, _ = routing_key(rules, {"x-session-id": "k" * (MAX_KEY_CHARS + 1)}, {}, chat=True)
    assert key.startswith("h:")
    assert len(key) == 34
    key, _ = routing_key(rules, {"x-session-id": "k" * MAX_KEY_CHARS}, {}, chat=True)
    assert key == "k" * MAX_KEY_CHARS
    key, _ = routing_key(parse_key_rules("user"), {}, {"user": "bad\udc80"}, chat=True)
    assert key.startswith("h:")


@pytest.mark.parametrize(
    "body",
    [
        None,
        [],
        "text",
        3,
        {"messages": "no"},
        {"messages": [1, None, {"content": 7}]},
        {"prompt": {}},
    ],
)
def test_garbage_bodies_still_get_a_key(body: object) -> None:
    for is_chat in (True, False):
        key, rule = routing_key(parse_key_rules("user"), {}, body, chat=is_chat)
        assert key.startswith("p:")
        assert len(key) == 34
        assert rule.kind == "prefix"


def test_leading_text_takes_system_messages_and_the_first_other_message() -> None:
    body = chat(
        {"role": "system", "content": "A"},
        {"role": "developer", "content": [{"type": "text", "text": "B"}, {"type": "image"}]},
        {"role": "user", "content": "U"},
        {"role": "assistant", "content": "X"},
    )
    assert leading_text(body, chat=True, limit=100) == "A\nB\nU"
    assert leading_text(body, chat=True, limit=3) == "A\nB"
    assert leading_text({"prompt": ["first", "second"]}, chat=False, limit=100) == "first"


def test_prompt_text_and_token_estimate() -> None:
    body = chat(SYSTEM, FIRST)
    text = prompt_text(body, chat=True)
    assert text == "system: You are terse.\nuser: What is a KV cache?\n"
    assert estimate_tokens(text) == 13  # 50 characters, 4 per token, rounded up
    assert estimate_tokens("") == 0
    assert estimate_tokens(prompt_text({"prompt": [11, 22, 333333]}, chat=False)) == 3


def test_a_tenant_key_carries_the_conversation_as_its_session_hint() -> None:
    rules = parse_key_rules("header:x-tenant-id")
    turn1 = chat(SYSTEM, FIRST)
    turn2 = chat(
        SYSTEM,
        FIRST,
        {"role": "assistant", "content": "A cache."},
        {"role": "user", "content": "More?"},
    )
    other = chat(SYSTEM, {"role": "user", "content": "Another question"})
    hints = []
    for body in (turn1, turn2, other):
        key, rule = routing_key(rules, {"x-tenant-id": "acme"}, body, chat=True)
        assert key == "acme"
        hints.append(session_hint(rule, body, chat=True))
    # the same conversation's turns share the hint: the prefix hash of system + first message,
    # pinned above; another conversation of the tenant has another
    assert hints[0] == PINNED
    assert hints[1] == PINNED
    assert hints[2] != PINNED
    assert hints[2] is not None
    assert hints[2].startswith("p:")


def test_a_prefix_key_is_its_own_conversation_and_bad_bodies_give_no_hint() -> None:
    key, rule = routing_key(parse_key_rules("prefix"), {}, chat(SYSTEM, FIRST), chat=True)
    assert key == PINNED
    assert session_hint(rule, chat(SYSTEM, FIRST), chat=True) is None
    assert session_hint(KeyRule("user"), {"messages": 5}, chat=True) is not None  # never raises
