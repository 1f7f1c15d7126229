"""Response bodies of the engine stand-in in OpenAI's shapes: whole responses and SSE chunks.

Pure, so the shapes are tested without a server. Streams are `data: {json}\\n\\n` events ending
with `data: [DONE]\\n\\n`; chat streams open with a chunk carrying the assistant role, and the
usage chunk (empty `choices`) comes last when the client asked for it with
`stream_options: {"include_usage": true}`, as OpenAI and vLLM do.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

__all__ = ["DONE", "Framer", "Usage", "output_token", "sse", "usage_dict"]

DONE = b"data: [DONE]\n\n"

Usage = tuple[int, int, int]
"""(prompt tokens, completion tokens, cached prompt tokens)."""


def output_token(i: int) -> str:
    """The i-th output token's text (one token = one short word)."""
    return f" t{i}"


def usage_dict(usage: Usage) -> dict[str, Any]:
    """OpenAI's `usage` object, with `prompt_tokens_details.cached_tokens` as vLLM reports it."""
    prompt, completion, cached = usage
    return {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def sse(obj: object) -> bytes:
    """One SSE `data:` event."""
    return b"data: " + orjson.dumps(obj) + b"\n\n"


@dataclass(frozen=True, slots=True)
class Framer:
    """Frames one response: chat (`chat.completion[.chunk]`) or completions (`text_completion`)."""

    chat: bool
    digest: str
    """Identifies the request (a digest of its body: the same request gets the same id)."""
    created: int
    model: str

    @property
    def rid(self) -> str:
        return f"{'chatcmpl' if self.chat else 'cmpl'}-{self.digest}"

    def whole(self, text: str, finish: str, usage: Usage) -> bytes:
        """The non-streamed response body."""
        choice: dict[str, Any] = {"index": 0}
        if self.chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        choice["logprobs"] = None
        choice["finish_reason"] = finish
        return orjson.dumps(
            {
                "id": self.rid,
                "object": "chat.completion" if self.chat else "text_completion",
                "created": self.created,
                "model": self.model,
                "choices": [choice],
                "usage": usage_dict(usage),
            }
        )

    def _event(self, choices: list[dict[str, Any]], usage: Usage | None = None) -> bytes:
        event: dict[str, Any] = {
            "id": self.rid,
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }
        if usage is not None:
            event["usage"] = usage_dict(usage)
        return sse(event)

    def _choice(self, delta: dict[str, Any], text: str, finish: str | None) -> dict[str, Any]:
        if self.chat:
            return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}

    def opening(self) -> bytes | None:
        """Chat streams start with the assistant role and empty content; completions do not."""
        if not self.chat:
            return None
        return self._event([self._choice({"role": "assistant", "content": ""}, "", None)])

    def token(self, text: str) -> bytes:
        """One output token."""
        return self._event([self._choice({"content": text}, text, None)])

    def finish(self, reason: str) -> bytes:
        """The chunk that carries the finish reason (no more text)."""
        return self._event([self._choice({}, "", reason)])

    def usage(self, usage: Usage) -> bytes:
        """The final usage chunk: no choices, only `usage`."""
        return self._event([], usage)
