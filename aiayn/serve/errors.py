"""Errors in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}`` with an HTTP status."""

from __future__ import annotations

from typing import Any

__all__ = ["APIError", "ModelFailure", "bad_field", "error_body"]


def error_body(message: str, type: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


class APIError(Exception):
    """An error a client gets: ``status`` (400, 404, 413, 429, 500, 503) and OpenAI's error object."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error", param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.param, self.code)


def bad_field(param: str, value: object, rule: str) -> APIError:
    """A 400 naming the field, its value and the rule it broke."""
    return APIError(400, f"{param}={value!r} {rule}", param=param, code="invalid_value")


def ModelFailure(error: BaseException) -> APIError:
    """The model raised while working on a request: a 500 that says what it raised."""
    return APIError(500, f"the model failed on this request: {type(error).__name__}: {error}", type="server_error", code="model_error")
