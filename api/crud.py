"""Database operations of the routes and the job runner. Synchronous (SQLAlchemy sessions); the async code
calls them in worker threads so the event loop never waits on the database."""

from __future__ import annotations

import hashlib
import json
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from memsched.api.tables import JobRow, TraceRow, utcnow
from memsched.options import SolveOptions
from memsched.schema import JobStatus, Trace

log = logging.getLogger(__name__)


def cache_key(trace_hash: str, budget_bytes: int, params: SolveOptions) -> str:
    """Equal keys mean the same question: the same trace, budget bytes and solve options."""
    payload = json.dumps({"trace": trace_hash, "budget_bytes": budget_bytes, **params.job_fields()}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()


def text(value: str | None, limit: int | None = None) -> str | None:
    """A string as a text column can hold it: PostgreSQL refuses NUL characters, which JSON allows."""
    if value is None:
        return None
    value = value.replace("\x00", "\\0")
    return value[:limit] if limit else value


def store_trace(s: Session, owner: str, trace: Trace) -> tuple[TraceRow, bool]:
    """Store a trace under its content hash; (row, created). Storing it again is a no-op."""
    tid = trace.content_hash()
    row = s.get(TraceRow, (owner, tid))
    if row is not None:
        return row, False
    row = TraceRow(
        owner=owner, id=tid, model=text(trace.model, 256) or "", n_layers=trace.n, body=trace.model_dump_json()
    )
    s.add(row)
    try:
        s.commit()
    except IntegrityError:
        # A concurrent request stored the same trace first: the database's primary key settled it.
        s.rollback()
        existing = s.get(TraceRow, (owner, tid))
        assert existing is not None
        return existing, False
    return row, True


def get_trace(s: Session, owner: str, trace_id: str) -> TraceRow | None:
    return s.get(TraceRow, (owner, trace_id))


def get_job(s: Session, owner: str, job_id: str) -> JobRow | None:
    row = s.get(JobRow, job_id)
    return row if row is not None and row.owner == owner else None


def is_finished(s: Session, job_id: str) -> bool:
    status = s.scalar(select(JobRow.status).where(JobRow.id == job_id))
    return status is None or status in JobStatus.finished()


def list_jobs(s: Session, owner: str, status: JobStatus | None, limit: int, before: datetime | None) -> list[JobRow]:
    """This owner's jobs, newest first; `before` pages back (the created_at of the last job of the previous
    page)."""
    q = select(JobRow).where(JobRow.owner == owner)
    if status is not None:
        q = q.where(JobRow.status == status)
    if before is not None:
        q = q.where(JobRow.created_at < before)
    return list(s.scalars(q.order_by(JobRow.created_at.desc(), JobRow.id).limit(limit)).all())


def cancel_job(s: Session, owner: str, job_id: str) -> JobRow | None:
    """Cancel a queued or running job of this owner (a conditional UPDATE: a runner finishing it at the same
    moment either wins, and the job is done, or loses, and its answer is discarded). Returns the row as it is
    afterwards, or None when this owner has no such job."""
    row = get_job(s, owner, job_id)
    if row is None:
        return None
    s.execute(
        update(JobRow)
        .where(JobRow.id == job_id, JobRow.status.in_([JobStatus.QUEUED, JobStatus.RUNNING]))
        .values(status=JobStatus.CANCELLED, reason="cancelled by its owner", finished_at=utcnow())
        .execution_options(synchronize_session=False)
    )
    s.commit()
    s.refresh(row)
    return row


def has_job(s: Session, owner: str, key: str) -> bool:
    return s.scalar(select(JobRow.id).where(JobRow.owner == owner, JobRow.cache_key == key)) is not None


def count_queued(s: Session) -> int:
    return s.scalar(select(func.count()).select_from(JobRow).where(JobRow.status == JobStatus.QUEUED)) or 0


def jobs_by_state(s: Session) -> dict[str, int]:
    rows = s.execute(select(JobRow.status, func.count()).group_by(JobRow.status)).all()
    counts = {st.value: 0 for st in JobStatus}
    counts.update({str(status): int(n) for status, n in rows})
    return counts


@dataclass
class Submission:
    job: JobRow
    new_solve: bool
    """True when this request queued a solve; False when an existing job or a cached schedule answered it."""


def submit_job(
    s: Session,
    owner: str,
    trace_row: TraceRow,
    budget_spec: str,
    budget_bytes: int,
    params: SolveOptions,
    enqueue: Callable[[JobRow], None] | None = None,
) -> Submission:
    """Find or create the job for (owner, cache key): a repeat returns the same job; a question another
    owner already had answered is copied from that answer; a failed job is retried; else a new job is queued.

    `enqueue` (distributed mode) sends a job that needs a solve to the broker before the row is committed:
    if the broker refuses, the transaction is rolled back and nothing is stored, so no row waits for a
    message that was never sent. The row is flushed first, so the unique (owner, cache_key) constraint
    settles a race between replicas before anything is sent."""
    key = cache_key(trace_row.id, budget_bytes, params)

    def commit_solve(row: JobRow) -> None:
        if enqueue is not None:
            s.flush()
            try:
                enqueue(row)
            except BaseException:
                s.rollback()
                raise
        s.commit()

    for _ in range(3):
        existing = s.scalars(select(JobRow).where(JobRow.owner == owner, JobRow.cache_key == key)).first()
        if existing is not None:
            if existing.status not in (JobStatus.FAILED, JobStatus.CANCELLED):
                return Submission(existing, False)
            # A failure (time limit, crashed worker) may not repeat, and a cancelled question asked again is
            # wanted again: either is retried.
            existing.status = JobStatus.QUEUED
            existing.reason = text(f"resubmitted after it was {existing.status}: {existing.reason}", 4000)
            existing.attempts = 0
            existing.started_at = existing.finished_at = None
            commit_solve(existing)
            return Submission(existing, True)
        done = s.scalars(
            select(JobRow).where(JobRow.cache_key == key, JobRow.status == JobStatus.DONE).limit(1)
        ).first()
        row = JobRow(
            id=uuid.uuid4().hex,
            owner=owner,
            trace_id=trace_row.id,
            cache_key=key,
            budget_bytes=budget_bytes,
            budget_spec=text(budget_spec, 64) or "",
            options=params.model_dump_json(),
            status=JobStatus.QUEUED,
            attempts=0,
        )
        if done is not None:
            now = utcnow()
            row.status, row.schedule, row.cached = JobStatus.DONE, done.schedule, True
            row.solve_s, row.started_at, row.finished_at = done.solve_s, now, now
        s.add(row)
        try:
            if done is None:
                commit_solve(row)
            else:
                s.commit()
        except IntegrityError:
            # The same owner submitted the same question concurrently; the unique (owner, cache_key)
            # constraint let exactly one insert win. Loop to return the winner's job.
            s.rollback()
            continue
        return Submission(row, done is None)
    raise RuntimeError("could not insert or find the job after 3 tries")  # unreachable in practice


def params_of(row: JobRow) -> SolveOptions:
    return SolveOptions.model_validate_json(row.options)


@dataclass(frozen=True)
class ClaimedJob:
    id: str
    trace_json: str
    budget_bytes: int
    params: SolveOptions
    attempts: int


def claim_next(s: Session) -> ClaimedJob | None:
    """Move the oldest queued job to running and return it. The conditional UPDATE makes the claim atomic,
    so a job is never started twice even if two runners share the database."""
    for _ in range(5):
        row = s.scalars(
            select(JobRow).where(JobRow.status == JobStatus.QUEUED).order_by(JobRow.created_at).limit(1)
        ).first()
        if row is None:
            return None
        res = s.execute(
            update(JobRow)
            .where(JobRow.id == row.id, JobRow.status == JobStatus.QUEUED)
            .values(status=JobStatus.RUNNING, started_at=utcnow(), attempts=JobRow.attempts + 1)
            .execution_options(synchronize_session=False)
        )
        s.commit()
        if res.rowcount != 1:  # type: ignore[attr-defined]
            continue
        s.refresh(row)
        trace = s.get(TraceRow, (row.owner, row.trace_id))
        if trace is None:  # the trace row is written before its jobs and never deleted
            finish_job(s, row.id, None, "the job's trace is missing from the database; submit the trace again")
            continue
        return ClaimedJob(row.id, trace.body, row.budget_bytes, params_of(row), row.attempts)
    return None


def finish_job(
    s: Session,
    job_id: str,
    schedule_json: str | None,
    error: str | None,
    min_feasible_bytes: int | None = None,
    solve_s: float | None = None,
    min_feasible_host_bytes: int | None = None,
) -> None:
    values: dict[str, object] = {
        "status": JobStatus.DONE if schedule_json is not None else JobStatus.FAILED,
        "schedule": schedule_json,
        "min_feasible_bytes": min_feasible_bytes,
        "min_feasible_host_bytes": min_feasible_host_bytes,
        "solve_s": solve_s,
        "finished_at": utcnow(),
    }
    # On success keep any earlier note (re-queued after a restart): it explains attempts > 1.
    if error is not None:
        values["reason"] = text(error, 4000)
    # Conditional: a job cancelled meanwhile stays cancelled, and its answer is discarded.
    res = s.execute(
        update(JobRow)
        .where(JobRow.id == job_id, JobRow.status != JobStatus.CANCELLED)
        .values(**values)
        .execution_options(synchronize_session=False)
    )
    s.commit()
    if res.rowcount != 1:  # type: ignore[attr-defined]
        log.info("job %s was cancelled (or is gone): its answer is discarded", job_id)


def requeue_job(s: Session, job_id: str, reason: str, max_attempts: int) -> bool:
    """Put an interrupted job back in the queue, or fail it after max_attempts; True if re-queued."""
    row = s.get(JobRow, job_id)
    if row is None or row.status != JobStatus.RUNNING:
        return False
    if row.attempts >= max_attempts:
        row.status = JobStatus.FAILED
        row.reason = text(
            f"{reason}; interrupted {row.attempts} times, so it is not retried again (it may be what crashes "
            "the worker): resubmit it, perhaps with solver 'heuristic' or a shorter time_limit_s"
        )
        row.finished_at = utcnow()
        s.commit()
        return False
    row.status = JobStatus.QUEUED
    row.reason = f"{reason}; re-queued (attempt {row.attempts + 1} of {max_attempts})"
    row.started_at = None
    s.commit()
    return True


def recover(s: Session, max_attempts: int) -> tuple[int, int, int]:
    """After a restart: jobs left running were interrupted; re-queue or fail each. Returns
    (re-queued, failed, still queued)."""
    requeued = failed = 0
    for jid in s.scalars(select(JobRow.id).where(JobRow.status == JobStatus.RUNNING)).all():
        if requeue_job(s, jid, "interrupted by a server restart", max_attempts):
            requeued += 1
        else:
            failed += 1
    return requeued, failed, count_queued(s)


def claim_delivery(
    s: Session, job_id: str, worker: str, max_attempts: int, running_elsewhere: Callable[[], bool]
) -> ClaimedJob | str | None:
    """Distributed mode: a worker received the job's message. Returns the job to solve; or why not (a string:
    it is finished, or running on another worker, or failed now after too many interruptions); or None when
    the row is not there (yet: the API commits it right after sending the message).

    A message for a job that is still 'running' is a re-delivery: its worker was lost (kill -9, out of
    memory, a lost machine; Celery re-delivers thanks to acks_late + reject_on_worker_lost, or Redis after its
    visibility timeout). Unless Celery reports the job active on a live worker, the interruption is recorded
    in the row and the job runs again, up to `max_attempts` attempts; then it fails with the reason. Every
    claim is a conditional UPDATE, so two deliveries never both win."""
    row = s.get(JobRow, job_id)
    if row is None:
        return None
    seen_status, seen_attempts = row.status, row.attempts
    if seen_status in JobStatus.finished():
        return f"already {seen_status}"
    note = None
    if seen_status == JobStatus.RUNNING:
        if running_elsewhere():
            return "it is running on another live worker (a duplicate delivery)"
        lost = "its worker was lost mid-solve (killed, out of memory, or its machine went away)"
        if seen_attempts >= max_attempts:
            values: dict[str, object] = {
                "status": JobStatus.FAILED,
                "finished_at": utcnow(),
                "reason": text(
                    f"{lost} on each of its {seen_attempts} attempts, so it is not retried again (it may be what "
                    "crashes the worker): resubmit it, perhaps with solver 'heuristic' or a shorter time_limit_s",
                    4000,
                ),
            }
        else:
            note = (
                f"attempt {seen_attempts} was interrupted: {lost}; re-delivered to worker {worker} "
                f"(attempt {seen_attempts + 1} of {max_attempts})"
            )
    if note is not None or seen_status == JobStatus.QUEUED:
        values = {"status": JobStatus.RUNNING, "started_at": utcnow(), "attempts": JobRow.attempts + 1}
        if note is not None:
            values["reason"] = text(note, 4000)
    res = s.execute(
        update(JobRow)
        .where(JobRow.id == job_id, JobRow.status == seen_status, JobRow.attempts == seen_attempts)
        .values(**values)
        .execution_options(synchronize_session=False)
    )
    s.commit()
    if res.rowcount != 1:  # type: ignore[attr-defined]
        return "another delivery claimed it first"
    s.refresh(row)
    if row.status == JobStatus.FAILED:
        return f"failed after {seen_attempts} interrupted attempts"
    trace = s.get(TraceRow, (row.owner, row.trace_id))
    if trace is None:  # the trace row is written before its jobs and never deleted
        finish_job(s, row.id, None, "the job's trace is missing from the database; submit the trace again")
        return "its trace is missing"
    return ClaimedJob(row.id, trace.body, row.budget_bytes, params_of(row), row.attempts)


def answer_from_cache(s: Session, job_id: str) -> bool:
    """A running job whose question another owner's job has answered meanwhile takes that schedule instead of
    solving it again (the per-owner unique constraint cannot merge two owners' jobs at submission)."""
    row = s.get(JobRow, job_id)
    if row is None or row.status != JobStatus.RUNNING:
        return False
    done = s.scalars(
        select(JobRow)
        .where(JobRow.cache_key == row.cache_key, JobRow.status == JobStatus.DONE, JobRow.id != job_id)
        .limit(1)
    ).first()
    if done is None:
        return False
    row.status, row.schedule, row.cached = JobStatus.DONE, done.schedule, True
    row.solve_s, row.finished_at = done.solve_s, utcnow()
    s.commit()
    return True


def fail_unfinished(s: Session, job_id: str, reason: str) -> bool:
    """Fail a job that is still queued or running (a refused or killed delivery); True if it was."""
    res = s.execute(
        update(JobRow)
        .where(JobRow.id == job_id, JobRow.status.in_([JobStatus.QUEUED, JobStatus.RUNNING]))
        .values(status=JobStatus.FAILED, reason=text(reason, 4000), finished_at=utcnow())
        .execution_options(synchronize_session=False)
    )
    s.commit()
    return res.rowcount == 1  # type: ignore[attr-defined]


def store_plot(s: Session, job_id: str, png: bytes) -> None:
    row = s.get(JobRow, job_id)
    if row is not None:
        row.plot_png = png
        s.commit()
