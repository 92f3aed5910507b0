"""CLI commands of the REST service: `memsched serve`, and the client side of `memsched solve --server`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from memsched.errors import MemschedError

if TYPE_CHECKING:
    from memsched.optimizer.solve import SolveOptions
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
    docs/api.md (API keys, body / layer / time-limit limits, queue size)."""
    from pydantic import ValidationError

    from memsched.io import describe_validation_error

    try:
        from memsched.api.server import serve as run
        from memsched.api.settings import Settings
    except ModuleNotFoundError as e:
        if (e.name or "memsched").startswith("memsched"):
            raise
        raise MemschedError(f"serve needs the api extra ({e.name} is missing): pip install 'memsched[api]'") from None

    overrides: dict[str, Any] = {
        k: v
        for k, v in {
            "host": host,
            "port": port,
            "workers": workers,
            "database_url": database_url,
            "log_level": log_level,
        }.items()
        if v is not None
    }
    try:
        settings = Settings(**overrides)
    except ValidationError as e:
        raise MemschedError(describe_validation_error(e, "settings (MEMSCHED_* / options)")) from None
    run(settings)


def register(app: typer.Typer) -> None:
    """Add `serve` to the memsched CLI."""
    app.command(name="serve")(serve)
