"""Gateway failures reach clients as OpenAI-style errors with the right status."""

from __future__ import annotations

import orjson
import pytest

from cacheroute.gateway.errors import ERRORS, error_payload


@pytest.mark.parametrize(
    ("reason", "status", "code"),
    [
        ("bad_json", 400, "invalid_json"),
        ("bad_body", 400, "invalid_body"),
        ("missing_model", 400, "model_required"),
        ("too_large", 413, "request_too_large"),
        ("not_found", 404, "unknown_url"),
        ("method", 405, "method_not_allowed"),
        ("no_backend", 503, "no_backend_available"),
        ("upstream", 502, "upstream_failure"),
        ("internal", 500, "internal_error"),
        ("never-heard-of-it", 500, "internal_error"),
    ],
)
def test_error_payload(reason: str, status: int, code: str) -> None:
    got_status, body = error_payload(reason, "what happened")
    assert got_status == status
    error = orjson.loads(body)["error"]
    assert error["message"] == "what happened"
    assert error["code"] == code
    assert set(error) == {"message", "type", "param", "code"}
    if status < 500:
        assert error["type"] == "invalid_request_error"


def test_every_reason_is_a_client_or_server_error() -> None:
    assert all(400 <= kind.status < 600 for kind in ERRORS.values())
