"""The executor side: ``/cloud/environment/{id}/register``, ``/validate`` and the WebSocket.

``codex exec-server`` registers with the environment key as a bearer token, then opens the
returned ``ws://`` URL and waits for the server to speak first. The simulator never speaks:
it holds the connection open (the server answers the executor's pings) and reports the
environment ``connected`` while at least one such WebSocket is open.
"""

from __future__ import annotations

import contextlib

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from agents_simulator.engine import Simulator
from agents_simulator.errors import injected
from agents_simulator.http import bearer_token, json_body

CLOSE_GOING_AWAY = 1001
CLOSE_POLICY_VIOLATION = 1008
CLOSE_SERVICE_RESTART = 1012  # uvicorn closes open WebSockets with it on shutdown


def routes(sim: Simulator) -> list[BaseRoute]:
    async def register(request: Request) -> Response:
        body = await json_body(request, optional=True)
        answer = sim.register(request.path_params["environment_id"], bearer_token(request), body)
        return JSONResponse(answer)

    async def validate(request: Request) -> Response:
        fault = sim.faults.take("validate")
        if fault is not None:
            raise injected(fault.status, fault.retry_after)
        sim.environment(request.path_params["environment_id"])
        return JSONResponse({"valid": True})

    async def connect(websocket: WebSocket) -> None:
        environment_id = websocket.path_params["environment_id"]
        if not sim.token_valid(environment_id, websocket.query_params.get("token", "")):
            # Closing before accepting answers the upgrade with 403; codex then registers again.
            await websocket.close(CLOSE_POLICY_VIOLATION)
            return
        await websocket.accept()

        async def close() -> None:
            with contextlib.suppress(Exception):
                await websocket.close(CLOSE_GOING_AWAY)

        connection = sim.executor_connected(environment_id, close)
        server_stopping = False
        try:
            while True:
                message = await websocket.receive()
                if message["type"] == "websocket.disconnect":
                    server_stopping = message.get("code") == CLOSE_SERVICE_RESTART
                    break
        except (WebSocketDisconnect, RuntimeError):
            pass
        finally:
            sim.executor_disconnected(environment_id, connection, server_stopping=server_stopping)

    return [
        Route("/cloud/environment/{environment_id}/register", register, methods=["POST"]),
        Route("/cloud/environment/{environment_id}/validate", validate, methods=["POST"]),
        WebSocketRoute("/cloud/environment/{environment_id}/connect", connect),
    ]
