"""Small HTTP helpers shared by the simulator's route modules."""

from __future__ import annotations

import hmac
import json
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse

from agents_simulator.errors import ApiError, bad_request, unauthorized


async def json_body(request: Request, *, optional: bool = False) -> Any:
    raw = await request.body()
    if not raw.strip():
        if optional:
            return {}
        raise bad_request("The request body must be JSON.")
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise bad_request("The request body is not valid JSON.") from exc


def bearer_token(request: Request) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, if well formed."""
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return None
    return token


def require_api_key(request: Request, api_key: str | None) -> None:
    """Any non-empty bearer token, or exactly ``api_key`` when one is configured."""
    token = bearer_token(request)
    if token is None:
        raise ApiError(
            401,
            "You didn't provide an API key. Use 'Authorization: Bearer YOUR_KEY'.",
            code="missing_api_key",
        )
    if api_key is not None and not hmac.compare_digest(token.encode(), api_key.encode()):
        raise unauthorized()


def error_response(error: ApiError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers)
