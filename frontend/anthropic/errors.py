"""Anthropic's error shape, {"type": "error", "error": {"type", "message"}}, for every
refusal of the Messages routes: the HTTP layer's refusals (frontend/openai/errors.py's
ApiError, raised by the shared body reader and the chat path) are rewritten into it."""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse

from folio.frontend.openai.errors import ApiError

# Anthropic's error types by HTTP status (its API reference's "Errors" page).
_TYPES = {400: "invalid_request_error", 401: "authentication_error",
          403: "permission_error", 404: "not_found_error", 408: "timeout_error",
          413: "request_too_large", 429: "rate_limit_error", 503: "overloaded_error"}
PATH_PREFIX = "/v1/messages"   # the routes whose refusals take this shape


def error_body(status: int, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": _TYPES.get(status, "api_error"),
                                       "message": message}}


def error_response(error: ApiError) -> JSONResponse:
    headers = {"Retry-After": "1"} if error.status == 503 else None
    return JSONResponse(error_body(error.status, error.message), status_code=error.status,
                        headers=headers)


def from_openai(error: dict[str, Any]) -> dict[str, Any]:
    """A chat stream's error event ({"error": {...}}, with its code) in Anthropic's shape."""
    status = {"queue_full": 503, "engine_unavailable": 503, "shutting_down": 503,
              "request_timeout": 408, "slow_reader": 429}.get(error.get("code"), 500)
    return error_body(status, error["message"])
