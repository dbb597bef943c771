"""The ceiling of the receiver benchmarks: a bare Starlette app whose POST /webhooks reads the
body and answers 200 JSON — no verification, no Redis, no log line. ``bench/receiver_fastpath.py``
runs it as anyone would (``uvicorn bare_app:app``: uvicorn's defaults, httptools and uvloop when
installed, as ``uvicorn[standard]`` installs them), and also on ``serve``'s server settings
(``bench/serve_app.py``: those of now, or with ``h11`` those before issue 21) to show what
those settings cost."""

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route


async def webhooks(request: Request) -> JSONResponse:
    await request.body()
    return JSONResponse({"status": "ok"})


app = Starlette(routes=[Route("/webhooks", webhooks, methods=["POST"])])
