"""The simulator as the harness: the Agents API's side of each executor's WebSocket.

``codex exec-server`` is the server of a JSON-RPC conversation carried over its WebSocket in
relay frames (``relay.py``), one virtual stream per conversation, each sealed by a Noise
handshake (``noise.py``). The simulator, like the real API, speaks first on every stream:

1. ``resume{}`` then ``handshake{msg1}``; msg1's payload is a harness key authorization the
   simulator issues for this executor registration. The executor asks
   ``/cloud/environment/{id}/validate`` about it (``Harness.validate``) and answers
   ``handshake{msg2}``, or ``reset`` when the simulator said no.
2. ``initialize`` / ``initialized``, then ``process/start``; the executor pushes
   ``process/output`` (base64 chunks), ``process/exited`` and ``process/closed``.

Every JSON-RPC message is ``u32 BE length ‖ JSON`` cut into ≤ 60 KiB records, each record one
AES-GCM message in one ``data`` frame with its own sequence number. Many streams share one
WebSocket. A link that drops fails whatever was waiting on it (``LinkLost``): a command that
was running is reported as such and never started again.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import itertools
import json
import logging
import secrets
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any
from urllib.parse import quote, unquote, urlparse

from agents_simulator import noise, relay
from agents_simulator.sandboxing import SandboxRequest, process_sandbox

log = logging.getLogger("agents_simulator")

HANDSHAKE_TIMEOUT_SECONDS = 15.0
REQUEST_TIMEOUT_SECONDS = 30.0
DEFAULT_COMMAND_TIMEOUT_SECONDS = 120.0
DEFAULT_COMMAND_PATH = "/usr/local/bin:/usr/bin:/bin"
CLIENT_NAME = "agents-simulator"

SendBytes = Callable[[bytes], Awaitable[None]]


class HarnessError(Exception):
    """The harness could not do what it was asked over the link (the turn's tool call fails)."""


class LinkLost(HarnessError):
    """The executor's WebSocket closed (or the stream was reset) while we waited on it."""


class HandshakeRefused(HarnessError):
    """The executor reset the stream instead of answering the handshake."""


class RpcError(HarnessError):
    """The executor answered a request with a JSON-RPC error."""


def file_uri(path: str) -> str:
    """``/a b`` → ``file:///a%20b`` (0.171.0 wants every cwd as a file:// URI)."""
    if not path.startswith("/"):
        raise HarnessError(f"a working directory must be absolute: {path!r}")
    return "file://" + quote(path)


def uri_path(uri: str) -> str:
    parsed = urlparse(uri)
    if parsed.scheme != "file":
        return uri
    return str(PurePosixPath(unquote(parsed.path)))


def parse_public_key(value: Any) -> noise.HybridPublicKey | None:
    """The hybrid key in a registration or validation body, or None if it is not one."""
    if not isinstance(value, dict):
        return None
    try:
        return noise.HybridPublicKey(
            base64.b64decode(str(value.get("x25519_public_key", "")), validate=True),
            base64.b64decode(str(value.get("mlkem768_public_key", "")), validate=True),
        )
    except (binascii.Error, ValueError, noise.NoiseError):
        return None


@dataclass(frozen=True)
class ExecutorIdentity:
    """What one successful registration told the simulator."""

    environment_id: str
    registration_id: str
    public_key: noise.HybridPublicKey | None


@dataclass(frozen=True)
class CommandOutcome:
    stdout: bytes
    stderr: bytes
    exit_code: int | None
    cwd: str
    sandbox_type: str | None
    sandbox_denied: bool | None = None


@dataclass
class _Process:
    stdout: bytearray = field(default_factory=bytearray)
    stderr: bytearray = field(default_factory=bytearray)
    seen: set[int] = field(default_factory=set)
    exit_code: int | None = None
    sandbox_denied: bool | None = None
    exited: asyncio.Event = field(default_factory=asyncio.Event)
    closed: asyncio.Event = field(default_factory=asyncio.Event)


class Stream:
    """One virtual stream: its handshake, its keys, its JSON-RPC calls and processes."""

    def __init__(self, link: Link, authorization: str, key: noise.HybridKeyPair) -> None:
        self.link = link
        self.id = str(uuid.uuid4())
        executor_key = link.executor.public_key
        if executor_key is None:
            raise HarnessError("the executor registered no usable public key")
        self._initiator = noise.Initiator(
            key,
            executor_key,
            noise.prologue(link.executor.environment_id, link.executor.registration_id, self.id),
        )
        self._authorization = authorization
        self._transport: noise.Transport | None = None
        self._ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._send_seq = 0
        self._receive_seq = 0
        self._reassembler = relay.Reassembler()
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._processes: dict[str, _Process] = {}
        self._process_ids = itertools.count(1)
        self.environment: dict[str, Any] = {}
        self.failure: HarnessError | None = None

    # -- opening -----------------------------------------------------------------------

    async def open(self, timeout: float = HANDSHAKE_TIMEOUT_SECONDS) -> None:
        try:
            message1 = self._initiator.write_message1(self._authorization.encode())
        except noise.NoiseError as exc:
            raise HarnessError(str(exc)) from exc
        await self.link.send_frame(relay.Frame(self.id, relay.Resume()))
        await self.link.send_frame(relay.Frame(self.id, relay.Handshake(message1)))
        try:
            await asyncio.wait_for(asyncio.shield(self._ready), timeout)
        except TimeoutError as exc:
            self.fail(HarnessError("the executor did not answer the handshake in time"))
            raise HarnessError("the executor did not answer the handshake in time") from exc
        result = await self.request("initialize", {"clientName": CLIENT_NAME})
        self.environment = dict(result.get("environmentInfo") or {}) if isinstance(result, dict) else {}
        await self.notify("initialized", {})

    @property
    def cwd(self) -> str | None:
        """The executor's working directory as it reported it (a path), if it did."""
        reported = self.environment.get("cwd")
        return uri_path(reported) if isinstance(reported, str) else None

    # -- frames in ---------------------------------------------------------------------

    async def on_frame(self, frame: relay.Frame) -> None:
        body = frame.body
        if isinstance(body, relay.Handshake):
            if self._transport is not None or self._ready.done():
                return
            try:
                self._transport = self._initiator.read_message2(body.payload)
            except noise.NoiseError as exc:
                self.fail(HarnessError(f"handshake message 2 rejected: {exc}"))
                return
            self._ready.set_result(None)
        elif isinstance(body, relay.Reset):
            if not self._ready.done():
                self.fail(HandshakeRefused(f"the executor refused the handshake ({body.reason or 'no reason'})"))
            else:
                self.fail(LinkLost(f"the executor reset the stream ({body.reason or 'no reason'})"))
        elif isinstance(body, relay.Data):
            await self._on_data(body)

    async def _on_data(self, data: relay.Data) -> None:
        if self._transport is None:
            return
        if data.seq < self._receive_seq:
            return  # a copy of a record already read
        if data.seq > self._receive_seq:
            self.fail(LinkLost(f"record {self._receive_seq} was skipped (got {data.seq})"))
            return
        self._receive_seq += 1
        self.link.records_in += 1
        try:
            plaintext = self._transport.open(data.payload)
            messages = self._reassembler.feed(plaintext)
        except (noise.NoiseError, relay.FrameError) as exc:
            self.fail(LinkLost(f"unreadable record: {exc}"))
            return
        for raw in messages:
            self.link.largest_message_in = max(self.link.largest_message_in, len(raw))
            try:
                message = json.loads(raw)
            except ValueError:
                continue
            if isinstance(message, dict):
                self._dispatch(message)

    def _dispatch(self, message: dict[str, Any]) -> None:
        if "id" in message and ("result" in message or "error" in message):
            waiter = self._pending.pop(message["id"], None) if isinstance(message["id"], int) else None
            if waiter is None or waiter.done():
                return
            if "error" in message:
                error = message["error"] if isinstance(message["error"], dict) else {}
                waiter.set_exception(RpcError(f"{error.get('code')}: {error.get('message')}"))
            else:
                waiter.set_result(message["result"])
            return
        params = message.get("params")
        if not isinstance(params, dict):
            return
        process = self._processes.get(str(params.get("processId")))
        if process is None:
            return
        method = message.get("method")
        seq = params.get("seq")
        if isinstance(seq, int):
            if seq in process.seen:
                return
            process.seen.add(seq)
        if method == "process/output":
            try:
                chunk = base64.b64decode(str(params.get("chunk", "")))
            except (binascii.Error, ValueError):
                chunk = b""
            (process.stderr if params.get("stream") == "stderr" else process.stdout).extend(chunk)
        elif method == "process/exited":
            code = params.get("exitCode")
            process.exit_code = code if isinstance(code, int) else None
            denied = params.get("sandboxDenied")
            process.sandbox_denied = denied if isinstance(denied, bool) else None
            process.exited.set()
        elif method == "process/closed":
            process.exited.set()
            process.closed.set()

    def fail(self, error: HarnessError) -> None:
        """Nothing more will come on this stream: wake everyone waiting on it."""
        if self.failure is None:
            self.failure = error
        if not self._ready.done():
            self._ready.set_exception(error)
            self._ready.exception()  # retrieved: nobody may be awaiting it any more
        for waiter in self._pending.values():
            if not waiter.done():
                waiter.set_exception(error)
        self._pending.clear()
        for process in self._processes.values():
            process.exited.set()
            process.closed.set()
        self.link.forget(self)

    # -- messages out ------------------------------------------------------------------

    async def _send(self, message: dict[str, Any]) -> None:
        if self.failure is not None:
            raise self.failure
        assert self._transport is not None, "the handshake has not completed"
        encoded = json.dumps(message, separators=(",", ":")).encode()
        async with self.link.sending:  # records of one message go out in order, unmixed
            for record in relay.records(encoded):
                sealed = self._transport.seal(record)
                frame = relay.Frame(self.id, relay.Data(seq=self._send_seq, payload=sealed))
                self._send_seq += 1
                await self.link.send_frame(frame, locked=True)
                self.link.records_out += 1

    async def request(self, method: str, params: dict[str, Any], timeout: float = REQUEST_TIMEOUT_SECONDS) -> Any:
        request_id = next(self._ids)
        waiter: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = waiter
        try:
            await self._send({"id": request_id, "method": method, "params": params})
            return await asyncio.wait_for(waiter, timeout)
        except TimeoutError as exc:
            raise HarnessError(f"no answer to {method} within {timeout:g} s") from exc
        finally:
            self._pending.pop(request_id, None)

    async def notify(self, method: str, params: dict[str, Any]) -> None:
        await self._send({"method": method, "params": params})

    # -- commands ----------------------------------------------------------------------

    async def run(
        self,
        argv: list[str],
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout: float = DEFAULT_COMMAND_TIMEOUT_SECONDS,
        sandbox: SandboxRequest | None = None,
    ) -> CommandOutcome:
        """Start ``argv`` in ``cwd`` (default: the executor's own working directory) and wait
        until the executor says the process closed; its output comes back in base64 chunks.
        With ``sandbox`` the executor is asked to run it inside Codex's own sandbox, whose
        writable workspace is the executor's working directory."""
        directory = cwd or self.cwd
        if directory is None:
            raise HarnessError("no working directory: the executor reported none and the command named none")
        process_id = f"sim-{next(self._process_ids)}-{secrets.token_hex(4)}"
        process = self._processes[process_id] = _Process()
        params: dict[str, Any] = {
            "processId": process_id,
            "argv": argv,
            "cwd": file_uri(directory),
            "env": {"PATH": DEFAULT_COMMAND_PATH, **(env or {})},
            "tty": False,
            "pipeStdin": False,
            "arg0": None,
        }
        if sandbox is not None:
            params["sandbox"] = process_sandbox(sandbox, file_uri(self.cwd or directory))
        try:
            started = await self.request("process/start", params)
            try:
                await asyncio.wait_for(process.closed.wait(), timeout)
            except TimeoutError as exc:
                raise HarnessError(f"the command did not finish within {timeout:g} s") from exc
            if self.failure is not None:
                raise self.failure
            if process.exit_code is None:
                # The exit code may only be in the process's record: ask for it.
                state = await self.request(
                    "process/read",
                    {"processId": process_id, "afterSeq": None, "maxBytes": 65536, "waitMs": 0},
                )
                if isinstance(state, dict) and isinstance(state.get("exitCode"), int):
                    process.exit_code = state["exitCode"]
                if isinstance(state, dict) and isinstance(state.get("sandboxDenied"), bool):
                    process.sandbox_denied = state["sandboxDenied"]
            sandbox = started.get("sandboxType") if isinstance(started, dict) else None
            return CommandOutcome(
                stdout=bytes(process.stdout),
                stderr=bytes(process.stderr),
                exit_code=process.exit_code,
                cwd=directory,
                sandbox_type=sandbox if isinstance(sandbox, str) else None,
                sandbox_denied=process.sandbox_denied,
            )
        finally:
            self._processes.pop(process_id, None)


class Link:
    """One executor WebSocket: frames in and out, and the streams multiplexed on it."""

    def __init__(self, harness: Harness, executor: ExecutorIdentity, send: SendBytes) -> None:
        self.harness = harness
        self.executor = executor
        self._send = send
        self.sending = asyncio.Lock()
        self.streams: dict[str, Stream] = {}
        self._main: Stream | None = None
        self._main_lock = asyncio.Lock()
        self.lost = False
        self.frames_in = 0
        self.frames_out = 0
        self.streams_opened = 0
        self.records_in = 0
        self.records_out = 0
        self.largest_message_in = 0
        self.connected_at = time.time()

    def to_json(self) -> dict[str, Any]:
        return {
            "environment_id": self.executor.environment_id,
            "executor_registration_id": self.executor.registration_id,
            "connected_at": self.connected_at,
            "open_streams": len(self.streams),
            "streams_opened": self.streams_opened,
            "frames_in": self.frames_in,
            "frames_out": self.frames_out,
            "records_in": self.records_in,
            "records_out": self.records_out,
            "largest_message_in": self.largest_message_in,
        }

    async def send_frame(self, frame: relay.Frame, locked: bool = False) -> None:
        if self.lost:
            raise LinkLost("the executor's link is closed")
        data = relay.encode(frame)
        try:
            if locked:
                await self._send(data)
            else:
                async with self.sending:
                    await self._send(data)
        except Exception as exc:  # the socket went away under us
            raise LinkLost(f"sending on the executor's link failed: {type(exc).__name__}") from exc
        self.frames_out += 1

    async def on_bytes(self, data: bytes) -> None:
        try:
            frame = relay.decode(data)
        except relay.FrameError:
            log.warning("unreadable relay frame", extra={"environment_id": self.executor.environment_id})
            return
        self.frames_in += 1
        stream = self.streams.get(frame.stream_id)
        if stream is not None:
            await stream.on_frame(frame)

    async def open_stream(self, timeout: float = HANDSHAKE_TIMEOUT_SECONDS) -> Stream:
        """A new stream: handshake (validated through ``/validate``) and ``initialize``."""
        key, authorization = self.harness.credentials_for(self.executor)
        stream = Stream(self, authorization, key)
        self.streams[stream.id] = stream
        self.streams_opened += 1
        try:
            await stream.open(timeout)
        except HarnessError as exc:
            stream.fail(exc)
            raise
        return stream

    async def main_stream(self) -> Stream:
        """The stream turns use: opened on first need, opened again once it failed."""
        async with self._main_lock:
            if self._main is None or self._main.failure is not None:
                self._main = await self.open_stream()
            return self._main

    def forget(self, stream: Stream) -> None:
        self.streams.pop(stream.id, None)
        if self._main is stream:
            self._main = None

    def close(self) -> None:
        self.lost = True
        for stream in list(self.streams.values()):
            stream.fail(LinkLost("the executor's link dropped"))


@dataclass(frozen=True)
class _Issued:
    environment_id: str
    registration_id: str
    public_key: noise.HybridPublicKey


@dataclass(frozen=True)
class Validation:
    """One ``/validate`` call as the simulator judged it (never the authorization itself)."""

    environment_id: str
    executor_registration_id: str | None
    valid: bool
    reason: str
    at: float

    def to_json(self) -> dict[str, Any]:
        return {
            "environment_id": self.environment_id,
            "executor_registration_id": self.executor_registration_id,
            "valid": self.valid,
            "reason": self.reason,
            "at": self.at,
        }


class Harness:
    """The simulator's harness identity, the executors it knows, and their open links."""

    def __init__(self) -> None:
        self.key = noise.HybridKeyPair()
        self._executors: dict[str, ExecutorIdentity] = {}  # by WebSocket token
        self._issued: dict[str, _Issued] = {}  # by authorization
        self._links: dict[str, list[Link]] = {}
        self.validations: list[Validation] = []
        self.impostor_handshakes = 0  # the next N handshakes present a key the API never published

    # -- registration and validation ---------------------------------------------------

    def registered(self, environment_id: str, registration_id: str, token: str, body: Any) -> None:
        raw = body.get("executor_public_key") if isinstance(body, dict) else None
        self._executors[token] = ExecutorIdentity(environment_id, registration_id, parse_public_key(raw))

    def credentials_for(self, executor: ExecutorIdentity) -> tuple[noise.HybridKeyPair, str]:
        """The key pair and authorization the next handshake with ``executor`` presents."""
        authorization = "hka_" + secrets.token_urlsafe(24)
        self._issued[authorization] = _Issued(executor.environment_id, executor.registration_id, self.key.public)
        if self.impostor_handshakes > 0:
            self.impostor_handshakes -= 1
            return noise.HybridKeyPair(), authorization  # a key this API never published
        return self.key, authorization

    def validate(self, environment_id: str, body: Any) -> bool:
        """Whether the executor's handshake shows the key and authorization this harness issued."""
        registration_id = body.get("executor_registration_id") if isinstance(body, dict) else None
        presented = parse_public_key(body.get("harness_public_key") if isinstance(body, dict) else None)
        authorization = body.get("harness_key_authorization") if isinstance(body, dict) else None
        issued = self._issued.get(authorization) if isinstance(authorization, str) else None
        if issued is None:
            reason = "the harness key authorization was not issued by this API"
        elif issued.environment_id != environment_id:
            reason = "the authorization was issued for another environment"
        elif issued.registration_id != registration_id:
            reason = "the authorization was issued for another executor registration"
        elif presented != issued.public_key:
            reason = "the harness public key is not the one this API uses"
        else:
            reason = "ok"
        valid = reason == "ok"
        self.validations.append(
            Validation(
                environment_id,
                registration_id if isinstance(registration_id, str) else None,
                valid,
                reason,
                time.time(),
            )
        )
        log.info("harness key validated", extra={"environment_id": environment_id, "valid": valid, "reason": reason})
        return valid

    # -- links -------------------------------------------------------------------------

    def attach(self, environment_id: str, token: str, send: SendBytes) -> Link | None:
        """A link for the executor that connected with ``token`` (None: it registered no key)."""
        executor = self._executors.get(token)
        if executor is None or executor.environment_id != environment_id or executor.public_key is None:
            return None
        link = Link(self, executor, send)
        self._links.setdefault(environment_id, []).append(link)
        return link

    def detach(self, link: Link) -> None:
        link.close()
        links = self._links.get(link.executor.environment_id, [])
        with contextlib.suppress(ValueError):
            links.remove(link)
        if not links:
            self._links.pop(link.executor.environment_id, None)

    def links(self) -> list[Link]:
        return [link for links in self._links.values() for link in links]

    def link(self, environment_id: str) -> Link | None:
        """The newest open link of an environment."""
        links = self._links.get(environment_id)
        return links[-1] if links else None
