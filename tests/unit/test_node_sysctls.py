"""The real-node tier gives the machine back its own global sysctls, even after a run that was
killed before its teardown (the kubelet had set its own values by then)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.node.node import GLOBAL_SYSCTLS, _machine_sysctls


def _proc(tmp_path: Path, values: dict[str, str]) -> Path:
    proc = tmp_path / "proc"
    for path, value in values.items():
        (proc / path).parent.mkdir(parents=True, exist_ok=True)
        (proc / path).write_text(value + "\n")
    return proc


MACHINE = {"vm/overcommit_memory": "0", "kernel/panic": "0", "kernel/panic_on_oops": "0"}
KUBELET = {"vm/overcommit_memory": "1", "kernel/panic": "10", "kernel/panic_on_oops": "1"}


def test_a_first_run_saves_the_machines_values(tmp_path: Path) -> None:
    saved_at = tmp_path / "run" / "sysctls.json"
    assert set(MACHINE) == set(GLOBAL_SYSCTLS)
    assert _machine_sysctls(_proc(tmp_path, MACHINE), saved_at) == MACHINE
    assert json.loads(saved_at.read_text()) == MACHINE


def test_the_run_after_a_killed_one_restores_the_saved_values_not_the_kubelets(tmp_path: Path) -> None:
    saved_at = tmp_path / "run" / "sysctls.json"
    _machine_sysctls(_proc(tmp_path / "before", MACHINE), saved_at)  # the killed run
    assert _machine_sysctls(_proc(tmp_path / "after", KUBELET), saved_at) == MACHINE


def test_a_truncated_saved_file_is_not_trusted(tmp_path: Path) -> None:
    saved_at = tmp_path / "sysctls.json"
    saved_at.write_text('{"vm/overcommit_memory": "0"')
    assert _machine_sysctls(_proc(tmp_path, MACHINE), saved_at) == MACHINE
    assert json.loads(saved_at.read_text()) == MACHINE
