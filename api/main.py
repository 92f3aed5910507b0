"""The FastAPI application: create_app(settings) wires settings, database, job runner, routes and errors."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import Depends, FastAPI
from sqlalchemy.exc import SQLAlchemyError

import memsched
from memsched.api import crud
from memsched.api.db import Database
from memsched.api.deps import reject_unknown_query
from memsched.api.docs import install_docs
from memsched.api.errors import install_error_handlers
from memsched.api.metrics import Metrics
from memsched.api.middleware import BodySizeLimit
from memsched.api.routes import compare, health, schedules, sweeps, traces
from memsched.api.runners import Runner
from memsched.api.runners.celery_runner import CeleryRunner
from memsched.api.runners.embedded import EmbeddedRunner
from memsched.api.settings import Settings, get_settings

log = logging.getLogger(__name__)

DESCRIPTION = """\
The memsched optimizer over HTTP: post a layer-level cost trace, get back a keep / offload / recompute
schedule that fits a GPU-memory budget.

* Units are seconds and bytes. A budget is an integer number of bytes, or a string such as `"8GiB"` or
  `"50%"` (static bytes + 50% of the keep-all activation peak).
* Solves are asynchronous jobs: `POST /v1/schedules` answers 202 with a job; poll `GET /v1/schedules/{id}`
  (or pass `?wait=SECONDS`). Identical requests are answered from the stored result.
* With `MEMSCHED_API_KEYS` set, send `Authorization: Bearer <key>`; each key sees only its own traces and jobs.
* Errors are JSON: `{"detail": "...", "field": "..."}` with a 4xx status.
"""


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        db = Database(settings.database_url)
        try:
            db.create_all()
        except SQLAlchemyError as e:
            # Say which database and why in one line; uvicorn then reports the failed start-up and exits.
            log.error("cannot use the database %s: %s", db.safe_url, str(e).splitlines()[0])
            raise
        log.info(
            "memsched service: database %s, %s, auth %s",
            db.safe_url,
            "solves on Celery workers" if settings.distributed else f"{settings.workers} solver workers",
            "on" if settings.auth_enabled else "off (no MEMSCHED_API_KEYS)",
        )

        def counts() -> dict[str, int]:
            with db.session() as s:
                return crud.jobs_by_state(s)

        runner: Runner
        if settings.distributed:
            # Stateless replica: jobs are rows, solves are Celery messages; any number may share the database.
            celery = CeleryRunner(db, settings)
            metrics = Metrics(counts, broker=(celery.queue_depth, celery.live_workers))
            runner = celery
        else:
            metrics = Metrics(counts)
            runner = EmbeddedRunner(db, settings, metrics)
        app.state.settings, app.state.db, app.state.metrics, app.state.runner = settings, db, metrics, runner
        await runner.start()
        try:
            yield
        finally:
            await runner.stop()
            db.dispose()

    app = FastAPI(
        title="memsched",
        version=memsched.__version__,
        description=DESCRIPTION,
        lifespan=lifespan,
        dependencies=[Depends(reject_unknown_query)],
        # /docs from the package's own Swagger UI files (memsched.api.docs), never a CDN; no ReDoc.
        docs_url=None,
        redoc_url=None,
        openapi_tags=[
            {"name": "traces", "description": "Layer-level cost traces, stored under their content hash"},
            {"name": "schedules", "description": "Asynchronous solve jobs and their schedules"},
            {"name": "compare", "description": "The baseline policies side by side"},
            {"name": "sweeps", "description": "The curve of step time against budget, and the page that draws it"},
            {"name": "health", "description": "Probes and Prometheus metrics"},
        ],
    )
    app.state.settings = settings
    install_error_handlers(app)
    install_docs(app)
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_body_bytes)
    for r in (traces.router, schedules.router, compare.router, sweeps.router, sweeps.ui, health.router):
        app.include_router(r)
    return app
