"""What a backend says it served: `usage` from whole responses and from SSE streams.

vLLM (with --enable-prompt-tokens-details) and SGLang (with --enable-cache-report) report the
prompt tokens they found in their prefix cache as `usage.prompt_tokens_details.cached_tokens`;
that is the served hit the gateway puts into its events. A streamed response carries `usage`
only when the client asked (`stream_options: {"include_usage": true}`), in the last chunk before
`data: [DONE]`; the gateway does not change the client's request, it only reads that chunk if it
is there. The stream scanner is built for the relay loop: per chunk it costs one regex search over
the bytes, and JSON is parsed only for events that contain a `"usage": {` object.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import orjson

__all__ = ["SseUsageScanner", "Usage", "usage_from_body", "usage_from_obj"]

_USAGE = re.compile(rb'"usage"\s*:\s*\{')
_MAX_LINE = 16 * 1024 * 1024
"""Longer unfinished SSE lines are dropped (and their usage lost) instead of buffered."""


@dataclass(frozen=True, slots=True)
class Usage:
    """Token counts a backend reported (None: it did not say)."""

    prompt_tokens: int | None
    completion_tokens: int | None
    cached_tokens: int | None


def _count(value: object) -> int | None:
    return value if type(value) is int and value >= 0 else None


def usage_from_obj(usage: object) -> Usage | None:
    """A `usage` JSON object -> Usage (None when it is not an object)."""
    if not isinstance(usage, dict):
        return None
    details = usage.get("prompt_tokens_details")
    cached = _count(details.get("cached_tokens")) if isinstance(details, dict) else None
    return Usage(_count(usage.get("prompt_tokens")), _count(usage.get("completion_tokens")), cached)


def usage_from_body(raw: bytes) -> Usage | None:
    """The usage of a whole (non-streamed) JSON response body, if it has one."""
    if not _USAGE.search(raw):
        return None
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    return usage_from_obj(obj.get("usage")) if isinstance(obj, dict) else None


class SseUsageScanner:
    """Feed it the bytes of an SSE stream as they pass; `.usage` is the last usage seen.

    Chunks may split events and lines anywhere; only the unfinished last line is kept.
    """

    __slots__ = ("_tail", "usage")

    def __init__(self) -> None:
        self._tail = b""
        self.usage: Usage | None = None

    def feed(self, chunk: bytes) -> None:
        """Scan one chunk of the stream."""
        data = self._tail + chunk if self._tail else chunk
        if _USAGE.search(data) is None:
            cut = data.rfind(b"\n")
            self._tail = data[cut + 1 :] if cut >= 0 else data
        else:
            *lines, self._tail = data.split(b"\n")
            for line in lines:
                self._line(line)
        if len(self._tail) > _MAX_LINE:
            self._tail = b""

    def close(self) -> Usage | None:
        """The stream ended: scan an unterminated last line too; returns `.usage`."""
        if self._tail:
            self._line(self._tail)
            self._tail = b""
        return self.usage

    def _line(self, line: bytes) -> None:
        if not line.startswith(b"data:") or _USAGE.search(line) is None:
            return
        try:
            obj = orjson.loads(line[5:].strip())
        except orjson.JSONDecodeError:
            return
        if isinstance(obj, dict):
            found = usage_from_obj(obj.get("usage"))
            if found is not None:
                self.usage = found
