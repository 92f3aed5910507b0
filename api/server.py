"""Running the app under uvicorn (used by `memsched serve` and `python -m memsched.api`)."""

from __future__ import annotations

import logging
import socket

import uvicorn
from sqlalchemy.engine import make_url
from sqlalchemy.exc import SQLAlchemyError

from memsched.api.db import make_engine
from memsched.api.main import create_app
from memsched.api.settings import Settings, get_settings
from memsched.errors import MemschedError


def serve(settings: Settings | None = None) -> None:
    """Serve until interrupted. One uvicorn process: it owns the job runner and its solver pool (solves scale
    with MEMSCHED_WORKERS, not with HTTP processes)."""
    settings = settings or get_settings()
    preflight(settings)
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


def preflight(settings: Settings) -> None:
    """What would make the app's start fail, said in one line before uvicorn starts (MemschedError, exit 2): a
    database that cannot be reached, an address that cannot be listened on. uvicorn's own failures are a
    traceback in the log and exit 3."""
    engine = make_engine(settings.database_url)
    shown = make_url(settings.database_url).render_as_string(hide_password=True)
    try:
        with engine.connect():
            pass
    except SQLAlchemyError as e:
        cause = getattr(e, "orig", None) or e  # the driver's own message, where SQLAlchemy wraps one
        first = (str(cause).strip().splitlines() or [type(e).__name__])[0][:200]
        raise MemschedError(
            f"cannot reach the database {shown} ({first}); start it, or fix --database-url / MEMSCHED_DATABASE_URL"
        ) from None
    finally:
        engine.dispose()
    try:
        infos = socket.getaddrinfo(settings.host, settings.port, type=socket.SOCK_STREAM)
        with socket.socket(infos[0][0], socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(infos[0][4])
    except OSError as e:
        raise MemschedError(
            f"cannot listen on {settings.host}:{settings.port} ({e.strerror or e}); give a free --port, or a --host "
            "of this machine (0.0.0.0 for every interface)"
        ) from None
