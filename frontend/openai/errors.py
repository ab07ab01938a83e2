"""The HTTP API's one error: OpenAI's envelope {"error": {"message", "type", "param",
"code"}} with its status. A leaf module: every part of the HTTP layer raises these, and
none of them needs another to do so."""

from __future__ import annotations

from typing import Any


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None,
                 code: str | None = None, error_type: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = error_type or {400: "invalid_request_error", 401: "authentication_error",
                                   404: "not_found_error", 503: "service_unavailable"
                                   }.get(status, "server_error")

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}


def invalid(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, param, "invalid_value" if param else None)


def too_long(message: str, param: str) -> ApiError:
    """OpenAI's one code for a prompt, or prompt + max_tokens, over the context length."""
    return ApiError(400, message, param, "context_length_exceeded")
