"""The executor side: ``/cloud/environment/{id}/register``, ``/validate`` and the WebSocket.

``codex exec-server`` registers with the environment key as a bearer token, then opens the
returned ``ws://`` URL and waits for the server to speak first. The simulator reports the
environment ``connected`` while at least one such WebSocket is open, and acts as the harness
on it (``harness.py``): binary frames go to the link, which opens streams when a turn runs
commands. ``/validate`` answers ``{"valid": true}`` only for a handshake that presents the
harness key and an authorization the simulator issued for that executor registration.
"""

from __future__ import annotations

import contextlib

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from agents_simulator.engine import Simulator
from agents_simulator.errors import injected, unauthorized
from agents_simulator.http import bearer_token, json_body

CLOSE_GOING_AWAY = 1001
CLOSE_POLICY_VIOLATION = 1008
CLOSE_SERVICE_RESTART = 1012  # uvicorn closes open WebSockets with it on shutdown


def routes(sim: Simulator) -> list[BaseRoute]:
    async def register(request: Request) -> Response:
        body = await json_body(request, optional=True)
        answer = sim.register(request.path_params["environment_id"], bearer_token(request), body, request.url.scheme)
        return JSONResponse(answer)

    async def validate(request: Request) -> Response:
        fault = sim.faults.take("validate")
        if fault is not None:
            raise injected(fault.status, fault.retry_after)
        environment_id = request.path_params["environment_id"]
        sim.environment(environment_id)
        if not sim.environment_key_valid(bearer_token(request)):
            raise unauthorized()
        body = await json_body(request, optional=True)
        return JSONResponse({"valid": sim.harness.validate(environment_id, body)})

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

        link = sim.harness.attach(environment_id, websocket.query_params.get("token", ""), websocket.send_bytes)
        connection = sim.executor_connected(environment_id, close)
        server_stopping = False
        try:
            while True:
                message = await websocket.receive()
                if message["type"] == "websocket.disconnect":
                    server_stopping = message.get("code") == CLOSE_SERVICE_RESTART
                    break
                data = message.get("bytes")
                if link is not None and data:
                    await link.on_bytes(data)
        except (WebSocketDisconnect, RuntimeError):
            pass
        finally:
            if link is not None:
                sim.harness.detach(link)
            sim.executor_disconnected(environment_id, connection, server_stopping=server_stopping)

    return [
        Route("/cloud/environment/{environment_id}/register", register, methods=["POST"]),
        Route("/cloud/environment/{environment_id}/validate", validate, methods=["POST"]),
        WebSocketRoute("/cloud/environment/{environment_id}/connect", connect),
    ]
