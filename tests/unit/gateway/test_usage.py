"""Reading what the backend served: usage of whole responses and of SSE streams."""

from __future__ import annotations

import random

import orjson
import pytest

from cacheroute.gateway.usage import SseUsageScanner, Usage, usage_from_body, usage_from_obj

VLLM_USAGE = {
    "prompt_tokens": 1834,
    "total_tokens": 1850,
    "completion_tokens": 16,
    "prompt_tokens_details": {"cached_tokens": 1536},
}


def event(obj: object) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def stream(*, with_usage: bool, crlf: bool = False) -> bytes:
    chunks = [
        event({"id": "x", "choices": [{"delta": {"role": "assistant"}}], "usage": None}),
        event({"id": "x", "choices": [{"delta": {"content": "the usage is"}}], "usage": None}),
        event({"id": "x", "choices": [{"delta": {}, "finish_reason": "length"}]}),
    ]
    if with_usage:
        chunks.append(event({"id": "x", "choices": [], "usage": VLLM_USAGE}))
    chunks.append(b"data: [DONE]\n\n")
    data = b"".join(chunks)
    return data.replace(b"\n", b"\r\n") if crlf else data


def test_whole_body_usage() -> None:
    body = orjson.dumps({"id": "x", "choices": [], "usage": VLLM_USAGE})
    assert usage_from_body(body) == Usage(1834, 16, 1536)
    no_details = orjson.dumps({"usage": {"prompt_tokens": 7, "completion_tokens": 1}})
    assert usage_from_body(no_details) == Usage(7, 1, None)
    assert usage_from_body(b'{"choices": []}') is None
    assert usage_from_body(b'{"usage": {broken') is None
    assert usage_from_body(b'["usage": {}]') is None


def test_usage_fields_must_be_counts() -> None:
    assert usage_from_obj(
        {"prompt_tokens": -1, "prompt_tokens_details": {"cached_tokens": True}}
    ) == (Usage(None, None, None))
    assert usage_from_obj(None) is None
    assert usage_from_obj({"prompt_tokens": 3, "prompt_tokens_details": None}) == Usage(
        3, None, None
    )


@pytest.mark.parametrize("crlf", [False, True])
def test_stream_usage_whatever_the_chunking(crlf: bool) -> None:
    data = stream(with_usage=True, crlf=crlf)
    rng = random.Random(5)
    splits = [[data], [data[i : i + 1] for i in range(len(data))]]
    for _ in range(20):
        cuts = sorted(rng.sample(range(1, len(data)), 6))
        splits.append([data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)])
    for chunks in splits:
        scanner = SseUsageScanner()
        for c in chunks:
            scanner.feed(c)
        assert scanner.close() == Usage(1834, 16, 1536)


def test_stream_without_usage_chunk() -> None:
    scanner = SseUsageScanner()
    scanner.feed(stream(with_usage=False))
    assert scanner.close() is None


def test_unterminated_last_line_is_read_at_close() -> None:
    scanner = SseUsageScanner()
    scanner.feed(b'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":2}}')
    assert scanner.usage is None
    assert scanner.close() == Usage(5, 2, None)


def test_garbage_streams_never_raise() -> None:
    scanner = SseUsageScanner()
    for junk in (b'data: {"usage": {oops\n\n', b"\xff\xfe\n", b'event: x\ndata: "usage": {}\n\n'):
        scanner.feed(junk)
    assert scanner.close() is None
