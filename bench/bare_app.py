"""The baseline for the receiver benchmark: a bare Starlette app on the same uvicorn settings,
whose POST /webhooks reads the body and answers 200 JSON — no verification, no Redis."""

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route


async def webhooks(request: Request) -> JSONResponse:
    await request.body()
    return JSONResponse({"status": "ok"})


app = Starlette(routes=[Route("/webhooks", webhooks, methods=["POST"])])
