"""Memory of an idle sandbox under the local runner: ``codex exec-server`` started by
``LocalRunner`` (as a worker starts it), connected to the Agents API simulator, then left idle.

For each of ``--sandboxes`` sessions (default 5) the runner starts the executor; once every
one is connected (the simulator says so) and ``--settle`` seconds (default 10) have passed,
each process of each sandbox's session (the npm launcher, node, and the native ``codex`` it
starts; with ``--native`` the native binary alone, as the runner image runs it) is read from
``/proc/<pid>/smaps_rollup``:

  RSS  resident pages, shared ones counted in full (what ``ps`` shows)
  PSS  resident pages, each shared page divided among the processes that map it: the sum over
       all processes is the memory they use together, so PSS per sandbox with N sandboxes is
       what one more costs when N run
  USS  private pages only (Private_Clean + Private_Dirty): what stopping one sandbox frees

    .venv/bin/python bench/idle_memory.py [--sandboxes 5] [--settle 10] [--native]

Needs the cached codex (``scripts/test`` installs it) and permission to read the executors'
smaps (the same user, or root).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.plots import markdown_table
from controller.model import SandboxSpec
from controller.runners.local import LocalRunner, members
from tests.support.processes import wait_for
from tests.support.simulator import SimulatorProcess

FIELDS = ("Rss", "Pss", "Private_Clean", "Private_Dirty")


def codex_commands() -> tuple[str, str]:
    """The npm launcher and the native binary it runs, from the cache ``scripts/test`` fills."""
    from agents_simulator.dev import codex_install_prefix

    prefix = codex_install_prefix() / "node_modules"
    launcher = prefix / ".bin" / "codex"
    native = sorted(prefix.glob("@openai/codex-*/vendor/*/bin/codex"))
    if not launcher.exists() or not native:
        raise SystemExit(f"codex is not installed under {prefix} (scripts/test installs it)")
    return str(launcher), str(native[0])


def smaps(pid: int) -> dict[str, int] | None:
    """kB per field of ``/proc/<pid>/smaps_rollup``, None when the process is gone."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    values = {}
    for line in text.splitlines()[1:]:
        name, _, rest = line.partition(":")
        if name in FIELDS:
            values[name] = int(rest.split()[0])
    return values


def command_name(pid: int) -> str:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except FileNotFoundError:
        return "?"
    first = Path(argv[0].decode(errors="replace")).name
    return "node (the npm launcher)" if first in ("node", "nodejs") else f"{first} (native)"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sandboxes", type=int, default=5)
    parser.add_argument("--settle", type=float, default=10.0, help="idle seconds after all are connected")
    parser.add_argument("--native", action="store_true", help="run the native codex binary, not the npm launcher")
    args = parser.parse_args()
    launcher, native = codex_commands()
    command = native if args.native else launcher
    directory = Path(tempfile.mkdtemp(prefix="bench-idle-memory-"))
    simulator = SimulatorProcess(directory / "logs").start()
    runner = LocalRunner(directory / "state", [command], simulator.environment_key)
    rows: list[tuple[str, dict[str, int]]] = []
    try:
        with simulator.openai() as api:
            sessions = [
                api.beta.agents.sessions.create(
                    environment={"type": "self_hosted", "workspace_directory": "/workspace"}, input="hello"
                )
                for _ in range(args.sandboxes)
            ]
        handles = [
            runner.ensure(
                SandboxSpec(session_id=s.id, environment_id=s.environment.id, remote_url=s.environment.remote_url), 1
            )
            for s in sessions
        ]
        for s in sessions:
            wait_for(lambda s=s: simulator.environment_status(s.environment.id) == "connected", 60, "codex to connect")
        time.sleep(args.settle)
        per_sandbox: list[dict[str, int]] = []
        for handle in handles:
            leader, ticks = (int(part) for part in handle.uid.split(":"))
            total = dict.fromkeys(FIELDS, 0)
            for process in members(leader, ticks):
                found = smaps(process.pid)
                if found is None:
                    continue
                rows.append((command_name(process.pid), found))
                for name in FIELDS:
                    total[name] += found.get(name, 0)
            per_sandbox.append(total)
        for s in sessions:
            if simulator.environment_status(s.environment.id) != "connected":
                raise SystemExit(f"{s.id}: the executor disconnected while idle")
    finally:
        runner.stop_all()
        simulator.stop()
        shutil.rmtree(directory, ignore_errors=True)

    def mib(kb: float) -> str:
        return f"{kb / 1024:.1f}"

    kind = "the native codex" if args.native else "the npm launcher and the native codex"
    print(f"{args.sandboxes} idle sandboxes ({kind}), {args.settle:g} s after all connected; medians (MiB)\n")
    header = ["", "RSS", "PSS", "USS (private)"]
    body = [
        [
            "per sandbox (all its processes)",
            *(mib(statistics.median(t[k] for t in per_sandbox)) for k in ("Rss", "Pss")),
            mib(statistics.median(t["Private_Clean"] + t["Private_Dirty"] for t in per_sandbox)),
        ]
    ]
    for name in sorted({name for name, _ in rows}):
        mine = [values for n, values in rows if n == name]
        body.append(
            [
                f"  {name} ({len(mine)} processes)",
                *(mib(statistics.median(v.get(k, 0) for v in mine)) for k in ("Rss", "Pss")),
                mib(statistics.median(v.get("Private_Clean", 0) + v.get("Private_Dirty", 0) for v in mine)),
            ]
        )
    print(markdown_table(header, body))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
