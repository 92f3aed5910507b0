"""Output files: atomic for regular files, straight through for devices and FIFOs, '-' for stdout, and the
mode a plain open() would give (the umask for a new file, the old mode for a replaced one)."""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import tiny_trace
from memsched.errors import MemschedError
from memsched.io import load_trace, save_model, write_bytes, write_text


@pytest.fixture
def umask() -> Iterator[None]:
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


@pytest.mark.parametrize(("mask", "expected"), [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_new_file_gets_the_umask_like_open(tmp_path: Path, umask: None, mask: int, expected: int) -> None:
    os.umask(mask)
    tr = tiny_trace([1, 2], [2, 4], [10, 20])
    save_model(tr, tmp_path / "t.json")
    assert _mode(tmp_path / "t.json") == expected
    assert load_trace(tmp_path / "t.json") == tr
    # What plain open() gives under the same umask: the contract is "the same as open()".
    with open(tmp_path / "plain", "w"):
        pass
    assert _mode(tmp_path / "plain") == expected


def test_replacing_keeps_the_old_mode_and_leaves_no_temp_file(tmp_path: Path, umask: None) -> None:
    target = tmp_path / "s.json"
    target.write_text("old\n")
    target.chmod(0o640)
    os.umask(0o077)
    write_text(target, "new\n")
    assert target.read_text() == "new\n"
    assert _mode(target) == 0o640
    assert sorted(x.name for x in tmp_path.iterdir()) == ["s.json"]


def test_replacing_is_atomic_a_new_inode(tmp_path: Path) -> None:
    target = tmp_path / "s.json"
    target.write_text("old\n")
    before = target.stat().st_ino
    write_text(target, "new\n")
    assert target.stat().st_ino != before and target.read_text() == "new\n"


def test_follows_a_symlink_and_keeps_the_link(tmp_path: Path) -> None:
    real = tmp_path / "real.json"
    real.write_text("old\n")
    link = tmp_path / "link.json"
    link.symlink_to(real)
    write_text(link, "new\n")
    assert link.is_symlink() and real.read_text() == "new\n"


def test_char_device_is_written_through_not_replaced(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("making a device node (mknod) needs root")
    dev = tmp_path / "null"
    os.mknod(dev, 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # the same device as /dev/null
    before = dev.stat()
    write_text(dev, "a schedule\n")
    save_model(tiny_trace([1], [2], [10]), dev)
    after = dev.stat()
    assert stat.S_ISCHR(after.st_mode), "the device node became something else"
    assert (after.st_ino, after.st_rdev, after.st_mode) == (before.st_ino, before.st_rdev, before.st_mode)
    assert sorted(x.name for x in tmp_path.iterdir()) == ["null"]


def test_fifo_is_written_through(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []

    def reader() -> None:
        with open(fifo, "rb") as f:
            got.append(f.read())

    t = threading.Thread(target=reader)
    t.start()
    write_bytes(fifo, b"through the pipe\n")
    t.join(timeout=10)
    assert got == [b"through the pipe\n"]
    assert stat.S_ISFIFO(fifo.stat().st_mode)


def test_dash_is_stdout(capfdbinary: pytest.CaptureFixture[bytes], tmp_path: Path) -> None:
    tr = tiny_trace([1, 2], [2, 4], [10, 20])
    save_model(tr, "-")
    out = capfdbinary.readouterr().out
    assert out == (tr.model_dump_json(indent=2) + "\n").encode()
    assert not (Path.cwd() / "-").exists()


def test_error_while_writing_leaves_target_and_no_temp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "s.json"
    target.write_text("old\n")

    def full_disk(fd: int) -> None:
        raise OSError(28, "No space left on device")

    # The disk fills up after the bytes are written but before they are on disk: the last moment to fail.
    monkeypatch.setattr(os, "fsync", full_disk)
    with pytest.raises(MemschedError, match="cannot write .*: No space left on device; give a path"):
        write_text(target, "new\n")
    assert target.read_text() == "old\n"
    assert sorted(x.name for x in tmp_path.iterdir()) == ["s.json"]


def test_directory_target_is_a_user_error(tmp_path: Path) -> None:
    with pytest.raises(MemschedError, match="is a directory; give a file path"):
        write_text(tmp_path, "x")


def test_new_file_in_new_folder(tmp_path: Path) -> None:
    write_text(tmp_path / "a" / "b" / "c.json", "x")
    assert (tmp_path / "a" / "b" / "c.json").read_text() == "x"
