"""POST /v1/sweeps (the CLI's `memsched sweep`, via the same service function), POST /v1/sweeps/timeline (a
schedule's step as the page draws it), and the page itself: GET /ui/traces/{id} and Plotly's bundle from the
installed package at GET /ui/plotly.min.js (no CDN: it works on an air-gapped cluster)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse

from memsched.api import crud
from memsched.api.deps import DatabaseDep, OwnerDep, SettingsDep
from memsched.api.errors import ApiError, from_memsched_error
from memsched.api.routes.common import resolve_trace
from memsched.api.schemas import SweepOut, SweepRequest, TimelineRequest, TraceId, error_responses
from memsched.errors import InfeasibleBudgetError, MemschedError
from memsched.schema import Trace, check_schedule
from memsched.service.sweep import DEFAULT_POINT_TIME_LIMIT_S, sweep_trace

router = APIRouter(prefix="/v1/sweeps", tags=["sweeps"])
ui = APIRouter(prefix="/ui", include_in_schema=False)


@router.post(
    "",
    response_model=SweepOut,
    summary="The curve of step time against budget",
    description="Solves `points` budgets from the smallest feasible one (or `budget_from`) to keep-all's peak (or "
    "`budget_to`), placed where the curve bends; each with its overhead, true lower bound and status, and the "
    "knee points. Synchronous: it answers when every point is solved (`points` x `time_limit_s` over the "
    "server's solver workers). A range that is empty answers 422; one wholly below the smallest feasible budget "
    "answers 422 with `min_feasible_bytes`.",
    responses=error_responses(400, 401, 404, 413, 422),
)
async def create_sweep(req: SweepRequest, db: DatabaseDep, owner: OwnerDep, settings: SettingsDep) -> SweepOut:
    given = "time_limit_s" in req.model_fields_set
    limit = req.time_limit_s if given else DEFAULT_POINT_TIME_LIMIT_S
    if limit > settings.max_time_limit_s:
        raise ApiError(
            422,
            f"time_limit_s {limit:g} is above this server's ceiling of {settings.max_time_limit_s:g} s per point "
            "(MEMSCHED_MAX_TIME_LIMIT_S); ask for a shorter time limit",
            "time_limit_s",
        )
    # A sweep holds its request for every point: its solving, spread over the workers, is bounded like one job's.
    total = req.points * limit / settings.workers
    if total > settings.max_time_limit_s:
        raise ApiError(
            422,
            f"{req.points} points x {limit:g} s over {settings.workers} workers is {total:.0f} s, above this "
            f"server's ceiling of {settings.max_time_limit_s:g} s (MEMSCHED_MAX_TIME_LIMIT_S); ask for fewer "
            "points or a shorter time_limit_s",
            "points",
        )
    options = req.options().model_copy(update={"time_limit_s": limit})

    def run() -> SweepOut:
        with db.session() as s:
            row, trace = resolve_trace(s, owner, settings, req.trace_id, req.trace)
        try:
            res = sweep_trace(
                trace,
                options,
                points=req.points,
                lo=req.budget_from,
                hi=req.budget_to,
                workers=settings.workers,
                refine=req.refine,
            )
        except InfeasibleBudgetError as e:
            raise from_memsched_error(e, "budget_to") from None
        except MemschedError as e:
            raise from_memsched_error(e, _field_of(str(e))) from None
        return SweepOut(trace_id=row.id, **res.model_dump())

    return await run_in_threadpool(run)


def _field_of(message: str) -> str:
    """The request field a sweep's error names (its message starts with it)."""
    head = message.split(":", 1)[0]
    fields = {
        "from": "budget_from",
        "to": "budget_to",
        "budget range": "budget_from",
        "points": "points",
        "host_budget": "host_budget",
    }
    return fields.get(head, "budget_from")


@router.post(
    "/timeline",
    summary="A schedule's simulated step, as the sweep page draws it",
    description="Memory per stage and the events of the compute, device->host and host->device streams (each with "
    "its layer's name and action), simulated on the link the schedule was planned for.",
    responses=error_responses(400, 401, 404, 413, 422),
)
async def timeline(req: TimelineRequest, db: DatabaseDep, owner: OwnerDep) -> dict[str, Any]:
    from memsched.service.sweep_page import timeline_doc

    def run() -> dict[str, Any]:
        with db.session() as s:
            row = crud.get_trace(s, owner, req.trace_id)
            if row is None:
                raise ApiError(404, f"no trace with id {req.trace_id}; POST it to /v1/traces first", "trace_id")
            trace = Trace.model_validate_json(row.body)
        try:
            check_schedule(req.schedule, trace)
        except MemschedError as e:
            raise from_memsched_error(e, "schedule") from None
        return timeline_doc(trace, req.schedule)

    return await run_in_threadpool(run)


@ui.get("/traces/{trace_id}", response_class=HTMLResponse)
def trace_page(trace_id: Annotated[TraceId, Path()]) -> HTMLResponse:
    """The sweep page of a stored trace. It holds no data: its script asks the API (with the caller's key)."""
    from memsched.service.sweep_page import served_page

    return HTMLResponse(served_page(trace_id))


@ui.get("/plotly.min.js")
def plotly_bundle() -> Response:
    """Plotly's browser bundle from the installed `plotly` package."""
    from memsched.service.sweep_page import plotly_js

    return Response(plotly_js(), media_type="application/javascript", headers={"cache-control": "max-age=86400"})
