"""The simulator's state machine: sessions, environments, executors and their events.

Rules (mirroring the real API as the contract describes it):

* Input on a self-hosted session whose environment has no executor connected puts the
  session in ``requires_action`` with an ``environment_connection`` action, sends
  ``agent.session.action_required``, and starts the connection deadline.
* An executor connecting (its WebSocket open) clears the action and runs the turn:
  ``in_progress`` → (``turn_seconds``) → ``idle``, each with its webhook.
* No executor by the deadline → ``failed`` with an ``error`` and ``agent.session.failed``.
* An executor dropping mid-turn makes the session ask for a connection again; dropping while
  idle only marks the environment ``disconnected``.
* A turn first runs the commands scripted for it (``commands.py``) over the executor's link
  (``harness.py``), then lasts ``turn_seconds``. A command without a usable link fails its
  tool call and the turn goes on; one whose link drops while it runs is ``interrupted`` and
  never started again (the re-run turn starts with the next command).
* Input during a turn is folded into one more turn; ``agent.session.input.cancel`` ends it.
* A failed session is final; deleting a session sends no webhook, closes its executor's
  WebSockets and forgets the environment (so a reconnecting executor re-registers, gets 404
  and exits).

Everything runs on one asyncio loop, so no locks are needed.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from agents_simulator import parse
from agents_simulator.commands import CommandRun, CommandSpec, CommandStatus, Turn, TurnLog, keep
from agents_simulator.config import SimulatorConfig
from agents_simulator.endpoints import Endpoints
from agents_simulator.errors import ApiError, injected, not_found, unauthorized
from agents_simulator.faults import Faults
from agents_simulator.harness import Harness, HarnessError, LinkLost
from agents_simulator.state import (
    EnvironmentStatus,
    Registration,
    SessionStatus,
    SimEnvironment,
    SimSession,
    make_agent,
    new_id,
    session_json,
)
from agents_simulator.webhooks import RetryPolicy, WebhookSender
from controller.clock import Clock, SystemClock

log = logging.getLogger("agents_simulator")
SECURITY_PROFILE = "noise_hybrid_ik_v1"
CLOSE_WAIT_SECONDS = 5.0
CloseConnection = Callable[[], Awaitable[None]]


class Simulator:
    def __init__(self, config: SimulatorConfig, clock: Clock | None = None) -> None:
        self.config = config
        self.clock = clock or SystemClock()
        self.faults = Faults(self.clock)
        self.sessions: dict[str, SimSession] = {}
        self.environments: dict[str, SimEnvironment] = {}
        self.registrations: list[Registration] = []
        self.harness = Harness()
        self.turn_log = TurnLog()
        policy = RetryPolicy(
            initial_seconds=config.webhook_retry_initial_seconds,
            max_seconds=config.webhook_retry_max_seconds,
            horizon_seconds=config.webhook_retry_horizon_seconds,
            max_attempts=config.webhook_max_attempts,
            timeout_seconds=config.webhook_timeout_seconds,
        )
        self.endpoints = Endpoints(self.clock)
        self.webhooks = WebhookSender(
            config.webhook_urls, config.webhook_secret, policy, self.clock, self.endpoints.targets
        )
        self._connections: dict[str, dict[int, CloseConnection]] = {}
        self._turns: dict[str, asyncio.Task[None]] = {}
        self._deadlines: dict[str, asyncio.Task[None]] = {}
        self._next_connection = 0
        self._closing = False

    async def start(self) -> None:
        await self.webhooks.start()

    async def close(self) -> None:
        self._closing = True  # executors dropping now are part of the shutdown, not events
        for task in [*self._turns.values(), *self._deadlines.values()]:
            task.cancel()
        for environment_id in list(self._connections):
            await self.disconnect_environment(environment_id)
        await self.webhooks.close()

    # --- sessions ---------------------------------------------------------------------

    def view(self, session: SimSession) -> dict[str, Any]:
        environment = self.environments.get(session.environment_id or "")
        return session_json(session, environment, session.remote_url or self.config.base_url)

    def get(self, session_id: str) -> SimSession:
        session = self.sessions.get(session_id)
        if session is None:
            raise not_found("session", session_id)
        return session

    def create_session(self, body: Any) -> SimSession:
        request = parse.new_session(body)
        now = self._now()
        environment_id = None
        if request.environment_type != "none":
            environment_id = new_id("env")
            status = EnvironmentStatus.PENDING if request.environment_type == "self_hosted" else EnvironmentStatus.READY
            self.environments[environment_id] = SimEnvironment(
                id=environment_id,
                type=request.environment_type,
                status=status,
                workspace_directory=request.workspace_directory,
                capability_directories=request.capability_directories,
            )
        session = SimSession(
            id=new_id("sess"),
            agent=make_agent(request.agent, request.agent_id),
            environment_type=request.environment_type,
            environment_id=environment_id,
            metadata=request.metadata,
            created_at=now,
            last_active_at=now,
            vault_ids=request.vault_ids,
            review=request.review,
        )
        session.history.append((self.clock.now(), session.status.value, False))
        self.sessions[session.id] = session
        if environment_id is not None:
            self.environments[environment_id].session_id = session.id
        created: dict[str, Any] = {"id": session.id, "environment_type": session.environment_type}
        if environment_id is not None:
            created["environment_id"] = environment_id
        if session.self_hosted:
            created["connect"] = {"remote_url": self.config.base_url}
        self.webhooks.publish("agent.session.created", created)
        if request.has_input:
            self._request_turn(session)
        return session

    def submit_events(self, session_id: str, body: Any, idempotency_key: str | None) -> None:
        session = self.get(session_id)
        events = parse.input_events(body)
        if idempotency_key:
            if idempotency_key in session.idempotency_keys:
                return
            session.idempotency_keys.add(idempotency_key)
        if session.status is SessionStatus.FAILED:
            raise ApiError(409, f"Session '{session_id}' has failed and accepts no input.", code="session_failed")
        for event in events:
            if event["type"] == "agent.session.input.cancel":
                self._cancel(session)
            else:
                self._request_turn(session)

    async def delete_session(self, session_id: str) -> None:
        session = self.get(session_id)
        self._stop_tasks(session.id)
        del self.sessions[session.id]
        self.turn_log.forget(session.id)
        environment = self.environments.get(session.environment_id or "")
        if environment is not None:
            environment.deleted = True
            environment.tokens.clear()
            await self.disconnect_environment(environment.id)

    def point_session(self, session_id: str, remote_url: str) -> SimSession:
        """Make a session name another ``remote_url`` (tests: where would the key go?)."""
        session = self.get(session_id)
        session.remote_url = remote_url
        return session

    def fail_session(self, session_id: str, error: str) -> SimSession:
        session = self.get(session_id)
        if session.status is not SessionStatus.FAILED:
            self._fail(session, error)
        return session

    # --- environments and executors -------------------------------------------------------

    def environment(self, environment_id: str) -> SimEnvironment:
        environment = self.environments.get(environment_id)
        if environment is None or environment.deleted:
            raise not_found("environment", environment_id)
        return environment

    def register(self, environment_id: str, bearer: str | None, body: Any, scheme: str = "http") -> dict[str, Any]:
        """Answer an executor's registration, recording it (without the key) and whether it came
        over TLS (``scheme``: ``https`` on the ``--tls-listen`` listener)."""
        key_matched = bearer is not None and hmac.compare_digest(bearer.encode(), self.config.environment_key.encode())
        environment = self.environments.get(environment_id)
        known = environment is not None and not environment.deleted and environment.type == "self_hosted"
        fault = self.faults.take("register", environment_id)
        error: ApiError | None = None
        if fault is not None:
            error = injected(fault.status, fault.retry_after)
        elif not key_matched:
            error = unauthorized()
        elif not known:
            error = not_found("environment", environment_id)
        profile = body.get("security_profile") if isinstance(body, dict) else None
        registration = Registration(
            id=new_id("exreg"),
            environment_id=environment_id,
            received_at=self.clock.now(),
            key_matched=key_matched,
            environment_known=known,
            status_code=error.status if error else 200,
            security_profile=profile if isinstance(profile, str) else None,
            executor_public_key_present=isinstance(body, dict) and bool(body.get("executor_public_key")),
            scheme=scheme,
        )
        self.registrations.append(registration)
        log.info(
            "registration",
            extra={
                "environment_id": environment_id,
                "key_matched": key_matched,
                "status_code": registration.status_code,
            },
        )
        if error is not None:
            raise error
        assert environment is not None
        token = new_id("wstok")
        environment.tokens.add(token)
        self.harness.registered(environment_id, registration.id, token, body)
        url = f"{self.config.websocket_base_url}/cloud/environment/{environment_id}/connect?token={token}"
        return {
            "environment_id": environment_id,
            "url": url,
            "security_profile": SECURITY_PROFILE,
            "executor_registration_id": registration.id,
        }

    def environment_key_valid(self, bearer: str | None) -> bool:
        return bearer is not None and hmac.compare_digest(bearer.encode(), self.config.environment_key.encode())

    def token_valid(self, environment_id: str, token: str) -> bool:
        environment = self.environments.get(environment_id)
        if environment is None or environment.deleted or not token:
            return False
        return any(hmac.compare_digest(token.encode(), t.encode()) for t in environment.tokens)

    def executor_connected(self, environment_id: str, close: CloseConnection) -> int:
        environment = self.environment(environment_id)
        self._next_connection += 1
        if not self._connections.get(environment_id):
            environment.links.append([self.clock.now(), None])
        self._connections.setdefault(environment_id, {})[self._next_connection] = close
        environment.status = EnvironmentStatus.CONNECTED
        log.info("executor connected", extra={"environment_id": environment_id})
        session = self.sessions.get(environment.session_id or "")
        if session is not None and session.wants_connection and session.status is SessionStatus.REQUIRES_ACTION:
            self._cancel_deadline(session.id)
            if session.pending_inputs:
                self._start_turns(session)
            else:
                self._move(session, SessionStatus.IDLE)
        return self._next_connection

    def executor_disconnected(self, environment_id: str, connection: int, server_stopping: bool = False) -> None:
        """One WebSocket closed; ``server_stopping`` ones change nothing (the simulator is going away)."""
        open_connections = self._connections.get(environment_id, {})
        open_connections.pop(connection, None)
        if open_connections:
            return
        self._connections.pop(environment_id, None)
        environment = self.environments.get(environment_id)
        if environment is not None and environment.links and environment.links[-1][1] is None:
            environment.links[-1][1] = self.clock.now()
        if environment is None or environment.deleted or self._closing or server_stopping:
            return
        environment.status = EnvironmentStatus.DISCONNECTED
        log.info("executor disconnected", extra={"environment_id": environment_id})
        session = self.sessions.get(environment.session_id or "")
        if session is not None and session.status is SessionStatus.IN_PROGRESS:
            self._stop_turn(session.id)
            session.pending_inputs += 1
            self._ask_for_connection(session)

    def open_connections(self, environment_id: str) -> int:
        """How many executor WebSockets are open for the environment now (two means two executors)."""
        return len(self._connections.get(environment_id, {}))

    async def drop_link(self, environment_id: str, seconds: float) -> int:
        """An outage of one environment's link: close its executor's WebSockets and answer its
        upgrades 503 for ``seconds`` (a 5xx: the executor retries the same URL and does not
        register again, as it would after a 4xx). Returns how many WebSockets were closed."""
        environment = self.environment(environment_id)
        environment.refuse_upgrades_until = max(environment.refuse_upgrades_until, self.clock.now() + seconds)
        return await self.disconnect_environment(environment_id)

    def refuses_upgrade(self, environment_id: str) -> bool:
        """Whether a WebSocket upgrade for the environment is refused now (``drop_link``); counted."""
        environment = self.environments.get(environment_id)
        if environment is None or self.clock.now() >= environment.refuse_upgrades_until:
            return False
        environment.refused_upgrades += 1
        return True

    async def disconnect_environment(self, environment_id: str) -> int:
        """Close every executor WebSocket of one environment; returns how many."""
        closers = list(self._connections.get(environment_id, {}).values())
        if closers:
            await asyncio.wait([asyncio.ensure_future(close()) for close in closers], timeout=CLOSE_WAIT_SECONDS)
        return len(closers)

    # --- commands in the sandbox ----------------------------------------------------------

    def add_turn(self, session_id: str, specs: list[CommandSpec]) -> Turn:
        """Input whose turn runs ``specs`` in the session's sandbox (like a message, then work)."""
        session = self.get(session_id)
        if session.status is SessionStatus.FAILED:
            raise ApiError(409, f"Session '{session_id}' has failed and accepts no input.", code="session_failed")
        if not session.self_hosted:
            raise ApiError(400, "Only a self-hosted session has a sandbox to run commands in.")
        turn = self.turn_log.add(session.id, specs)
        self._request_turn(session)
        return turn

    async def run_command(self, environment_id: str, spec: CommandSpec, new_stream: bool = False) -> CommandRun:
        """Run one command over the environment's newest link, outside any turn (admin, tests)."""
        run = CommandRun(spec)
        await self._execute(environment_id, run, new_stream)
        return run

    async def _run_commands(self, session: SimSession) -> None:
        """The turn's commands, one after the other; a failure is recorded and the turn goes on."""
        for run in self.turn_log.pending(session.id):
            if session.status is not SessionStatus.IN_PROGRESS:
                return
            await self._execute(session.environment_id or "", run, new_stream=False, session_id=session.id)

    async def _execute(
        self, environment_id: str, run: CommandRun, new_stream: bool, session_id: str | None = None
    ) -> None:
        run.status = CommandStatus.RUNNING
        run.started_at = self.clock.now()
        try:
            link = self.harness.link(environment_id)
            if link is None:
                raise HarnessError("the sandbox is not connected")
            stream = await (link.open_stream() if new_stream else link.main_stream())
            spec = run.spec
            outcome = await stream.run(spec.argv, spec.cwd, spec.env, spec.timeout_seconds, spec.sandbox)
        except asyncio.CancelledError:
            # The turn was stopped under the command (its link dropped, it was cancelled, the
            # session went): the command may have run; it is never started again.
            why = "the turn stopped while the command ran (the executor's link dropped, or the turn was cancelled)"
            self._finish(run, CommandStatus.INTERRUPTED, f"{why}; it is not run again", environment_id, session_id)
            raise
        except LinkLost as exc:
            self._finish(
                run, CommandStatus.INTERRUPTED, f"{exc}; the command is not run again", environment_id, session_id
            )
            return
        except HarnessError as exc:
            self._finish(run, CommandStatus.FAILED, f"tool execution failed: {exc}", environment_id, session_id)
            return
        except Exception as exc:  # a simulator bug must not leave the turn hanging in_progress
            log.exception("command crashed", extra={"environment_id": environment_id})
            why = f"tool execution failed: {type(exc).__name__}"
            self._finish(run, CommandStatus.FAILED, why, environment_id, session_id)
            return
        run.cwd, run.sandbox_type, run.sandbox_denied = outcome.cwd, outcome.sandbox_type, outcome.sandbox_denied
        run.stdout_total, run.stderr_total = len(outcome.stdout), len(outcome.stderr)
        run.stdout, run.stderr, run.exit_code = keep(outcome.stdout), keep(outcome.stderr), outcome.exit_code
        self._finish(run, CommandStatus.COMPLETED, None, environment_id, session_id)

    def _finish(
        self, run: CommandRun, status: CommandStatus, error: str | None, environment_id: str, session_id: str | None
    ) -> None:
        run.status = status
        run.error = error
        run.finished_at = self.clock.now()
        log.info(
            "command finished" if status is CommandStatus.COMPLETED else "command failed",
            extra={
                "session_id": session_id or "",
                "environment_id": environment_id,
                "argv": " ".join(run.spec.argv)[:200],
                "status": status.value,
                "exit_code": run.exit_code,
                "sandbox": run.spec.sandbox.mode.value if run.spec.sandbox else None,
                "sandbox_type": run.sandbox_type,
                "sandbox_denied": run.sandbox_denied,
                "stdout": run.stdout[:200].decode(errors="replace"),
                "error": error,
                "seconds": round(run.finished_at - (run.started_at or run.finished_at), 3),
            },
        )

    # --- the state machine ----------------------------------------------------------------

    def _request_turn(self, session: SimSession) -> None:
        session.pending_inputs += 1
        session.last_active_at = self._now()
        if session.status is not SessionStatus.IDLE:
            return  # a running turn or a pending action picks the input up
        environment = self.environments.get(session.environment_id or "")
        if session.self_hosted and (environment is None or environment.status is not EnvironmentStatus.CONNECTED):
            self._ask_for_connection(session)
        else:
            self._start_turns(session)

    def _ask_for_connection(self, session: SimSession) -> None:
        self._move(session, SessionStatus.REQUIRES_ACTION, wants_connection=True)
        self.webhooks.publish(
            "agent.session.action_required",
            {"id": session.id, "required_action": {"type": "environment_connection"}},
        )
        self._cancel_deadline(session.id)
        self._deadlines[session.id] = asyncio.get_running_loop().create_task(self._deadline(session.id))

    def _start_turns(self, session: SimSession) -> None:
        self._move(session, SessionStatus.IN_PROGRESS)
        self.webhooks.publish("agent.session.in_progress", self._status_data(session))
        self._turns[session.id] = asyncio.get_running_loop().create_task(self._run_turns(session.id))

    async def _run_turns(self, session_id: str) -> None:
        while True:
            session = self.sessions.get(session_id)
            if session is None:
                return
            session.pending_inputs = 0
            await self._run_commands(session)
            await asyncio.sleep(self.config.turn_seconds)
            session = self.sessions.get(session_id)
            if session is None or session.status is not SessionStatus.IN_PROGRESS:
                return
            session.last_active_at = self._now()
            if session.pending_inputs:
                continue
            self._turns.pop(session_id, None)
            self._move(session, SessionStatus.IDLE)
            self.webhooks.publish("agent.session.idle", self._status_data(session))
            return

    async def _deadline(self, session_id: str) -> None:
        await asyncio.sleep(self.config.connect_timeout_seconds)
        self._deadlines.pop(session_id, None)
        session = self.sessions.get(session_id)
        if session is not None and session.wants_connection:
            seconds = self.config.connect_timeout_seconds
            self._fail(
                session,
                f"No executor connected to environment '{session.environment_id}' within {seconds:g} seconds.",
            )

    def _cancel(self, session: SimSession) -> None:
        session.pending_inputs = 0
        self.turn_log.cancel(session.id)
        if session.status is SessionStatus.IN_PROGRESS or session.wants_connection:
            self._stop_tasks(session.id)
            self._move(session, SessionStatus.IDLE)
            session.last_active_at = self._now()
            self.webhooks.publish("agent.session.idle", self._status_data(session))

    def _fail(self, session: SimSession, error: str) -> None:
        self._stop_tasks(session.id)
        self.turn_log.fail_pending(session.id, f"the session failed: {error}")
        self._move(session, SessionStatus.FAILED)
        session.pending_inputs = 0
        session.error = error
        self.webhooks.publish("agent.session.failed", self._status_data(session))

    def _status_data(self, session: SimSession) -> dict[str, Any]:
        data: dict[str, Any] = {"id": session.id, "environment_type": session.environment_type}
        if session.environment_id is not None:
            data["environment_id"] = session.environment_id
        return data

    def _stop_tasks(self, session_id: str) -> None:
        self._stop_turn(session_id)
        self._cancel_deadline(session_id)

    def _stop_turn(self, session_id: str) -> None:
        task = self._turns.pop(session_id, None)
        if task is not None and task is not asyncio.current_task():
            task.cancel()

    def _cancel_deadline(self, session_id: str) -> None:
        task = self._deadlines.pop(session_id, None)
        if task is not None and task is not asyncio.current_task():
            task.cancel()

    def _move(self, session: SimSession, status: SessionStatus, wants_connection: bool = False) -> None:
        """The one place a session changes state; each change is kept in its history."""
        session.status = status
        session.wants_connection = wants_connection
        session.history.append((self.clock.now(), status.value, wants_connection))

    def _now(self) -> int:
        return int(self.clock.now())
