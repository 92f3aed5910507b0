"""The job runner's failure paths, in-process: a solver that ignores its time limit and even the worker's alarm
(the watchdog kills the pool and the job fails with a reason), a worker that dies (the job is re-queued, then
failed after max_attempts), and the pool recovering for the next job. The pool forks here, so the children see
the monkeypatched solve function; the service itself spawns."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest

from memsched.api import crud
from memsched.api.db import Database
from memsched.api.examples import synthetic_trace
from memsched.api.metrics import Metrics
from memsched.api.runners import solve_process as worker
from memsched.api.runners.embedded import EmbeddedRunner, kill_pool
from memsched.api.settings import Settings
from memsched.api.tables import JobRow
from memsched.optimizer.budget import min_feasible_budget
from memsched.options import SolveOptions

HANG = 1
CRASH = 2

_real_run_solve = worker.run_solve


def _fake_run_solve(trace_json, budget_bytes, params, overrun_s, threads=None):  # type: ignore[no-untyped-def]
    if params.gap == HANG / 100:
        signal.signal(signal.SIGALRM, signal.SIG_IGN)  # a solver stuck where no signal reaches it
        time.sleep(300)
    if params.gap == CRASH / 100:
        os._exit(3)  # the worker dies (out of memory, segfault in a backend)
    return _real_run_solve(trace_json, budget_bytes, params, overrun_s, threads)


def _sleep_with_child() -> int:
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    time.sleep(300)
    return child.pid


@pytest.fixture
def runner_env(tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    monkeypatch.setattr(worker, "run_solve", _fake_run_solve)
    monkeypatch.setattr(
        EmbeddedRunner,
        "_new_pool",
        lambda self, n: ProcessPoolExecutor(max_workers=n, mp_context=multiprocessing.get_context("fork")),
    )
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'jobs.db'}", workers=1, job_grace_s=0.3, max_attempts=2)
    db = Database(settings.database_url)
    db.create_all()
    yield settings, db
    db.dispose()


def _submit(db: Database, gap: float, budget: int) -> str:
    tr = synthetic_trace(3)
    with db.session() as s:
        row, _ = crud.store_trace(s, "", tr)
        sub = crud.submit_job(
            s, "", row, str(budget), budget, SolveOptions(solver="heuristic", time_limit_s=0.2, gap=gap)
        )
        return sub.job.id


def test_watchdog_and_dead_workers(runner_env) -> None:  # type: ignore[no-untyped-def]
    settings, db = runner_env
    budget = min_feasible_budget(synthetic_trace(3)) * 2
    hang = _submit(db, HANG / 100, budget)
    crash = _submit(db, CRASH / 100, budget)
    ok = _submit(db, 0.05, budget)

    async def run() -> None:
        runner = EmbeddedRunner(db, settings, Metrics(lambda: {}))
        await runner.start()
        try:
            for jid in (hang, crash, ok):
                await runner.wait(jid, 30)
        finally:
            await runner.stop()

    asyncio.run(run())
    with db.session() as s:
        rows = {j: s.get(JobRow, j) for j in (hang, crash, ok)}
    h, c, o = rows[hang], rows[crash], rows[ok]
    assert h is not None and h.status == "failed"
    assert h.reason is not None and "did not stop" in h.reason and "worker was killed" in h.reason
    assert c is not None and c.status == "failed" and c.attempts == 2
    assert c.reason is not None and "worker process died" in c.reason and "interrupted 2 times" in c.reason
    # The pool was replaced after each kill or crash, and the next job ran normally.
    assert o is not None and o.status == "done" and o.schedule


def test_kill_takes_the_solver_binaries_with_the_pool() -> None:
    pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("fork"))
    fut = pool.submit(_sleep_with_child)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        procs = list(pool._processes.values())  # type: ignore[attr-defined]
        if procs and worker.descendants(procs[0].pid):
            break
        time.sleep(0.05)
    grandchildren = worker.descendants(procs[0].pid)
    assert grandchildren
    kill_pool(pool)
    with pytest.raises(Exception, match="terminated abruptly|BrokenProcessPool"):
        fut.result(timeout=10)
    time.sleep(0.2)
    for pid in grandchildren:
        assert _state(pid) in (None, "Z"), f"solver binary {pid} still running"  # gone, or dead awaiting reaping


def _state(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return None
    return stat[stat.rindex(")") + 2]
