"""The `memsched` command as a process (memsched.cli.run): its exit status, its streams and its files come out whole
although it skips the interpreter's teardown."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from memsched.cli import _exit_status
from memsched.optimizer.synthetic import make_trace
from memsched.schema import Schedule

CLI = [sys.executable, "-m", "memsched.cli"]


def test_a_solve_writes_its_schedule_and_its_json_whole(tmp_path: Path) -> None:
    trace = tmp_path / "chain.json"
    trace.write_text(make_trace(12, 2).model_dump_json())
    out = tmp_path / "schedule.json"
    done = subprocess.run(
        [*CLI, "solve", str(trace), "--budget", "60%", "--time-limit", "2", "-o", str(out), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)  # the whole JSON, flushed before the process left
    assert report["output"] == str(out)
    schedule = Schedule.model_validate_json(out.read_text())
    assert schedule.solver.objective_s == pytest.approx(report["solver"]["objective_s"])


def test_a_user_error_exits_2_with_one_line_and_no_traceback(tmp_path: Path) -> None:
    missing = tmp_path / "missing.json"
    done = subprocess.run(
        [*CLI, "solve", str(missing), "--budget", "50%", "--json"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert json.loads(done.stdout)["error"]["exit_code"] == 2
    assert "does not exist" in done.stderr and "Traceback" not in done.stderr


def test_a_usage_error_exits_2() -> None:
    done = subprocess.run([*CLI, "solve", "--no-such-option"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "No such option" in done.stderr


@pytest.mark.parametrize(("code", "status"), [(None, 0), (0, 0), (2, 2), (1, 1), (256 + 3, 3), ("bye", 1)])
def test_exit_statuses_are_pythons(code: object, status: int, capsys: pytest.CaptureFixture[str]) -> None:
    assert _exit_status(code) == status
    if isinstance(code, str):
        assert capsys.readouterr().err.strip() == code


def test_a_thread_left_running_takes_pythons_own_exit() -> None:
    import threading

    from memsched.cli import _left_running

    assert not _left_running()
    release = threading.Event()
    worker = threading.Thread(target=release.wait)  # not a daemon: Python's exit would wait for it
    worker.start()
    try:
        assert _left_running()
    finally:
        release.set()
        worker.join()
    assert not _left_running()
