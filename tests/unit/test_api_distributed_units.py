"""The distributed mode's pieces that need no running broker: settings checks, the delivery claim's state
machine on a real (SQLite) database, submissions that roll back when the broker refuses, and a replica whose
broker is unreachable answering 503 with Retry-After."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from helpers.api import free_port
from memsched.api import crud
from memsched.api.db import Database
from memsched.api.examples import synthetic_trace
from memsched.api.runners.celery_runner import broker_kind, job_versions, safe_broker_url
from memsched.api.settings import Settings
from memsched.api.tables import JobRow
from memsched.cli import main
from memsched.errors import MemschedError
from memsched.options import SolveOptions
from memsched.schema import JobStatus

pytest.importorskip("celery", reason="celery is not installed (pip install -e '.[api]')")

HEUR = SolveOptions(solver="heuristic", time_limit_s=2.0)


def test_visibility_timeout_must_exceed_the_largest_hard_limit() -> None:
    s = Settings(max_time_limit_s=60, job_grace_s=10)
    assert (s.soft_limit_s(30), s.hard_limit_s(30), s.max_hard_limit_s) == (40, 50, 80)
    assert s.effective_visibility_timeout_s == 90
    with pytest.raises(ValueError, match=r"visibility_timeout_s 80 is not above the largest hard time limit, 80 s"):
        Settings(max_time_limit_s=60, job_grace_s=10, visibility_timeout_s=80)
    assert Settings(max_time_limit_s=60, job_grace_s=10, visibility_timeout_s=81).effective_visibility_timeout_s == 81


def test_broker_urls() -> None:
    assert broker_kind("redis://h:6379/0") == broker_kind("rediss://h") == "redis"
    assert broker_kind("amqp://u:p@h:5672//") == broker_kind("pyamqp://h") == "amqp"
    with pytest.raises(MemschedError, match=r"'sqs://u:\*\*\*@h'.*use redis://"):
        broker_kind("sqs://u:secret@h")
    assert safe_broker_url("amqp://guest:guest@h:5672//") == "amqp://guest:***@h:5672//"
    assert safe_broker_url("redis://h:6379/0") == "redis://h:6379/0"
    assert set(job_versions()) == {"memsched", "trace_schema", "schedule_schema"}


def test_worker_needs_a_broker(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MEMSCHED_BROKER_URL", raising=False)
    with pytest.raises(SystemExit) as e:
        main(["worker"])
    assert e.value.code == 2 and "memsched worker needs a broker: set MEMSCHED_BROKER_URL" in capsys.readouterr().err


@pytest.fixture
def db(tmp_path) -> Iterator[Database]:  # type: ignore[no-untyped-def]
    d = Database(f"sqlite:///{tmp_path / 'jobs.db'}")
    d.create_all()
    yield d
    d.dispose()


def _submit(db: Database, budget: int, owner: str = "", enqueue=None) -> str:  # type: ignore[no-untyped-def]
    with db.session() as s:
        row, _ = crud.store_trace(s, owner, synthetic_trace(3))
        return crud.submit_job(s, owner, row, str(budget), budget, HEUR, enqueue).job.id


def _row(db: Database, job_id: str) -> JobRow:
    with db.session() as s:
        row = s.get(JobRow, job_id)
        assert row is not None
        return row


def test_claims_redeliveries_and_the_attempt_bound(db: Database) -> None:
    jid = _submit(db, 10**9)
    with db.session() as s:
        first = crud.claim_delivery(s, jid, "w1", 2, lambda: False)
    assert isinstance(first, crud.ClaimedJob) and first.attempts == 1 and first.params == HEUR
    # A duplicate delivery while the job runs on a live worker: not run twice.
    with db.session() as s:
        assert "another live worker" in str(crud.claim_delivery(s, jid, "w2", 2, lambda: True))
    # Re-delivered after its worker was lost: runs again, and the row says so.
    with db.session() as s:
        second = crud.claim_delivery(s, jid, "w2", 2, lambda: False)
    assert isinstance(second, crud.ClaimedJob) and second.attempts == 2
    reason = _row(db, jid).reason or ""
    assert (
        "attempt 1 was interrupted: its worker was lost mid-solve" in reason and "re-delivered to worker w2" in reason
    )
    # Lost again at the bound: failed with the reason, not run a third time.
    with db.session() as s:
        assert crud.claim_delivery(s, jid, "w3", 2, lambda: False) == "failed after 2 interrupted attempts"
    row = _row(db, jid)
    assert row.status == JobStatus.FAILED and "on each of its 2 attempts, so it is not retried again" in (
        row.reason or ""
    )
    with db.session() as s:
        assert crud.claim_delivery(s, jid, "w3", 2, lambda: False) == "already failed"
        assert crud.claim_delivery(s, "0" * 32, "w3", 2, lambda: False) is None


def test_finished_jobs_and_refusals(db: Database) -> None:
    jid = _submit(db, 10**9)
    with db.session() as s:
        assert crud.fail_unfinished(s, jid, "refused by worker w: it runs memsched 9")
        assert not crud.fail_unfinished(s, jid, "again")  # finished rows are left alone
    assert _row(db, jid).reason == "refused by worker w: it runs memsched 9"


def test_another_owners_answer_fills_a_running_job(db: Database) -> None:
    a, b = _submit(db, 10**9, owner="a"), _submit(db, 10**9, owner="b")
    assert a != b  # one job per owner: the unique constraint is per (owner, cache key)
    with db.session() as s:
        crud.claim_delivery(s, a, "w", 2, lambda: False)
        crud.finish_job(s, a, '{"fake": "schedule"}', None, solve_s=1.5)
        crud.claim_delivery(s, b, "w", 2, lambda: False)
        assert crud.answer_from_cache(s, b)
    row = _row(db, b)
    assert row.status == JobStatus.DONE and row.cached and row.schedule == '{"fake": "schedule"}'


def test_a_refused_message_stores_nothing(db: Database) -> None:
    def refuse(_row: JobRow) -> None:
        raise ConnectionError("broker down")

    with pytest.raises(ConnectionError):
        _submit(db, 10**9, enqueue=refuse)
    with db.session() as s:
        assert crud.jobs_by_state(s) == {"queued": 0, "running": 0, "done": 0, "failed": 0, "cancelled": 0}
    sent: list[str] = []
    jid = _submit(db, 10**9, enqueue=lambda row: sent.append(row.id))
    assert sent == [jid] and _row(db, jid).status == JobStatus.QUEUED
    assert _submit(db, 10**9, enqueue=lambda row: sent.append(row.id)) == jid and sent == [jid]  # a repeat


def test_replica_with_its_broker_down_answers_503(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from memsched.api import create_app

    # A real broker URL on a port where nothing listens: the replica itself is up, its broker is not.
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'r.db'}", broker_url=f"redis://127.0.0.1:{free_port()}/0")
    body = {"trace": synthetic_trace(3).model_dump(mode="json"), "budget": "70%", "solver": "heuristic"}
    with TestClient(create_app(settings)) as c:
        r = c.post("/v1/schedules", json=body)
        assert r.status_code == 503 and r.headers["Retry-After"] == "5", r.text
        assert "redis broker" in r.json()["detail"] and "nothing was stored" in r.json()["detail"]
        ready = c.get("/readyz")
        assert ready.status_code == 503 and "broker redis://127.0.0.1" in ready.json()["detail"]
        assert c.get("/metrics").status_code == 200
        assert 'memsched_jobs{state="queued"} 0.0' in c.get("/metrics").text
