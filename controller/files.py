"""Small files the controller reads or writes that others may tamper with: secrets, mostly.

``read_small`` reads a short text file without ever blocking on it: it opens the path
non-blocking and refuses anything but a regular file (a FIFO would block the reader until
something writes to it; a device or a directory is never a secret), anything larger than a
limit, and text that is not UTF-8. Symlinks are followed, so a mounted Kubernetes Secret
(``name -> ..data/name``) reads as the file it points to.

``write_private`` replaces a file atomically with one only this uid can read (0600 whatever
the umask), creating missing parent directories 0700 (again whatever the umask); ``prove_writable``
shows beforehand that it would succeed, by creating and removing a file where it would write.

``locked`` holds an exclusive ``flock`` on a lock file for a block (the local runner's session,
checkpoint and uid locks).

Every problem is an ``OSError`` whose ``strerror`` says what is wrong in words, never the
file's content.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

MAX_SECRET_FILE_BYTES = 64 * 1024
"""More than any list of secrets needs; a larger file is a mistake (or a device)."""


class UnusableFile(OSError):
    """The path exists but is not a file to read or replace (``strerror`` says why)."""

    def __init__(self, path: Path | str, reason: str) -> None:
        super().__init__(errno.EINVAL, reason, str(path))


class NotAFile(UnusableFile):
    """The path is a FIFO, a directory, a socket or a device: never a file to read or replace."""


def kind(mode: int) -> str:
    """What a ``st_mode`` is, in words."""
    for test, name in (
        (stat.S_ISREG, "a regular file"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISLNK, "a symlink"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def read_small(path: Path | str, limit: int = MAX_SECRET_FILE_BYTES) -> str:
    """The text of a regular file of at most ``limit`` bytes; never blocks on a FIFO."""
    descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    try:
        info = os.fstat(descriptor)
        if not stat.S_ISREG(info.st_mode):
            raise NotAFile(path, f"is {kind(info.st_mode)}, not a regular file")
        if info.st_size > limit:
            raise UnusableFile(path, f"is larger than {limit} bytes")
        data = b""
        while len(data) <= limit:
            chunk = os.read(descriptor, limit + 1 - len(data))
            if not chunk:
                break
            data += chunk
        if len(data) > limit:
            raise UnusableFile(path, f"is larger than {limit} bytes")
    finally:
        os.close(descriptor)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise UnusableFile(path, "is not UTF-8 text") from None


def make_private_directory(directory: Path) -> None:
    """Create ``directory`` and any missing parent 0700 (each one this call creates is chmod'ed
    to 0700, so the umask cannot widen it); an existing one is left as it is."""
    missing = []
    for candidate in (directory, *directory.parents):
        if candidate.exists() or candidate.is_symlink():
            break
        missing.append(candidate)
    for created in reversed(missing):
        try:
            created.mkdir(mode=0o700)
        except FileExistsError:
            continue  # made by someone else meanwhile: not ours to change
        os.chmod(created, 0o700)
    if not directory.is_dir():
        raise NotAFile(directory, "is not a directory")


def _check_target(path: Path) -> None:
    """A file that exists where we would write must be a regular file (or a symlink to one)."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISREG(info.st_mode):
        raise NotAFile(path, f"is {kind(info.st_mode)}, not a regular file")


def prove_writable(path: Path) -> None:
    """Show that ``write_private(path, …)`` would succeed: its directory exists (created 0700 if
    missing), a file can be created in it and removed, and ``path`` is a regular file or absent."""
    make_private_directory(path.parent)
    _check_target(path)
    descriptor, probe = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.probe.")
    os.close(descriptor)
    os.unlink(probe)


def write_private(path: Path, text: str) -> None:
    """Replace ``path`` atomically with ``text`` in a file mode 0600 (whatever the umask): written
    beside it, flushed to disk and renamed into place, so a reader sees the old or the new
    content, never a part."""
    make_private_directory(path.parent)
    _check_target(path)
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.fchmod(descriptor, 0o600)
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    directory = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


@contextmanager
def locked(path: Path, wait: bool = True) -> Iterator[bool]:
    """An exclusive ``flock`` on ``path`` (created 0600) for the block; with ``wait=False`` the
    block learns whether it got it (False: another holds it now). Closing the file releases it,
    whatever ends the block."""
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(descriptor)
