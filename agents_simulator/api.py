"""The public ``/v1`` routes: sessions, session events, environments, webhook endpoints."""

from __future__ import annotations

import asyncio

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from agents_simulator import endpoints
from agents_simulator.engine import Simulator
from agents_simulator.errors import bad_request, injected
from agents_simulator.http import json_body, require_api_key
from agents_simulator.state import SimSession, deleted_json, environment_info_json


def routes(sim: Simulator) -> list[Route]:
    async def guard(request: Request, target: str, object_id: str | None = None) -> None:
        """Authenticate, then apply an armed fault: an error answer, or a held one (timeout)."""
        require_api_key(request, sim.config.api_key)
        fault = sim.faults.take(target, object_id)
        if fault is None:
            return
        if fault.kind == "timeout":
            client = f"{request.client.host}:{request.client.port}" if request.client else ""
            held = sim.faults.holding(target, object_id, client)
            try:
                await asyncio.sleep(fault.hold_seconds)  # then answer as usual: the client gave up by now
            finally:
                sim.faults.release(held)
            return
        raise injected(fault.status, fault.retry_after)

    async def sessions(request: Request) -> Response:
        if request.method == "POST":
            await guard(request, "create_session")
            session = sim.create_session(await json_body(request))
            return JSONResponse(sim.view(session))
        await guard(request, "list_sessions")
        return JSONResponse(_page(sim, request))

    async def session(request: Request) -> Response:
        session_id = request.path_params["session_id"]
        if request.method == "DELETE":
            await guard(request, "delete_session", session_id)
            await sim.delete_session(session_id)
            return JSONResponse(deleted_json(session_id))
        await guard(request, "retrieve_session", session_id)
        return JSONResponse(sim.view(sim.get(session_id)))

    async def events(request: Request) -> Response:
        await guard(request, "create_events", request.path_params["session_id"])
        body = await json_body(request)
        sim.submit_events(request.path_params["session_id"], body, request.headers.get("idempotency-key"))
        return Response(status_code=202)

    async def environment(request: Request) -> Response:
        await guard(request, "retrieve_environment", request.path_params["environment_id"])
        return JSONResponse(environment_info_json(sim.environment(request.path_params["environment_id"])))

    return [
        *endpoints.routes(sim.endpoints, guard, sim.config.webhook_timeout_seconds),
        Route("/v1/agents/sessions", sessions, methods=["GET", "POST"]),
        Route("/v1/agents/sessions/{session_id}", session, methods=["GET", "DELETE"]),
        Route("/v1/agents/sessions/{session_id}/events", events, methods=["POST"]),
        Route("/v1/agents/environments/{environment_id}", environment, methods=["GET"]),
    ]


def _page(sim: Simulator, request: Request) -> dict[str, object]:
    """One page of ``GET /v1/agents/sessions`` in OpenAI's cursor-list envelope."""
    query = request.query_params
    try:
        limit = int(query.get("limit", "20"))
    except ValueError as exc:
        raise bad_request("'limit' must be an integer.", "limit") from exc
    if not 1 <= limit <= 100:
        raise bad_request("'limit' must be between 1 and 100.", "limit")
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise bad_request("'order' must be 'asc' or 'desc'.", "order")
    wanted = {
        key[len("metadata[") : -1]: value
        for key, value in query.items()
        if key.startswith("metadata[") and key.endswith("]")
    }
    agent_id = query.get("agent_id")

    def keep(session: SimSession) -> bool:
        if agent_id and session.agent.get("id") != agent_id:
            return False
        return all(session.metadata.get(k) == v for k, v in wanted.items())

    ordered = [s for s in sim.sessions.values() if keep(s)]  # dicts keep creation order
    if order == "desc":
        ordered.reverse()
    after = query.get("after")
    if after:
        ids = [s.id for s in ordered]
        ordered = ordered[ids.index(after) + 1 :] if after in ids else []
    page = ordered[:limit]
    data = [sim.view(s) for s in page]
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": len(ordered) > limit,
    }
