"""How the gateway's own failures reach clients: OpenAI-style JSON errors with proper statuses.

Each failure has a reason (the `reason` label of `cacheroute_gateway_errors_total`), an HTTP
status, an OpenAI error `type` and a `code`, so clients' SDKs raise the exception they would raise
against OpenAI (400 -> BadRequestError, 413, 502/503 -> retryable server errors). Errors that a
backend itself returns (a 4xx from vLLM) are passed through unchanged instead.
"""

from __future__ import annotations

from dataclasses import dataclass

from cacheroute.openai_api import error_body

__all__ = ["ERRORS", "ErrorKind", "error_payload"]


@dataclass(frozen=True, slots=True)
class ErrorKind:
    """Status, OpenAI error type and code of one failure reason."""

    status: int
    type: str
    code: str


ERRORS: dict[str, ErrorKind] = {
    "bad_json": ErrorKind(400, "invalid_request_error", "invalid_json"),
    "bad_body": ErrorKind(400, "invalid_request_error", "invalid_body"),
    "missing_model": ErrorKind(400, "invalid_request_error", "model_required"),
    "too_large": ErrorKind(413, "invalid_request_error", "request_too_large"),
    "not_found": ErrorKind(404, "invalid_request_error", "unknown_url"),
    "method": ErrorKind(405, "invalid_request_error", "method_not_allowed"),
    "no_backend": ErrorKind(503, "service_unavailable", "no_backend_available"),
    "upstream": ErrorKind(502, "upstream_error", "upstream_failure"),
    "internal": ErrorKind(500, "server_error", "internal_error"),
}
"""Every reason the gateway answers with its own error."""


def error_payload(reason: str, message: str) -> tuple[int, bytes]:
    """(HTTP status, JSON body) for `reason` (unknown reasons count as `internal`)."""
    kind = ERRORS.get(reason, ERRORS["internal"])
    return kind.status, error_body(message, kind.type, kind.code)
