"""Whether this host lets Codex build its own sandbox for the local runner's executors.

Codex 0.171.0 runs a command that asks for its sandbox (sessions with automatic review do)
inside bubblewrap: new user, pid, ipc and network namespaces, then a seccomp filter. An
executor that runs as an unprivileged uid gets there only where unprivileged user namespaces
are allowed; elsewhere every sandboxed command fails (``bwrap: Creating new namespace failed``)
while unsandboxed ones still run. Only sessions that ask for the sandbox need it, so this is
a warning (``check-config``, and each worker at start), never a refusal.
"""

from __future__ import annotations

from pathlib import Path

PROC = Path("/proc")


def _read(proc: Path, name: str) -> str | None:
    try:
        return (proc / name).read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None  # absent on this kernel: no such restriction


def codex_sandbox_problem(unprivileged: bool, proc: Path = PROC) -> str | None:
    """One line — what stops Codex's sandbox here, and the fix — or None when nothing does.
    ``unprivileged``: the executors run as a uid other than 0 (the local runner's default)."""
    found: list[tuple[str, str]] = []
    if _read(proc, "sys/user/max_user_namespaces") == "0":
        found.append(("user.max_user_namespaces = 0", "sysctl -w user.max_user_namespaces=15000"))
    if unprivileged and _read(proc, "sys/kernel/unprivileged_userns_clone") == "0":
        found.append(
            (
                "unprivileged user namespaces are off (kernel.unprivileged_userns_clone = 0)",
                "sysctl -w kernel.unprivileged_userns_clone=1",
            )
        )
    if unprivileged and _read(proc, "sys/kernel/apparmor_restrict_unprivileged_userns") == "1":
        found.append(
            (
                "AppArmor restricts unprivileged user namespaces (kernel.apparmor_restrict_unprivileged_userns = 1)",
                "sysctl -w kernel.apparmor_restrict_unprivileged_userns=0, or an AppArmor profile that allows "
                "userns for the bwrap beside the codex binary",
            )
        )
    if not found:
        return None
    causes = "; ".join(cause for cause, _ in found)
    fixes = "; ".join(fix for _, fix in found)
    return (
        f"Codex cannot build its own sandbox for executors on this host ({causes}): commands that ask for it "
        f"(sessions with automatic review) will fail. Fix: {fixes} (persist it in /etc/sysctl.d/)"
    )
