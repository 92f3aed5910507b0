"""CLI commands of the REST service: `memsched serve`, `memsched worker` (distributed mode), `memsched jobs`, and the
client side of `memsched solve --server`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from memsched.errors import MemschedError

if TYPE_CHECKING:
    from memsched.options import SolveOptions
    from memsched.schema import Schedule, Trace
    from memsched.units import BudgetSpec

__all__ = ["register", "solve_via_server"]


def solve_via_server(
    url: str,
    trace: Trace,
    budget: BudgetSpec | str | int,
    options: SolveOptions | None = None,
    api_key: str | None = None,
) -> Schedule:
    """`memsched solve --server`: the HTTP client (httpx, in the api extra) is loaded only here, so that the
    core install's CLI works without it."""
    try:
        from memsched.service.client import solve_via_server as remote_solve
    except ModuleNotFoundError as e:
        if e.name != "httpx":
            raise
        raise MemschedError("--server needs the HTTP client httpx: pip install 'memsched[api]'") from None
    return remote_solve(url, trace, budget, options, api_key)


def serve(
    host: Annotated[str | None, typer.Option(help="Interface to bind (env MEMSCHED_HOST; default 127.0.0.1).")] = None,
    port: Annotated[int | None, typer.Option(help="Port (env MEMSCHED_PORT; default 8000).")] = None,
    workers: Annotated[
        int | None, typer.Option(help="Solver processes, i.e. solves at once (env MEMSCHED_WORKERS; default 2).")
    ] = None,
    database_url: Annotated[
        str | None,
        typer.Option(
            "--database-url",
            help="sqlite:///path.db or postgresql+psycopg://user:pw@host/db (env MEMSCHED_DATABASE_URL; default a "
            "SQLite file under $XDG_DATA_HOME/memsched).",
        ),
    ] = None,
    log_level: Annotated[str | None, typer.Option(help="debug | info | warning (env MEMSCHED_LOG_LEVEL).")] = None,
) -> None:
    """Run the REST service (FastAPI under uvicorn). Everything else is set by MEMSCHED_* variables: see
    docs/api.md (API keys, body / layer / time-limit limits, queue size). With MEMSCHED_BROKER_URL set it is a
    stateless replica that sends solves to `memsched worker` processes."""
    run = _api_extra("memsched.api.server").serve
    run(
        _settings(
            {"host": host, "port": port, "workers": workers, "database_url": database_url, "log_level": log_level}
        )
    )


def worker(
    concurrency: Annotated[
        int | None,
        typer.Option(help="Solver processes of this worker, i.e. solves at once (default MEMSCHED_WORKERS, 2)."),
    ] = None,
    queues: Annotated[
        str | None, typer.Option(help="Comma-separated Celery queues to consume (default MEMSCHED_QUEUE, memsched).")
    ] = None,
    broker_url: Annotated[
        str | None,
        typer.Option(
            "--broker-url", help="redis://host:6379/0 or amqp://user:pw@host:5672// (env MEMSCHED_BROKER_URL)."
        ),
    ] = None,
    database_url: Annotated[
        str | None,
        typer.Option("--database-url", help="The API replicas' database (env MEMSCHED_DATABASE_URL)."),
    ] = None,
    name: Annotated[
        str | None, typer.Option(help="Celery node name (default memsched-<pid>@<host>); unique per worker.")
    ] = None,
    log_level: Annotated[str | None, typer.Option(help="debug | info | warning (env MEMSCHED_LOG_LEVEL).")] = None,
) -> None:
    """Run a solve worker for the distributed mode: a Celery worker that takes jobs from the broker, solves
    them with the same function as `memsched serve`'s own pool, and writes the answers to the database."""
    import logging

    run_worker = _api_extra("memsched.api.runners.celery_runner").run_worker

    settings = _settings({"broker_url": broker_url, "database_url": database_url, "log_level": log_level})
    if not settings.broker_url:
        raise MemschedError(
            "memsched worker needs a broker: set MEMSCHED_BROKER_URL (or --broker-url) to redis://host:6379/0 or "
            "amqp://user:password@host:5672//, the same as the API replicas'"
        )
    if concurrency is not None and concurrency < 1:
        raise MemschedError(f"--concurrency must be >= 1, got {concurrency}")
    queue_names = [q.strip() for q in (queues or settings.queue).split(",") if q.strip()]
    if not queue_names:
        raise MemschedError("--queues: name at least one queue, e.g. --queues memsched")
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(processName)s %(name)s: %(message)s"
    )
    run_worker(settings, concurrency or settings.workers, queue_names, name, settings.log_level)


def _api_extra(module: str) -> Any:
    """Import a module of the service, or say in one line which extra is missing."""
    import importlib

    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if (e.name or "memsched").startswith("memsched"):
            raise
        raise MemschedError(
            f"this command needs the api extra ({e.name} is missing): pip install 'memsched[api]'"
        ) from None


def _settings(options: dict[str, Any]) -> Any:
    """Settings from MEMSCHED_* variables, with the options given on the command line on top."""
    from pydantic import ValidationError

    from memsched.io import describe_validation_error

    settings_class = _api_extra("memsched.api.settings").Settings

    try:
        return settings_class(**{k: v for k, v in options.items() if v is not None})
    except ValidationError as e:
        raise MemschedError(describe_validation_error(e, "settings (MEMSCHED_* / options)")) from None


def register(app: typer.Typer) -> None:
    """Add `serve`, `worker` and `jobs` to the memsched CLI."""
    from memsched.cli.jobs import jobs_app

    app.command(name="serve")(serve)
    app.command(name="worker")(worker)
    app.add_typer(jobs_app, name="jobs")
