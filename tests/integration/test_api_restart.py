"""Jobs survive a restart: queued ones run, interrupted (running) ones are re-queued, or failed with a reason
once interrupted too often. None vanish. Over SQLite and PostgreSQL."""

from __future__ import annotations

import signal
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy import create_engine
from sqlalchemy.orm import Session

from helpers.api import KEY_A, Server
from memsched.api import crud
from memsched.api.deps import owner_of
from memsched.api.examples import synthetic_trace
from memsched.api.runners.solve_process import descendants
from memsched.api.tables import Base, JobRow, TraceRow
from memsched.optimizer.budget import resolve_budget
from memsched.options import SolveOptions
from memsched.schema import JobStatus


def _job(owner: str, trace_id: str, budget: int, status: JobStatus, attempts: int) -> JobRow:
    options = SolveOptions(solver="heuristic", time_limit_s=5.0, gap=0.01)
    return JobRow(
        id=uuid.uuid4().hex,
        owner=owner,
        trace_id=trace_id,
        cache_key=crud.cache_key(trace_id, budget, options),
        budget_bytes=budget,
        budget_spec=str(budget),
        options=options.model_dump_json(),
        status=status,
        attempts=attempts,
        created_at=datetime.now(UTC),
        started_at=datetime.now(UTC) if status == JobStatus.RUNNING else None,
    )


def test_jobs_survive_a_restart(database_url: str, tmp_path) -> None:
    tr = synthetic_trace(6, scale=29)
    owner = owner_of(KEY_A)
    engine = create_engine(database_url)
    Base.metadata.create_all(engine)
    b = [resolve_budget(f"{p}%", tr) for p in (50, 60, 70)]
    # The state a killed server leaves behind: one job queued, one running (first attempt), one running that
    # was already interrupted once (max_attempts = 2 on this server).
    with Session(engine, expire_on_commit=False) as s:
        if s.get(TraceRow, (owner, tr.content_hash())) is None:
            s.add(TraceRow(owner=owner, id=tr.content_hash(), model=tr.model, n_layers=tr.n, body=tr.model_dump_json()))
        queued = _job(owner, tr.content_hash(), b[0], JobStatus.QUEUED, 0)
        running = _job(owner, tr.content_hash(), b[1], JobStatus.RUNNING, 1)
        doomed = _job(owner, tr.content_hash(), b[2], JobStatus.RUNNING, 2)
        s.add_all([queued, running, doomed])
        s.commit()
    engine.dispose()

    srv = Server(database_url, tmp_path / "server.log", api_keys=KEY_A, max_attempts="2").start()
    try:
        with srv.client() as c:
            q = c.get(f"/v1/schedules/{queued.id}", params={"wait": 20}).json()
            r = c.get(f"/v1/schedules/{running.id}", params={"wait": 20}).json()
            d = c.get(f"/v1/schedules/{doomed.id}").json()
            # Restart the server once more while nothing runs: done jobs stay done, nothing is re-run.
            srv.stop(signal.SIGTERM)
            srv.start()
            after = c.get(f"/v1/schedules/{running.id}").json()
            metrics = c.get("/metrics").text
    finally:
        srv.stop()
    assert q["status"] == "done" and q["attempts"] == 1
    assert r["status"] == "done" and r["attempts"] == 2
    assert "re-queued" in r["reason"] and "restart" in r["reason"]
    assert d["status"] == "failed"
    assert "interrupted by a server restart" in d["reason"] and "interrupted 2 times" in d["reason"]
    assert after["status"] == "done" and after["finished_at"] == r["finished_at"]
    assert 'memsched_jobs{state="running"} 0.0' in metrics and 'memsched_jobs{state="queued"} 0.0' in metrics
    assert "recovered jobs after restart: 1 re-queued, 1 failed" in srv.log()


def test_sigkill_mid_burst_loses_nothing(database_url: str, tmp_path) -> None:
    """Kill -9 the server right after a burst of submissions; after a restart every job finishes."""
    tr = synthetic_trace(30, scale=31)
    srv = Server(database_url, tmp_path / "server.log", api_keys=KEY_A, workers="1").start()
    ids = []
    try:
        with srv.client() as c:
            for p in range(40, 100, 4):
                r = c.post(
                    "/v1/schedules",
                    json={
                        "trace": tr.model_dump(mode="json"),
                        "budget": f"{p}%",
                        "solver": "heuristic",
                        "time_limit_s": 5,
                    },
                )
                assert r.status_code in (200, 202), r.text
                ids.append(r.json()["id"])
            workers = descendants(srv.proc.pid) if srv.proc else []
            srv.stop(signal.SIGKILL)
            srv.start()
            finals = [c.get(f"/v1/schedules/{i}", params={"wait": 20}).json() for i in ids]
    finally:
        srv.stop()
    assert [f["status"] for f in finals] == ["done"] * len(ids), finals
    # The killed server's worker processes noticed and exited: nothing is left behind.
    assert workers
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_alive(p) for p in workers):
        time.sleep(0.2)
    assert not [p for p in workers if _alive(p)]


def _alive(pid: int) -> bool:
    stat = Path(f"/proc/{pid}/stat")
    try:
        return stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return False
