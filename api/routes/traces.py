"""POST /v1/traces (validate, store, idempotent by content hash) and GET /v1/traces/{id}."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Path, Response, status

from memsched.api import crud
from memsched.api.deps import OwnerDep, SessionDep, SettingsDep
from memsched.api.errors import ApiError
from memsched.api.examples import EXAMPLE_TRACE
from memsched.api.routes.common import check_trace_limits
from memsched.api.schemas import StrictTrace, TraceId, TraceOut, TraceRef, error_responses
from memsched.api.tables import TraceRow
from memsched.schema import Trace

router = APIRouter(prefix="/v1/traces", tags=["traces"])


def _ref(row: TraceRow) -> TraceRef:
    return TraceRef(id=row.id, model=row.model, n_layers=row.n_layers, created_at=row.created_at)


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=TraceRef,
    summary="Store a trace",
    description="Validates the trace and stores it under its content hash (the id). Posting the same trace "
    "again returns the same id with 200 instead of 201.",
    responses={
        200: {"model": TraceRef, "description": "already stored: the existing id"},
        **error_responses(400, 401, 413, 422),
    },
)
def create_trace(
    trace: Annotated[StrictTrace, Body(openapi_examples={"three layers": {"value": EXAMPLE_TRACE}})],
    response: Response,
    s: SessionDep,
    owner: OwnerDep,
    settings: SettingsDep,
) -> TraceRef:
    check_trace_limits(trace, settings, "body")
    row, created = crud.store_trace(s, owner, trace)
    response.status_code = status.HTTP_201_CREATED if created else status.HTTP_200_OK
    response.headers["Location"] = f"/v1/traces/{row.id}"
    return _ref(row)


@router.get(
    "/{trace_id}",
    response_model=TraceOut,
    summary="Get a stored trace",
    responses=error_responses(401, 404, 422),
)
def get_trace(trace_id: Annotated[TraceId, Path()], s: SessionDep, owner: OwnerDep) -> TraceOut:
    row = crud.get_trace(s, owner, trace_id)
    if row is None:
        raise ApiError(404, f"no trace with id {trace_id}", "trace_id")
    return TraceOut(**_ref(row).model_dump(), trace=Trace.model_validate_json(row.body))
