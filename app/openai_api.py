"""The OpenAI-compatible wire format that both the gateway and the engine stand-in speak.

Only what both sides need to agree on lives here: which text of a request is its prompt, how many
tokens it is estimated to have when nobody has tokenized it, and what an error looks like. Every
function takes the parsed JSON of a client request as it came (any shape) and never raises: a
gateway must route garbage without crashing, and the engine must answer it with a 400.
"""

from __future__ import annotations

import hashlib
from typing import Any

import orjson

__all__ = [
    "CHARS_PER_TOKEN",
    "CHAT_PATH",
    "COMPLETIONS_PATH",
    "MODELS_PATH",
    "content_text",
    "error_body",
    "estimate_tokens",
    "leading_text",
    "prefix_block_hashes",
    "prompt_text",
]

CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"
MODELS_PATH = "/v1/models"

CHARS_PER_TOKEN = 4
"""English text averages about 4 characters per token in the common BPE vocabularies; the gateway
needs an estimate before the backend has tokenized anything (load units, events without usage)."""


def content_text(content: object) -> str:
    """Text of one message's `content`: a string, or the text parts of a list of parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            part["text"]
            for part in content
            if isinstance(part, dict) and isinstance(part.get("text"), str)
        )
    return ""


def _completion_prompt(body: dict[str, Any]) -> str:
    """`prompt` of /v1/completions: a string, a list of strings (the first), or token ids."""
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt:
        first = prompt[0]
        if isinstance(first, str):
            return first
        ids = first if isinstance(first, list) else prompt
        # token ids: one 4-character word per id, so the estimate below counts one token each
        return "".join(f"{t:>4}"[-4:] for t in ids if isinstance(t, int))
    return ""


def prompt_text(body: object, *, chat: bool) -> str:
    """The whole prompt as an engine would see it: one `role: content` line per chat message.

    A conversation's next turn repeats the earlier messages, so its prompt text starts with the
    previous turn's: exactly the prefix a serving engine can reuse from its cache.
    """
    if not isinstance(body, dict):
        return ""
    if not chat:
        return _completion_prompt(body)
    messages = body.get("messages")
    if not isinstance(messages, list):
        return ""
    lines = []
    for m in messages:
        if isinstance(m, dict):
            role = m.get("role")
            lines.append(
                f"{role if isinstance(role, str) else ''}: {content_text(m.get('content'))}\n"
            )
    return "".join(lines)


_HASH_ROOT = bytes(8)


def prefix_block_hashes(text: str, block_tokens: int, limit: int | None = None) -> list[int]:
    """Chained 64-bit hashes of the full `block_tokens`-token blocks of a prompt's text.

    The identity the trace readers give blocks: hash j covers block j *and* everything before it
    (blake2b of hash j-1 + block j's text), so two prompts share their first m hashes exactly when
    their first m blocks are the same text, and equal hashes mean a reusable prefix. A block is
    `block_tokens` x CHARS_PER_TOKEN characters (the gateway has not tokenized anything); a
    partial last block is not hashed (engines never cache one). Signed, to fit Avro's long.
    `limit`: at most this many leading blocks.
    """
    chars = block_tokens * CHARS_PER_TOKEN
    if chars <= 0:
        return []
    out: list[int] = []
    prev = _HASH_ROOT
    end = len(text) - chars + 1
    if limit is not None:
        end = min(end, limit * chars)
    for start in range(0, end, chars):  # by characters, as the estimate counts
        block = text[start : start + chars].encode("utf-8", "surrogatepass")
        prev = hashlib.blake2b(prev + block, digest_size=8).digest()
        out.append(int.from_bytes(prev, "little", signed=True))
    return out


def leading_text(body: object, *, chat: bool, limit: int) -> str:
    """The request's stable leading part, at most `limit` characters: what identifies a prefix.

    Chat: the leading system messages and the first other message (usually the user's opening
    question), which stay the same on every turn of a conversation. Completions: the prompt.
    """
    if not isinstance(body, dict) or limit <= 0:
        return ""
    if not chat:
        return _completion_prompt(body)[:limit]
    messages = body.get("messages")
    if not isinstance(messages, list):
        return ""
    parts: list[str] = []
    size = 0
    for m in messages:
        if not isinstance(m, dict):
            continue
        text = content_text(m.get("content"))
        parts.append(text)
        size += len(text) + 1
        if m.get("role") not in ("system", "developer") or size >= limit:
            break
    return "\n".join(parts)[:limit]


def estimate_tokens(text: str) -> int:
    """Tokens of `text` at CHARS_PER_TOKEN characters each (rounded up; 0 for empty text)."""
    return -(-len(text) // CHARS_PER_TOKEN)


def error_body(message: str, type_: str, code: str | None = None) -> bytes:
    """An OpenAI-style error: {"error": {"message", "type", "param", "code"}} as JSON bytes."""
    return orjson.dumps({"error": {"message": message, "type": type_, "param": None, "code": code}})
