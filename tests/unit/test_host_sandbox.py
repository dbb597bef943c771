"""The host check behind check-config's and the worker's warning that Codex cannot build its
own sandbox here: the three kernel settings that turn unprivileged user namespaces off, read
from a /proc tree made for each case (tests/contract/test_local_codex_sandbox.py reads the
real one, in a user namespace where they are off)."""

from __future__ import annotations

from pathlib import Path

import pytest

from controller.runners.local import codex_sandbox_problem


def proc(tmp_path: Path, **settings: str) -> Path:
    files = {
        "max_user_namespaces": "sys/user/max_user_namespaces",
        "unprivileged_userns_clone": "sys/kernel/unprivileged_userns_clone",
        "apparmor_restrict": "sys/kernel/apparmor_restrict_unprivileged_userns",
    }
    for name, value in settings.items():
        path = tmp_path / files[name]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(value + "\n")
    return tmp_path


def test_nothing_to_say_where_user_namespaces_are_allowed(tmp_path: Path) -> None:
    allowed = proc(tmp_path, max_user_namespaces="63456", unprivileged_userns_clone="1", apparmor_restrict="0")
    assert codex_sandbox_problem(True, allowed) is None
    assert codex_sandbox_problem(True, tmp_path / "absent") is None  # a kernel without these knobs


@pytest.mark.parametrize(
    ("setting", "value", "cause", "fix"),
    [
        ("max_user_namespaces", "0", "user.max_user_namespaces = 0", "sysctl -w user.max_user_namespaces=15000"),
        (
            "unprivileged_userns_clone",
            "0",
            "kernel.unprivileged_userns_clone = 0",
            "sysctl -w kernel.unprivileged_userns_clone=1",
        ),
        (
            "apparmor_restrict",
            "1",
            "kernel.apparmor_restrict_unprivileged_userns = 1",
            "sysctl -w kernel.apparmor_restrict_unprivileged_userns=0",
        ),
    ],
)
def test_each_setting_that_stops_it_is_named_with_its_fix_in_one_line(
    tmp_path: Path, setting: str, value: str, cause: str, fix: str
) -> None:
    problem = codex_sandbox_problem(True, proc(tmp_path, **{setting: value}))
    assert problem is not None and "\n" not in problem
    assert problem.startswith("Codex cannot build its own sandbox for executors on this host")
    assert cause in problem and f"Fix: {fix}" in problem


def test_executors_running_as_root_need_only_namespaces_left(tmp_path: Path) -> None:
    """Root may create user namespaces where unprivileged users may not."""
    restricted = proc(tmp_path, unprivileged_userns_clone="0", apparmor_restrict="1")
    assert codex_sandbox_problem(False, restricted) is None
    assert codex_sandbox_problem(True, restricted) is not None
    none_left = proc(tmp_path / "other", max_user_namespaces="0")
    assert codex_sandbox_problem(False, none_left) is not None


def test_several_causes_still_make_one_line(tmp_path: Path) -> None:
    problem = codex_sandbox_problem(True, proc(tmp_path, max_user_namespaces="0", apparmor_restrict="1"))
    assert problem is not None and "\n" not in problem
    assert "user.max_user_namespaces = 0; AppArmor" in problem
