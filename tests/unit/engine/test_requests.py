"""The engine stand-in refuses what OpenAI's API refuses (the gateway passes bodies through)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from cacheroute.engine.config import EngineConfig
from cacheroute.engine.server import Engine, _BadRequestError

MODEL = EngineConfig().model


def parse(body: dict[str, Any], *, chat: bool) -> tuple[int, str] | None:
    """(status, code) of the refusal, or None when the engine takes the request."""
    try:
        Engine(EngineConfig())._parse(orjson.dumps(body), chat=chat)
    except _BadRequestError as exc:
        return exc.status, exc.code
    return None


@pytest.mark.parametrize(
    ("messages", "refused"),
    [
        ([{"role": "user", "content": "hi"}], False),
        (
            [{"role": "system", "content": "s"}, {"role": "user", "content": [{"type": "text"}]}],
            False,
        ),
        ([{"role": "assistant", "content": None}], False),  # tool calls carry no content
        ("hi", True),
        ([], True),
        ({"role": "user", "content": "hi"}, True),
        ([{"content": "no role"}], True),
        ([{"role": 7, "content": "hi"}], True),
        (["hi"], True),
        (None, True),
    ],
)
def test_chat_messages_must_be_a_non_empty_list_of_objects_with_a_role(
    messages: object, refused: bool
) -> None:
    got = parse({"model": MODEL, "messages": messages}, chat=True)
    assert got == ((400, "invalid_messages") if refused else None)


@pytest.mark.parametrize(
    ("prompt", "refused"),
    [
        ("text", False),
        ("", False),
        (["a", "b"], False),
        ([1, 2, 3], False),
        ([[1, 2], [3]], False),
        (None, True),
        ([], True),
        ([[]], True),
        ({"text": "x"}, True),
        (["a", 1], True),
        ([True, False], True),  # JSON booleans are not token ids
        ([-1], True),
        (3, True),
    ],
)
def test_a_completion_needs_a_prompt_of_a_shape_openai_accepts(
    prompt: object, refused: bool
) -> None:
    body = {"model": MODEL} if prompt is None else {"model": MODEL, "prompt": prompt}
    got = parse(body, chat=False)
    assert got == ((400, "invalid_prompt") if refused else None)


@pytest.mark.parametrize(
    ("stream", "refused"), [(True, False), (False, False), ("yes", True), (1, True)]
)
def test_stream_must_be_a_boolean(stream: object, refused: bool) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    assert parse(body, chat=True) == ((400, "invalid_stream") if refused else None)


def test_an_unknown_model_is_a_404_before_the_prompt_is_judged() -> None:
    assert parse({"model": "other", "messages": []}, chat=True) == (404, "model_not_found")
