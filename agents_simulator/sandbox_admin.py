"""``/admin/...`` routes for work in sandboxes: scripted turns with commands, direct commands,
the harness's key validations.

    POST /admin/sessions/{id}/turns  {"commands": [{"argv", "cwd"?, "env"?, "timeout_seconds"?, "sandbox"?}]}
         input whose turn runs the commands in the session's sandbox → 202 the turn
    GET  /admin/sessions/{id}/turns                 every scripted turn with its command results
    POST /admin/environments/{id}/exec  {"argv", "cwd"?, "env"?, "timeout_seconds"?, "sandbox"?, "new_stream"?}
         run one command now, outside any turn (on a new stream when asked) → the result
    GET  /admin/validations                         every /validate call and the verdict
    GET  /admin/links[?environment_id=]             open executor links: streams, frames, records
    POST /admin/harness/impostor  {"count"}         the next ``count`` handshakes present a harness
                                                    key the API never published (they are refused)
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from agents_simulator.commands import parse_command, parse_commands
from agents_simulator.engine import Simulator
from agents_simulator.errors import bad_request
from agents_simulator.http import json_body


def routes(sim: Simulator) -> list[Route]:
    async def turns(request: Request) -> Response:
        session_id = request.path_params["session_id"]
        if request.method == "POST":
            turn = sim.add_turn(session_id, parse_commands(await json_body(request)))
            return JSONResponse(turn.to_json(), status_code=202)
        sim.get(session_id)
        return JSONResponse({"object": "list", "data": [t.to_json() for t in sim.turn_log.of(session_id)]})

    async def execute(request: Request) -> Response:
        environment = sim.environment(request.path_params["environment_id"])
        body = await json_body(request)
        run = await sim.run_command(environment.id, parse_command(body), new_stream=bool(body.get("new_stream")))
        return JSONResponse(run.to_json())

    async def validations(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [v.to_json() for v in sim.harness.validations]})

    async def links(request: Request) -> Response:
        wanted = request.query_params.get("environment_id")
        found = [link.to_json() for link in sim.harness.links() if not wanted or link.executor.environment_id == wanted]
        return JSONResponse({"object": "list", "data": found})

    async def impostor(request: Request) -> Response:
        body = await json_body(request)
        count = body.get("count", 1) if isinstance(body, dict) else None
        if not isinstance(count, int) or count < 0:
            raise bad_request("'count' must be a non-negative integer.", "count")
        sim.harness.impostor_handshakes = count
        return JSONResponse({"impostor_handshakes": count})

    return [
        Route("/admin/sessions/{session_id}/turns", turns, methods=["GET", "POST"]),
        Route("/admin/environments/{environment_id}/exec", execute, methods=["POST"]),
        Route("/admin/validations", validations, methods=["GET"]),
        Route("/admin/links", links, methods=["GET"]),
        Route("/admin/harness/impostor", impostor, methods=["POST"]),
    ]
