"""Helpers the routes share: trace lookup, limits, budget resolution, and the job view."""

from __future__ import annotations

from sqlalchemy.orm import Session

from memsched.api import crud
from memsched.api.errors import ApiError, from_memsched_error
from memsched.api.schemas import JobOut
from memsched.api.settings import Settings
from memsched.api.tables import JobRow, TraceRow
from memsched.errors import MemschedError
from memsched.schema import JobStatus, Schedule, Trace
from memsched.service import IncomputableTraceError, check_computable, resolve_budget


def check_trace_limits(trace: Trace, settings: Settings, field: str) -> None:
    """The server's limits, and numbers the cost model can compute with (finite step and copy times)."""
    prefix = "" if field == "body" else f"{field}."
    try:
        check_computable(trace)
    except IncomputableTraceError as e:
        raise ApiError(422, str(e), f"{prefix}{e.where}") from None
    if trace.n > settings.max_layers:
        raise ApiError(
            422,
            f"the trace has {trace.n} layers, above this server's limit of {settings.max_layers} "
            "(MEMSCHED_MAX_LAYERS); trace at a coarser layer granularity, or raise the limit",
            f"{prefix}layers",
        )


def resolve_trace(
    s: Session, owner: str, settings: Settings, trace_id: str | None, trace: Trace | None
) -> tuple[TraceRow, Trace]:
    """The trace a request names: by id (this owner's only) or inline (stored on the way)."""
    if (trace_id is None) == (trace is None):
        raise ApiError(422, "give exactly one of 'trace_id' (a stored trace) and 'trace' (an inline trace)", "trace_id")
    if trace is not None:
        check_trace_limits(trace, settings, "trace")
        row, _ = crud.store_trace(s, owner, trace)
        return row, trace
    assert trace_id is not None
    stored = crud.get_trace(s, owner, trace_id)
    if stored is None:
        raise ApiError(404, f"no trace with id {trace_id}; POST it to /v1/traces first", "trace_id")
    return stored, Trace.model_validate_json(stored.body)


def request_budget(budget: int | str, trace: Trace, check_feasible: bool) -> int:
    """A request's budget in bytes (the service's resolve_budget, the CLI's too), or a 422 naming the problem or
    the smallest feasible budget."""
    try:
        return resolve_budget(budget, trace, check_feasible)
    except MemschedError as e:
        raise from_memsched_error(e, "budget") from None


def job_out(row: JobRow, cached: bool | None = None, with_schedule: bool = True) -> JobOut:
    return JobOut(
        id=row.id,
        status=JobStatus(row.status),  # stored as its string value
        trace_id=row.trace_id,
        budget=row.budget_spec,
        budget_bytes=row.budget_bytes,
        **crud.params_of(row).model_dump(),
        cached=row.cached if cached is None else cached,
        reason=row.reason,
        min_feasible_bytes=row.min_feasible_bytes,
        min_feasible_host_bytes=row.min_feasible_host_bytes,
        attempts=row.attempts,
        solve_s=row.solve_s,
        created_at=row.created_at,
        started_at=row.started_at,
        finished_at=row.finished_at,
        schedule=Schedule.model_validate_json(row.schedule) if row.schedule and with_schedule else None,
        links={
            "self": f"/v1/schedules/{row.id}",
            "trace": f"/v1/traces/{row.trace_id}",
            "plot": f"/v1/schedules/{row.id}/plot.png",
        },
    )
