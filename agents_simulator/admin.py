"""``/admin/...``: what a test or a developer needs to look inside and break things.

Unauthenticated on purpose: the simulator is meant for loopback. See the package
docstring for the list of endpoints.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from agents_simulator.engine import Simulator
from agents_simulator.errors import ApiError, bad_request, not_found
from agents_simulator.faults import DEFAULT_HOLD_SECONDS
from agents_simulator.http import json_body
from agents_simulator.state import environment_info_json, link_json, session_summary


def routes(sim: Simulator) -> list[Route]:
    async def registrations(request: Request) -> Response:
        wanted = request.query_params.get("environment_id")
        return _listing(r.to_json() for r in sim.registrations if not wanted or r.environment_id == wanted)

    async def deliveries(request: Request) -> Response:
        event_id = request.query_params.get("event_id")
        event_type = request.query_params.get("type")
        return _listing(
            d.to_json()
            for d in sim.webhooks.deliveries
            if (not event_id or d.event_id == event_id) and (not event_type or d.event_type == event_type)
        )

    async def events(request: Request) -> Response:
        return _listing(e.to_json() for e in sim.webhooks.events.values())

    async def resend(request: Request) -> Response:
        event_id = request.path_params["event_id"]
        started = sim.webhooks.resend(event_id)
        if started is None:
            raise not_found("event", event_id)
        return JSONResponse({"event_id": event_id, "deliveries": [d.to_json() for d in started]}, status_code=202)

    async def faults(request: Request) -> Response:
        if request.method == "DELETE":
            sim.faults.clear()
        elif request.method == "POST":
            body = await json_body(request)
            try:
                sim.faults.arm(
                    target=str(body.get("target", "")),
                    status=int(body.get("status", 500)),
                    count=_optional_int(body.get("count")),
                    retry_after=_optional_float(body.get("retry_after")),
                    seconds=_optional_float(body.get("seconds")),
                    kind=str(body.get("kind", "status")),
                    hold_seconds=float(body.get("hold_seconds", DEFAULT_HOLD_SECONDS)),
                    object_id=_optional_str(body.get("object_id")),
                )
            except (TypeError, ValueError, AttributeError) as exc:
                raise bad_request(str(exc)) from exc
        return _listing(sim.faults.to_json())

    async def held(request: Request) -> Response:
        return _listing(h.to_json() for h in sim.faults.held)

    async def hold(request: Request) -> Response:
        body = await json_body(request)
        try:
            until = sim.webhooks.hold(
                float(body.get("seconds", 0)), str(body.get("order", "fifo")), _optional_int(body.get("seed"))
            )
        except (TypeError, ValueError, AttributeError) as exc:
            raise bad_request(str(exc)) from exc
        return JSONResponse({"until": until, "order": body.get("order", "fifo")})

    async def sessions(request: Request) -> Response:
        return _listing(session_summary(s) for s in sim.sessions.values())

    async def history(request: Request) -> Response:
        session = sim.get(request.path_params["session_id"])
        return _listing(
            {"at": at, "status": status, "wants_connection": wants} for at, status, wants in session.history
        )

    async def fail(request: Request) -> Response:
        body = await json_body(request, optional=True)
        error = body.get("error") if isinstance(body, dict) else None
        session = sim.fail_session(
            request.path_params["session_id"], str(error or "Failed by the simulator's admin API.")
        )
        return JSONResponse(sim.view(session))

    async def remote_url(request: Request) -> Response:
        body = await json_body(request)
        url = body.get("remote_url") if isinstance(body, dict) else None
        if not isinstance(url, str) or not url:
            raise bad_request("'remote_url' must be a non-empty string")
        return JSONResponse(sim.view(sim.point_session(request.path_params["session_id"], url)))

    async def environments(request: Request) -> Response:
        return _listing(
            {
                **environment_info_json(e),
                "session_id": e.session_id,
                "deleted": e.deleted,
                **link_json(e, sim.open_connections(e.id)),
            }
            for e in sim.environments.values()
        )

    async def disconnect(request: Request) -> Response:
        environment = sim.environment(request.path_params["environment_id"])
        return JSONResponse(
            {"environment_id": environment.id, "closed": await sim.disconnect_environment(environment.id)}
        )

    async def drop(request: Request) -> Response:
        environment = sim.environment(request.path_params["environment_id"])
        body = await json_body(request)
        try:
            seconds = float(body.get("seconds", 0))
        except (TypeError, ValueError, AttributeError) as exc:
            raise bad_request("'seconds' must be a number") from exc
        if not 0 < seconds <= 3600:
            raise bad_request("'seconds' must be between 0 and 3600", "seconds")
        closed = await sim.drop_link(environment.id, seconds)
        return JSONResponse(
            {"environment_id": environment.id, "closed": closed, "until": environment.refuse_upgrades_until}
        )

    return [
        Route("/admin/registrations", registrations, methods=["GET"]),
        Route("/admin/deliveries", deliveries, methods=["GET"]),
        Route("/admin/events", events, methods=["GET"]),
        Route("/admin/webhooks/resend/{event_id}", resend, methods=["POST"]),
        Route("/admin/webhooks/hold", hold, methods=["POST"]),
        Route("/admin/sessions", sessions, methods=["GET"]),
        Route("/admin/sessions/{session_id}/history", history, methods=["GET"]),
        Route("/admin/faults", faults, methods=["GET", "POST", "DELETE"]),
        Route("/admin/held", held, methods=["GET"]),
        Route("/admin/sessions/{session_id}/fail", fail, methods=["POST"]),
        Route("/admin/sessions/{session_id}/remote_url", remote_url, methods=["POST"]),
        Route("/admin/environments", environments, methods=["GET"]),
        Route("/admin/environments/{environment_id}/disconnect", disconnect, methods=["POST"]),
        Route("/admin/environments/{environment_id}/drop", drop, methods=["POST"]),
    ]


def _listing(items: Any) -> JSONResponse:
    return JSONResponse({"object": "list", "data": list(items)})


def _optional_int(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"{value!r} is not an integer")
    return int(value)


def _optional_str(value: Any) -> str | None:
    return None if value is None else str(value)


def _optional_float(value: Any) -> float | None:
    if value is None:
        return None
    number = float(value)
    if number < 0:
        raise ApiError(400, "'retry_after' must not be negative.")
    return number
