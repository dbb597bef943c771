"""What the checker can see from outside the controller: ``/proc`` and the simulator.

Nothing here imports the controller. An executor is found by its command line —
``… exec-server --remote <the simulator's URL> --environment-id <id>`` — so executors of other
runs on the machine are not counted; a launcher and the native ``codex`` it started share one
process session, and one process session is one executor (the wrappers a checkpointing runner
starts it under, ``WRAPPERS``, are not counted).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx


@dataclass(frozen=True)
class Process:
    pid: int
    sid: int
    start_ticks: int
    environment_id: str


WRAPPERS = frozenset({"unshare", "setsid", "setpriv", "sh"})
"""Programs that start the executor and wait for it (a checkpointing runner's pid namespace:
``unshare --fork`` outside it, in a process session of its own, and inside it, as its pid 1):
their command lines carry the executor's, but they are not one."""


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, session id, start time in clock ticks) of a process, or None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as file:
            text = file.read()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()
    return fields[0], int(fields[3]), int(fields[19])


def start_ticks(pid: int) -> int | None:
    """The start time (clock ticks after boot) of a running (not zombie) process, else None."""
    stat = _stat(pid)
    return None if stat is None or stat[0] in ("Z", "X") else stat[2]


def _cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as file:
            raw = file.read()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def _flag(argv: list[str], name: str) -> str | None:
    for index, arg in enumerate(argv):
        if arg == name and index + 1 < len(argv):
            return argv[index + 1]
        if arg.startswith(name + "="):
            return arg[len(name) + 1 :]
    return None


def executor_processes(remote_url: str) -> list[Process]:
    """Every running (not zombie) executor process that dials ``remote_url``."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        argv = _cmdline(pid)
        if "exec-server" not in argv or _flag(argv, "--remote") != remote_url:
            continue
        if argv and os.path.basename(argv[0]) in WRAPPERS:
            continue  # holds the executor's command line, but only waits for it
        environment_id = _flag(argv, "--environment-id")
        stat = _stat(pid)
        if environment_id is None or stat is None or stat[0] in ("Z", "X"):
            continue
        found.append(Process(pid, stat[1], stat[2], environment_id))
    return found


def processes_in(directory: Path, argv: list[str]) -> list[int]:
    """Running processes whose working directory is ``directory`` and command line is ``argv``."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            continue
        if cwd == str(directory.resolve()) and _cmdline(pid) == argv and start_ticks(pid) is not None:
            found.append(pid)
    return found


def executors(remote_url: str) -> dict[str, dict[int, list[int]]]:
    """Executors by environment: each process session (one executor) with its pids."""
    grouped: dict[str, dict[int, list[int]]] = {}
    for process in executor_processes(remote_url):
        grouped.setdefault(process.environment_id, {}).setdefault(process.sid, []).append(process.pid)
    return grouped


def socket_owner(host: str, port: int) -> int | None:
    """The pid of the process holding the TCP socket whose own address is ``host:port`` (IPv4
    loopback: the caller of a call the simulator holds, ``GET /admin/held``), or None."""
    wanted = f"{_hex_ipv4(host)}:{port:04X}"
    inode = None
    with open("/proc/net/tcp") as table:
        for line in table.readlines()[1:]:
            fields = line.split()
            if fields[1] == wanted and fields[9] != "0":
                inode = fields[9]
                break
    if inode is None:
        return None
    target = f"socket:[{inode}]"
    for pid in (name for name in os.listdir("/proc") if name.isdigit()):
        try:
            descriptors = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for descriptor in descriptors:
            try:
                if os.readlink(f"/proc/{pid}/fd/{descriptor}") == target:
                    return int(pid)
            except OSError:
                continue
    return None


def parent(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as file:
            text = file.read()
    except OSError:
        return None
    return int(text[text.rindex(")") + 2 :].split()[1])


def _hex_ipv4(host: str) -> str:
    """``/proc/net/tcp``'s spelling of an IPv4 address: its four bytes, little-endian, in hex."""
    return "".join(f"{int(part):02X}" for part in reversed(host.split(".")))


class Simulator:
    """The simulator's admin endpoints (loopback, never faulted)."""

    def __init__(self, base_url: str, api_key: str) -> None:
        self.base_url = base_url
        self._client = httpx.Client(base_url=base_url, timeout=10.0)
        self._api_key = api_key

    def close(self) -> None:
        self._client.close()

    def _data(self, path: str) -> list[dict[str, Any]]:
        response = self._client.get(path)
        response.raise_for_status()
        return list(response.json()["data"])

    def sessions(self) -> dict[str, dict[str, Any]]:
        return {s["id"]: s for s in self._data("/admin/sessions")}

    def environments(self) -> dict[str, dict[str, Any]]:
        return {e["id"]: e for e in self._data("/admin/environments")}

    def history(self, session_id: str) -> list[dict[str, Any]]:
        response = self._client.get(f"/admin/sessions/{session_id}/history")
        if response.status_code == 404:
            return []  # deleted
        response.raise_for_status()
        return list(response.json()["data"])

    def turns(self, session_id: str) -> list[dict[str, Any]]:
        response = self._client.get(f"/admin/sessions/{session_id}/turns")
        if response.status_code == 404:
            return []
        response.raise_for_status()
        return list(response.json()["data"])

    def registrations(self, environment_id: str | None = None) -> list[dict[str, Any]]:
        query = f"?environment_id={environment_id}" if environment_id else ""
        return self._data("/admin/registrations" + query)

    def deliveries(self, event_type: str) -> list[dict[str, Any]]:
        return self._data(f"/admin/deliveries?type={event_type}")

    def events(self) -> dict[str, dict[str, Any]]:
        return {e["id"]: e for e in self._data("/admin/events")}


def state_at(history: list[dict[str, Any]], at: float) -> dict[str, Any] | None:
    """The session's state at ``at``: the last change at or before it (with its time)."""
    found = None
    for change in history:
        if change["at"] <= at:
            found = change
    return found


def idle_before(history: list[dict[str, Any]], at: float) -> tuple[dict[str, Any] | None, float]:
    """The change that began the session's last idle stretch before ``at`` (None if it was never
    idle), and when the busy stretch after it began (``at`` if it is still idle)."""
    changes = [h for h in history if h["at"] <= at]
    index = len(changes) - 1
    while index >= 0 and (changes[index]["status"] != "idle" or changes[index]["wants_connection"]):
        index -= 1
    if index < 0:
        return None, at
    busy_since = float(changes[index + 1]["at"]) if index + 1 < len(changes) else at
    return changes[index], busy_since


def up_since(links: list[list[float | None]], at: float) -> float | None:
    """When the link came up, if it is up at ``at`` (None while it is down)."""
    for up, down in links:
        if up is not None and up <= at and (down is None or down > at):
            return float(up)
    return None


def down_since(links: list[list[float | None]], at: float, blip: float = 1.5) -> float | None:
    """When the link went down, if it is down at ``at`` (None while it is up). An up-stretch
    shorter than ``blip`` does not end an outage: nothing is bound to have seen it."""
    stretches = [(float(up), None if down is None else float(down)) for up, down in links if up is not None]
    if any(up <= at and (down is None or down > at) for up, down in stretches):
        return None
    before = [(up, down) for up, down in stretches if down is not None and down <= at]
    if not before:
        return float("-inf")  # never up before ``at``
    start = before[-1][1]
    assert start is not None
    for index in range(len(before) - 1, 0, -1):
        up, down = before[index]
        assert down is not None
        if down - up >= blip:
            break
        previous_down = before[index - 1][1]
        assert previous_down is not None
        start = previous_down
    return start
