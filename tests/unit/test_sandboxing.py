"""The sandbox request a simulated command carries to the executor: the wire shape codex
0.171.0 accepts (tests/contract/test_codex_sandbox.py runs it against the real binary)."""

from __future__ import annotations

import pytest

from agents_simulator.commands import parse_command
from agents_simulator.errors import ApiError
from agents_simulator.sandboxing import SandboxMode, SandboxRequest, parse_sandbox, process_sandbox

ROOT_READ = {"path": {"type": "special", "value": {"kind": "root"}}, "access": "read"}


def _write(kind: str) -> dict[str, object]:
    return {"path": {"type": "special", "value": {"kind": kind}}, "access": "write"}


def test_workspace_write_is_what_codex_builds_for_that_mode() -> None:
    wire = process_sandbox(SandboxRequest(SandboxMode.WORKSPACE_WRITE), "file:///work/space")
    assert wire == {
        "permissions": {
            "type": "managed",
            "file_system": {
                "type": "restricted",
                "entries": [ROOT_READ, _write("project_roots"), _write("slash_tmp"), _write("tmpdir")],
            },
            "network": "restricted",
        },
        "cwd": "file:///work/space",
        "workspaceRoots": ["file:///work/space"],
        "windowsSandboxLevel": "disabled",
    }


def test_read_only_reads_everything_and_network_is_asked_for_explicitly() -> None:
    wire = process_sandbox(SandboxRequest(SandboxMode.READ_ONLY, network=True), "file:///w")
    assert wire["permissions"]["file_system"]["entries"] == [ROOT_READ]
    assert wire["permissions"]["network"] == "enabled"


def test_a_command_asks_by_mode_name_or_object() -> None:
    assert parse_command({"argv": ["true"]}).sandbox is None
    assert parse_command({"argv": ["true"], "sandbox": "read-only"}).sandbox == SandboxRequest(SandboxMode.READ_ONLY)
    asked = parse_command({"argv": ["true"], "sandbox": {"mode": "workspace-write", "network": True}}).sandbox
    assert asked == SandboxRequest(SandboxMode.WORKSPACE_WRITE, network=True)


@pytest.mark.parametrize(
    ("value", "param"),
    [
        ("danger-full-access", "commands.sandbox.mode"),
        ({"network": True}, "commands.sandbox.mode"),
        ({"mode": "read-only", "network": "yes"}, "commands.sandbox.network"),
        (["read-only"], "commands.sandbox"),
    ],
)
def test_a_bad_request_is_refused(value: object, param: str) -> None:
    with pytest.raises(ApiError) as refused:
        parse_sandbox(value)
    assert refused.value.status == 400 and refused.value.param == param
