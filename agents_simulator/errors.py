"""API errors in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``."""

from __future__ import annotations

from typing import Any


class ApiError(Exception):
    """An answer other than success; messages carry ids, never keys or secrets."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.code = code
        self.param = param
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad_request(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, code="invalid_value" if param else None, param=param)


def not_found(kind: str, object_id: str) -> ApiError:
    return ApiError(404, f"No {kind} found with id '{object_id}'.", code="not_found")


def unauthorized() -> ApiError:
    return ApiError(
        401,
        "Incorrect API key provided.",
        code="invalid_api_key",
    )


def injected(status: int, retry_after: float | None) -> ApiError:
    """A fault armed through ``/admin/faults``."""
    headers = {"retry-after": _seconds(retry_after)} if retry_after is not None else {}
    if status == 429:
        return ApiError(
            429,
            "Rate limit reached (injected).",
            type="rate_limit_exceeded",
            code="rate_limit_exceeded",
            headers=headers,
        )
    if status >= 500:
        return ApiError(status, "The server had an error (injected).", type="server_error", headers=headers)
    return ApiError(status, "Request failed (injected).", headers=headers)


def _seconds(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)
