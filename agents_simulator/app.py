"""``create_app(config)``: the whole simulator as one Starlette app on one port."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from agents_simulator import admin, api, executor, sandbox_admin
from agents_simulator.config import SimulatorConfig
from agents_simulator.engine import Simulator
from agents_simulator.errors import ApiError
from agents_simulator.http import error_response
from controller.clock import Clock


def create_app(config: SimulatorConfig, clock: Clock | None = None) -> Starlette:
    """The simulator's ASGI app; ``app.state.simulator`` is its engine (for in-process use)."""
    sim = Simulator(config, clock)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await sim.start()
        try:
            yield
        finally:
            await sim.close()

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def api_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ApiError)
        return error_response(exc)

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        return error_response(ApiError(exc.status_code, str(exc.detail)))

    routes: list[BaseRoute] = [Route("/healthz", healthz, methods=["GET"])]
    routes += [*api.routes(sim), *executor.routes(sim), *admin.routes(sim), *sandbox_admin.routes(sim)]
    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={ApiError: api_error, HTTPException: http_error},
    )
    app.state.simulator = sim
    return app
