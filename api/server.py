"""Running the app under uvicorn (used by `memsched serve` and `python -m memsched.api`)."""

from __future__ import annotations

import logging

import uvicorn

from memsched.api.main import create_app
from memsched.api.settings import Settings, get_settings


def serve(settings: Settings | None = None) -> None:
    """Serve until interrupted. One uvicorn process: it owns the job runner and its solver pool (solves scale
    with MEMSCHED_WORKERS, not with HTTP processes)."""
    settings = settings or get_settings()
    level = settings.log_level.upper()
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level.lower(),
        # Give running requests a moment on shutdown; running jobs are re-queued at the next start anyway.
        timeout_graceful_shutdown=5,
    )
