"""The routing key of a request: the same key for the same conversation on every gateway.

Plans map keys to destinations, so a key must be computed alike by every gateway with nothing but
the request: no shared state, no randomness. A rule is one of

- `header:NAME`: the value of request header NAME (e.g. `x-session-id`, `x-tenant-id`); with
  keys shaped `tenant/conversation` the planner co-locates a tenant's conversations;
- `user`: the OpenAI `user` field of the body;
- `prefix[:N]`: `p:` + a blake2b hash of the request's leading N characters (system prompt and
  first message; the prompt of /v1/completions), N = 2048 by default. Requests that share that
  leading text (one conversation's turns, one app's long system prompt) share a key without any
  client cooperation.

A key from a header or `user` may be coarser than a conversation (a tenant id): `session_hint`
then also names the request's conversation by the prefix hash (system prompt and first message),
and the dispatcher keeps each conversation on one replica of its key (`Router.route_index`).

A list of rules is tried in order; the first that yields a non-empty key wins, and `prefix` is
always the last resort, so every request has a key. Keys longer than MAX_KEY_CHARS characters are
replaced by `h:` + their hash (the emitter and the streams agent bound key sizes).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from cacheroute.errors import ConfigError
from cacheroute.openai_api import leading_text

__all__ = [
    "DEFAULT_KEY_RULE",
    "DEFAULT_PREFIX_CHARS",
    "MAX_KEY_CHARS",
    "KeyRule",
    "parse_key_rules",
    "routing_key",
    "session_hint",
]

DEFAULT_PREFIX_CHARS = 2048
DEFAULT_KEY_RULE = "header:x-session-id,user,prefix:2048"
MAX_KEY_CHARS = 256


@dataclass(frozen=True, slots=True)
class KeyRule:
    """One rule: kind `header` (arg: the header name), `user`, or `prefix` (arg: characters)."""

    kind: str
    header: str = ""
    chars: int = DEFAULT_PREFIX_CHARS

    def __str__(self) -> str:
        if self.kind == "header":
            return f"header:{self.header}"
        if self.kind == "prefix":
            return f"prefix:{self.chars}"
        return self.kind


def _parse_one(text: str) -> KeyRule:
    kind, _, arg = text.strip().partition(":")
    kind = kind.strip().lower()
    arg = arg.strip()
    if kind == "header" and arg:
        return KeyRule("header", header=arg.lower())
    if kind == "user" and not arg:
        return KeyRule("user")
    if kind == "prefix":
        if not arg:
            return KeyRule("prefix")
        if arg.isdigit() and int(arg) > 0:
            return KeyRule("prefix", chars=int(arg))
    raise ConfigError(
        f"routing-key rule {text!r} is not header:NAME, user or prefix[:CHARS] "
        f"(e.g. {DEFAULT_KEY_RULE!r})"
    )


def parse_key_rules(spec: str | Sequence[str]) -> tuple[KeyRule, ...]:
    """Rules from `a,b,c` or a list of strings; `prefix` is appended when missing."""
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    if not all(isinstance(i, str) for i in items):
        raise ConfigError(f"routing-key rules must be strings, got {spec!r}")
    rules = tuple(_parse_one(i) for i in items if i.strip())
    if not rules:
        raise ConfigError(f"no routing-key rule given (e.g. {DEFAULT_KEY_RULE!r})")
    if rules[-1].kind != "prefix":
        rules = (*rules, KeyRule("prefix"))
    return rules


def _digest(text: str) -> str:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


def _bounded(key: str) -> str:
    """`key`, or `h:` + its hash when it is too long or not encodable as UTF-8."""
    try:
        key.encode("utf-8")
    except UnicodeEncodeError:
        return "h:" + _digest(key)
    return key if len(key) <= MAX_KEY_CHARS else "h:" + _digest(key)


def routing_key(
    rules: Sequence[KeyRule], headers: Mapping[str, str], body: object, *, chat: bool
) -> tuple[str, KeyRule]:
    """(key, the rule that produced it) for one request. Never raises.

    `headers` must be case-insensitive (aiohttp's are) or have lower-case names.
    """
    for rule in rules:
        if rule.kind == "header":
            value = headers.get(rule.header)
            if isinstance(value, str) and value.strip():
                return _bounded(value.strip()), rule
        elif rule.kind == "user":
            user = body.get("user") if isinstance(body, dict) else None
            if isinstance(user, str) and user.strip():
                return _bounded(user.strip()), rule
        else:
            return "p:" + _digest(leading_text(body, chat=chat, limit=rule.chars)), rule
    last = KeyRule("prefix")  # parse_key_rules always ends with prefix; a hand-made list may not
    return "p:" + _digest(leading_text(body, chat=chat, limit=last.chars)), last


def session_hint(rule: KeyRule, body: object, *, chat: bool) -> str | None:
    """The request's conversation when its key came from `rule` and may be coarser; else None.

    A key from the `prefix` rule already is the conversation (its leading text); a header or
    `user` key may name a tenant, so the conversation is the prefix hash the `prefix` rule would
    give. Never raises.
    """
    if rule.kind == "prefix":
        return None
    try:
        return "p:" + _digest(leading_text(body, chat=chat, limit=DEFAULT_PREFIX_CHARS))
    except Exception:  # a body we cannot read: no hint, the key still routes
        return None
