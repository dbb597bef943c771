"""``controller/files.py``: small files read without blocking, written privately and atomically."""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from controller import files


def test_a_regular_file_and_a_symlink_to_one_are_read(tmp_path: Path) -> None:
    """A mounted Secret is a symlink chain to a regular file: followed."""
    target = tmp_path / "..data" / "secret"
    target.parent.mkdir()
    target.write_text("value\n")
    (tmp_path / "secret").symlink_to("..data/secret")
    assert files.read_small(tmp_path / "secret") == "value\n"


def test_a_fifo_is_refused_at_once_even_with_a_writer_that_never_writes(tmp_path: Path) -> None:
    """Opening a FIFO to read blocks until a writer comes; read_small opens it non-blocking and
    refuses it before reading, with or without a writer holding it open."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    outcome: list[str] = []

    def read() -> None:
        try:
            files.read_small(fifo)
        except files.NotAFile as exc:
            outcome.append(exc.strerror or "")

    for with_writer in (False, True):
        writer = os.open(fifo, os.O_RDWR | os.O_NONBLOCK) if with_writer else None
        try:
            thread = threading.Thread(target=read, daemon=True)
            thread.start()
            thread.join(5)
            assert not thread.is_alive(), "read_small blocked on a FIFO"
        finally:
            if writer is not None:
                os.close(writer)
    assert outcome == ["is a FIFO, not a regular file"] * 2


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (lambda p: p.mkdir(), "is a directory, not a regular file"),
        (lambda p: p.write_bytes(b"x" * 70_000), "is larger than 65536 bytes"),
        (lambda p: p.write_bytes(b"\xff\xfe not text"), "is not UTF-8 text"),
    ],
    ids=["directory", "too-large", "not-utf8"],
)
def test_what_is_no_small_text_file_is_refused_in_words(
    tmp_path: Path, make: Callable[[Path], object], reason: str
) -> None:
    path = tmp_path / "thing"
    make(path)
    with pytest.raises(files.UnusableFile) as refused:
        files.read_small(path)
    assert refused.value.strerror == reason


def test_a_missing_file_is_file_not_found_and_a_device_is_refused(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        files.read_small(tmp_path / "missing")
    with pytest.raises(files.NotAFile, match="is a character device"):
        files.read_small("/dev/zero")  # would never end


def test_written_privately_whatever_the_umask(tmp_path: Path) -> None:
    """0600 for the file and 0700 for each directory it creates, under umask 000; an existing
    directory is left as it is; nothing partial is left beside the file."""
    existing = tmp_path / "existing"
    existing.mkdir(mode=0o755)
    existing.chmod(0o755)
    target = existing / "new" / "deeper" / "secrets"
    old = os.umask(0)
    try:
        files.prove_writable(target)
        assert not target.exists()
        files.write_private(target, "first")
        files.write_private(target, "second")
    finally:
        os.umask(old)
    assert target.read_text() == "second"
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    for directory in (existing / "new", existing / "new" / "deeper"):
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert stat.S_IMODE(existing.stat().st_mode) == 0o755
    assert sorted(p.name for p in target.parent.iterdir()) == ["secrets"]


def test_a_place_that_cannot_take_the_file_is_refused_beforehand(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    (tmp_path / "a-directory").mkdir()
    with pytest.raises(files.NotAFile, match="is not a directory"):
        files.prove_writable(tmp_path / "a-file" / "secrets")
    with pytest.raises(files.NotAFile, match="is a directory, not a regular file"):
        files.prove_writable(tmp_path / "a-directory")
