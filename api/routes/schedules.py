"""Schedule jobs: POST /v1/schedules (202 + job, or 200 + schedule with ?wait), GET /v1/schedules/{id},
GET /v1/schedules/{id}/plot.png."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Path, Query, Response, status
from fastapi.concurrency import run_in_threadpool

from memsched.api import crud
from memsched.api.db import Database
from memsched.api.deps import DatabaseDep, MetricsDep, OwnerDep, RunnerDep, SettingsDep
from memsched.api.errors import ApiError
from memsched.api.routes.common import job_out, request_budget, resolve_trace
from memsched.api.schemas import JobId, JobList, JobOut, ScheduleRequest, error_responses
from memsched.api.tables import JobRow
from memsched.schema import JobStatus

log = logging.getLogger(__name__)

router = APIRouter(prefix="/v1/schedules", tags=["schedules"])

WaitQuery = Annotated[
    float,
    Query(
        ge=0,
        le=3600,
        allow_inf_nan=False,
        description="seconds to wait for the job to finish before answering (clipped to the server's "
        "MEMSCHED_MAX_WAIT_S); 0 answers at once",
    ),
]
_FINISHED = JobStatus.finished()


def _status_code(row: JobRow) -> int:
    # 200 once the job has an answer (a schedule, or the reason it failed); 202 while it is still pending.
    return status.HTTP_200_OK if row.status in _FINISHED else status.HTTP_202_ACCEPTED


@router.post(
    "",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=JobOut,
    summary="Solve a trace under a budget (asynchronous job)",
    description="Queues a solve and answers 202 with the job. A request that repeats a trace, budget and "
    "options gets the stored (or in-flight) job back without solving again (`cached: true`). With "
    "`?wait=SECONDS` the answer waits for the job and is 200 with the schedule if it finished in time. "
    "An infeasible budget is answered at once with 422 and `min_feasible_bytes`.",
    responses={
        200: {"model": JobOut, "description": "finished (done or failed) within the wait"},
        **error_responses(400, 401, 404, 413, 422, 429, 503),
    },
)
async def create_schedule(
    req: ScheduleRequest,
    response: Response,
    db: DatabaseDep,
    owner: OwnerDep,
    settings: SettingsDep,
    runner: RunnerDep,
    metrics: MetricsDep,
    wait: WaitQuery = 0,
) -> JobOut:
    given = "time_limit_s" in req.model_fields_set
    time_limit = req.time_limit_s if given else settings.default_time_limit_s
    if time_limit > settings.max_time_limit_s:
        raise ApiError(
            422,
            f"time_limit_s {time_limit:g} is above this server's ceiling of {settings.max_time_limit_s:g} s "
            "(MEMSCHED_MAX_TIME_LIMIT_S); ask for a shorter time limit",
            "time_limit_s",
        )
    params = req.options().model_copy(update={"time_limit_s": time_limit})

    def submit() -> tuple[JobRow, bool]:
        with db.session() as s:
            trace_row, trace = resolve_trace(s, owner, settings, req.trace_id, req.trace)
            # The quick check (one simulation) only where its number is the smallest these options reach; elsewhere
            # the job's solve finds that number.
            budget_bytes = request_budget(req.budget, trace, params.least_budget_is_offloads(trace))
            spec = str(req.budget)
            key = crud.cache_key(trace_row.id, budget_bytes, params)
            if not crud.has_job(s, owner, key) and crud.count_queued(s) >= settings.max_queued_jobs:
                raise ApiError(
                    429,
                    f"{settings.max_queued_jobs} jobs are already queued (MEMSCHED_MAX_QUEUED_JOBS); retry later",
                    None,
                    headers={"Retry-After": "10"},
                )
            # The job is handed to the runner before its row is committed (see crud.submit_job): a broker that
            # refuses it leaves nothing stored.
            sub = crud.submit_job(
                s, owner, trace_row, spec, budget_bytes, params, lambda row: runner.enqueue(row.id, params.time_limit_s)
            )
            return sub.job, sub.new_solve

    # The submission does database work and one simulation: run it off the event loop.
    row, new_solve = await run_in_threadpool(submit)
    if new_solve:
        runner.notify()
    else:
        metrics.cache_hits.inc()
    if wait > 0 and row.status not in _FINISHED:
        await runner.wait(row.id, min(wait, settings.max_wait_s))
        row = await run_in_threadpool(_load, db, owner, row.id)
    response.status_code = _status_code(row)
    response.headers["Location"] = f"/v1/schedules/{row.id}"
    return job_out(row, cached=not new_solve)


def _load(db: Database, owner: str, job_id: str) -> JobRow:
    with db.session() as s:
        row = crud.get_job(s, owner, job_id)
    if row is None:
        raise ApiError(404, f"no schedule job with id {job_id}", "job_id")
    return row


@router.get(
    "",
    response_model=JobList,
    summary="The caller's schedule jobs, newest first",
    description="Filter by `status`; page back with `before` (the previous page's `next_before`). Schedules are "
    "left out: GET /v1/schedules/{id} has each.",
    responses=error_responses(401, 422),
)
async def list_schedules(
    db: DatabaseDep,
    owner: OwnerDep,
    status_: Annotated[JobStatus | None, Query(alias="status", description="only jobs in this state")] = None,
    limit: Annotated[int, Query(ge=1, le=500, description="at most this many jobs")] = 50,
    before: Annotated[
        str | None,
        Query(
            description="only jobs created before this time (ISO 8601, e.g. a page's `next_before`)",
            json_schema_extra={"format": "date-time"},
            max_length=64,
        ),
    ] = None,
) -> JobList:
    # Parsed here, strictly: pydantic's lax datetime would take a number ('0.5') as seconds since 1970.
    try:
        until = datetime.fromisoformat(before.replace("Z", "+00:00")) if before is not None else None
    except ValueError:
        raise ApiError(
            422, f"before: {before!r} is not an ISO 8601 date-time such as 2026-11-24T17:30:06Z", "before"
        ) from None
    if until is not None and until.tzinfo is None:
        until = until.replace(tzinfo=UTC)

    def load() -> list[JobOut]:
        with db.session() as s:
            rows = crud.list_jobs(s, owner, status_, limit, until)
            return [job_out(row, with_schedule=False) for row in rows]

    jobs = await run_in_threadpool(load)
    return JobList(jobs=jobs, next_before=jobs[-1].created_at if len(jobs) == limit else None)


@router.post(
    "/{job_id}/cancel",
    response_model=JobOut,
    summary="Cancel a queued or running job",
    description="A queued job never runs; a running solve ends at its time limit and its answer is discarded. "
    "Cancelling a cancelled job answers it again; a job that is already done or failed answers 409. Asking the "
    "same question again (POST /v1/schedules) solves it anew.",
    responses=error_responses(401, 404, 409, 422),
)
async def cancel_schedule(job_id: Annotated[JobId, Path()], db: DatabaseDep, owner: OwnerDep) -> JobOut:
    def cancel() -> JobRow | None:
        with db.session() as s:
            return crud.cancel_job(s, owner, job_id)

    row = await run_in_threadpool(cancel)
    if row is None:
        raise ApiError(404, f"no schedule job with id {job_id}", "job_id")
    if row.status != JobStatus.CANCELLED:
        raise ApiError(409, f"the job is already {row.status}; there is nothing to cancel", "job_id")
    return job_out(row)


@router.get(
    "/{job_id}",
    response_model=JobOut,
    summary="A schedule job's state, and its schedule once done",
    description="status is queued, running, done (with `schedule`) or failed (with `reason`). "
    "`?wait=SECONDS` long-polls: it answers as soon as the job finishes, or after the wait.",
    responses={202: {"model": JobOut, "description": "still queued or running"}, **error_responses(401, 404, 422)},
)
async def get_schedule(
    job_id: Annotated[JobId, Path()],
    response: Response,
    db: DatabaseDep,
    owner: OwnerDep,
    settings: SettingsDep,
    runner: RunnerDep,
    wait: WaitQuery = 0,
) -> JobOut:
    row = await run_in_threadpool(_load, db, owner, job_id)
    if wait > 0 and row.status not in _FINISHED:
        await runner.wait(row.id, min(wait, settings.max_wait_s))
        row = await run_in_threadpool(_load, db, owner, job_id)
    response.status_code = _status_code(row)
    return job_out(row)


@router.get(
    "/{job_id}/plot.png",
    summary="The schedule's timeline as a PNG",
    response_class=Response,
    responses={
        200: {"content": {"image/png": {}}, "description": "the timeline plot"},
        **error_responses(401, 404, 409, 422, 503),
    },
)
async def get_plot(job_id: Annotated[JobId, Path()], db: DatabaseDep, owner: OwnerDep, runner: RunnerDep) -> Response:
    row = await run_in_threadpool(_load, db, owner, job_id)
    if row.status != JobStatus.DONE or row.schedule is None:
        raise ApiError(
            409, f"the job is {row.status}; a plot exists once it is done (GET /v1/schedules/{job_id})", "job_id"
        )
    if row.plot_png is None:
        try:
            import memsched.service.plot  # noqa: F401  # only to learn whether plotting is installed
        except ImportError:
            raise ApiError(503, "plotting is unavailable in this installation (no memsched.service.plot)") from None

        def load_trace() -> str:
            with db.session() as s:
                t = crud.get_trace(s, row.owner, row.trace_id)
                assert t is not None
                return t.body

        trace_json = await run_in_threadpool(load_trace)
        png = await runner.render_plot(trace_json, row.schedule)

        def store() -> None:
            with db.session() as s:
                crud.store_plot(s, row.id, png)

        await run_in_threadpool(store)
    else:
        png = row.plot_png
    return Response(content=png, media_type="image/png", headers={"Cache-Control": "private, max-age=86400"})
