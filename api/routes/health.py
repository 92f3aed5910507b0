"""Probes and metrics: /healthz (the process answers), /readyz (the database, and the broker when there is
one, answer), /metrics."""

from __future__ import annotations

import logging

from fastapi import APIRouter, Response
from sqlalchemy.engine import make_url
from sqlalchemy.exc import SQLAlchemyError

import memsched
from memsched.api.deps import DatabaseDep, MetricsDep, RunnerDep, SettingsDep
from memsched.api.errors import ApiError
from memsched.api.schemas import Health, Ready, error_responses

log = logging.getLogger(__name__)

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Health, summary="Liveness: the process answers")
async def healthz() -> Health:
    return Health(status="ok", version=memsched.__version__)


@router.get(
    "/readyz",
    response_model=Ready,
    # The embedded mode's answer stays as it was: the broker fields appear only in distributed mode.
    response_model_exclude_none=True,
    summary="Readiness: the database (and the broker, in distributed mode) answers",
    responses=error_responses(503),
)
def readyz(db: DatabaseDep, settings: SettingsDep, runner: RunnerDep) -> Ready:
    try:
        db.ping()
    except SQLAlchemyError as e:
        log.warning("readiness check failed: %s", e)
        raise ApiError(
            503, f"database {db.safe_url} is not reachable: {type(e).__name__}", headers={"Retry-After": "5"}
        ) from None
    database = make_url(db.url).get_backend_name()
    r = runner.readiness()  # BrokerUnavailable (503 + Retry-After) when the broker does not answer
    return Ready(
        status="ok",
        version=memsched.__version__,
        database=database,
        workers=r.workers,
        broker=r.broker,
        queue_depth=r.queue_depth,
    )


@router.get(
    "/metrics",
    summary="Prometheus metrics",
    description="memsched_jobs{state}, memsched_cache_hits_total; embedded mode: memsched_solve_seconds, "
    "memsched_solves_total{outcome}; distributed mode: memsched_queue_depth, memsched_workers_live.",
    response_class=Response,
    responses={200: {"content": {"text/plain": {}}, "description": "Prometheus text exposition format"}},
)
def metrics(m: MetricsDep) -> Response:
    return Response(content=m.render(), media_type="text/plain; version=0.0.4; charset=utf-8")
