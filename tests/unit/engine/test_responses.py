"""The engine stand-in answers in OpenAI's shapes, with usage as vLLM reports it."""

from __future__ import annotations

from typing import Any

import orjson

from cacheroute.engine.config import EngineConfig
from cacheroute.engine.responses import DONE, Framer, output_token


def events(data: bytes) -> list[Any]:
    assert data.startswith(b"data: ")
    assert data.endswith(b"\n\n")
    return [orjson.loads(e[6:]) for e in data.split(b"\n\n") if e]


def test_whole_chat_and_completion() -> None:
    chat = orjson.loads(Framer(True, "ab12", 1700, "m").whole(" t0 t1", "length", (40, 2, 32)))
    assert chat["id"] == "chatcmpl-ab12"
    assert chat["object"] == "chat.completion"
    assert chat["choices"][0]["message"] == {"role": "assistant", "content": " t0 t1"}
    assert chat["usage"] == {
        "prompt_tokens": 40,
        "total_tokens": 42,
        "completion_tokens": 2,
        "prompt_tokens_details": {"cached_tokens": 32},
    }
    text = orjson.loads(Framer(False, "ab12", 1700, "m").whole(" t0", "length", (4, 1, 0)))
    assert text["id"] == "cmpl-ab12"
    assert text["object"] == "text_completion"
    assert text["choices"][0]["text"] == " t0"


def test_chat_stream_events() -> None:
    f = Framer(True, "x", 1, "m")
    opening = f.opening()
    assert opening is not None
    (first,) = events(opening)
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    (tok,) = events(f.token(output_token(3)))
    assert tok["choices"][0]["delta"] == {"content": " t3"}
    (end,) = events(f.finish("length"))
    assert end["choices"][0]["finish_reason"] == "length"
    (usage,) = events(f.usage((10, 3, 0)))
    assert usage["choices"] == []
    assert usage["usage"]["completion_tokens"] == 3
    assert DONE == b"data: [DONE]\n\n"


def test_completion_stream_has_no_opening() -> None:
    f = Framer(False, "x", 1, "m")
    assert f.opening() is None
    (tok,) = events(f.token(" t0"))
    assert tok["choices"][0]["text"] == " t0"


def test_timing_model() -> None:
    cfg = EngineConfig(prefill_us_per_token=40.0, decode_ms=8.0)
    assert cfg.prefill_s(1000) == 0.04  # 1000 uncached tokens x 40 us
    assert cfg.decode_s() == 0.008
    fast = EngineConfig(zero_delay=True)
    assert fast.prefill_s(10**6) == 0.0
    assert fast.decode_s() == 0.0
