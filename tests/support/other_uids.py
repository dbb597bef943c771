"""The local runner with executors of other uids (L2): uids no one on this machine has, a
Python interpreter such a uid may run, and a directory it may traverse."""

from __future__ import annotations

import grp
import os
import pwd
import shutil
import stat
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from controller.runners.local import UidRange
from tests.support.processes import assert_no_process_left


def free_uid_range(size: int, first: int = 2_000_000_000) -> UidRange:
    """``size`` consecutive uids, from ``first`` on, no user or group of this machine has."""
    taken = {e.pw_uid for e in pwd.getpwall()} | {g.gr_gid for g in grp.getgrall()}
    while any(uid in taken for uid in range(first, first + size)):
        first += size
    return UidRange(first, first + size - 1)


def python_for_others() -> str:
    """A Python interpreter another user can run (this one may live under root's 0700 home)."""
    for candidate in (sys.executable, shutil.which("python3"), "/usr/bin/python3"):
        if candidate and Path(candidate).exists():
            path = Path(candidate).resolve()
            if all(os.stat(p).st_mode & stat.S_IXOTH for p in (path, *path.parents)):
                return str(path)
    pytest.fail("no Python interpreter that the executor user may run")


@contextmanager
def shared_directory(prefix: str) -> Iterator[Path]:
    """A directory other uids can traverse (pytest's tmp_path is 0700 root); on the way out no
    process of it may be left, and it is removed."""
    base = Path(tempfile.mkdtemp(prefix=prefix))
    base.chmod(0o711)
    try:
        yield base
    finally:
        assert_no_process_left(base)
        shutil.rmtree(base, ignore_errors=True)
