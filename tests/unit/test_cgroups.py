"""Where a sandbox's cgroup lives (``controller/runners/local/cgroups.py``): the cgroup2 mount and this
process's own cgroup, read from their /proc texts, and the names derived from them."""

from __future__ import annotations

from pathlib import Path

from controller.runners.local import cgroups

HYBRID = """\
tmpfs /sys/fs/cgroup tmpfs rw,relatime,mode=755 0 0
cgroup /sys/fs/cgroup/memory cgroup rw,relatime,memory 0 0
cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0
"""
PURE_V2 = "cgroup2 /sys/fs/cgroup cgroup2 ro,nosuid,nodev,noexec,relatime 0 0\n"
V1_ONLY = "cgroup /sys/fs/cgroup/memory cgroup rw,relatime,memory 0 0\n"


def test_the_cgroup2_mount_is_found_on_hybrid_and_pure_hosts_and_none_with_v1_only() -> None:
    assert cgroups.mount_point(HYBRID) == Path("/sys/fs/cgroup/unified")
    assert cgroups.mount_point(PURE_V2) == Path("/sys/fs/cgroup")
    assert cgroups.mount_point(V1_ONLY) is None


def test_own_cgroup_is_the_unified_line() -> None:
    assert cgroups.own_cgroup("4:memory:/a\n0::/system.slice/worker.service\n") == "/system.slice/worker.service"
    assert cgroups.own_cgroup("0::/\n") == "/"
    assert cgroups.own_cgroup("4:memory:/a\n") is None


def test_two_state_directories_never_share_a_sessions_cgroup(tmp_path: Path) -> None:
    under = Path("/sys/fs/cgroup/sandbox-controller")
    a = cgroups.sandbox_cgroup(under, tmp_path / "a", "sess_1-0123456789")
    b = cgroups.sandbox_cgroup(under, tmp_path / "b", "sess_1-0123456789")
    assert a.parent == b.parent == under and a != b and a.name.endswith(".sess_1-0123456789")
    assert cgroups.sandbox_cgroup(under, tmp_path / "a", "sess_1-0123456789") == a


def test_the_executor_joins_its_cgroup_before_it_execs() -> None:
    argv = cgroups.join_argv(Path("/cg/x"), ["codex", "exec-server"])
    assert argv[:2] == ["sh", "-c"] and argv[3:] == ["sh", "/cg/x/cgroup.procs", "codex", "exec-server"]
    assert argv[2].index("echo 0 >") < argv[2].index("exec")
