"""Every error leaves the service as a JSON ErrorBody with a 4xx status: {"detail", "field", ...}."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, cast

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from sqlalchemy.exc import DataError, InterfaceError, OperationalError
from starlette.exceptions import HTTPException as StarletteHTTPException

from memsched.errors import CLI_TO_API_FIXES, InfeasibleBudgetError, InfeasibleHostBudgetError, MemschedError
from memsched.io import describe_validation_error

log = logging.getLogger(__name__)


class ApiError(Exception):
    """An answer other than success: status, a message naming the problem and its fix, and the field."""

    def __init__(
        self,
        status: int,
        detail: str,
        field: str | None = None,
        *,
        min_feasible_bytes: int | None = None,
        budget_bytes: int | None = None,
        headers: dict[str, str] | None = None,
        min_feasible_host_bytes: int | None = None,
        host_budget_bytes: int | None = None,
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.field = field
        self.min_feasible_bytes = min_feasible_bytes
        self.budget_bytes = budget_bytes
        self.headers = headers
        self.min_feasible_host_bytes = min_feasible_host_bytes
        self.host_budget_bytes = host_budget_bytes


class BrokerUnavailable(Exception):
    """Distributed mode: the broker did not take a job's message (down, unreachable, refusing). Answered
    with 503 + Retry-After: nothing was stored, and the same request succeeds once the broker is back."""


# The core's messages name the CLI's flags; over HTTP the same fix is a request field.
def api_message(err: MemschedError) -> str:
    """The error's message as an API client should read it: the request field to change, not a CLI flag."""
    msg = str(err)
    for cli, api in CLI_TO_API_FIXES.items():
        msg = msg.replace(cli, api)
    return msg


def from_memsched_error(err: MemschedError, field: str | None = None) -> ApiError:
    """A user-fixable core error as a 422. Infeasible budgets carry the smallest feasible budget."""
    if isinstance(err, InfeasibleBudgetError):
        return ApiError(
            422,
            api_message(err),
            field or "budget",
            min_feasible_bytes=err.min_feasible_bytes,
            budget_bytes=err.budget_bytes,
        )
    if isinstance(err, InfeasibleHostBudgetError):
        return ApiError(
            422,
            api_message(err),
            field or "host_budget",
            budget_bytes=err.budget_bytes,
            min_feasible_host_bytes=err.min_host_bytes,
            host_budget_bytes=err.host_budget_bytes,
        )
    return ApiError(422, api_message(err), field)


def error_json(status: int, detail: str, field: str | None = None) -> JSONResponse:
    return JSONResponse(status_code=status, content={"detail": detail, "field": field})


class _Errors:
    """Request-validation errors with the 'body'/'query'/'path' prefix dropped from each location, so the
    messages name the field the client wrote (budget, trace.layers[2].name), not FastAPI's bookkeeping."""

    def __init__(self, errors: Sequence[Any]) -> None:
        self._errors = [dict(e) for e in errors]
        for e in self._errors:
            loc = tuple(e.get("loc", ()))
            e["loc"] = loc[1:] if loc and loc[0] in ("body", "query", "path", "header") else loc

    def errors(self) -> list[dict[str, Any]]:
        return self._errors


def _field(loc: Sequence[Any]) -> str | None:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else ("." if out else "") + str(part)
    return out or None


async def _api_error(_request: Request, exc: Exception) -> JSONResponse:
    e = cast(ApiError, exc)
    body: dict[str, Any] = {"detail": e.detail, "field": e.field}
    if e.min_feasible_bytes is not None:
        body["min_feasible_bytes"] = e.min_feasible_bytes
    if e.budget_bytes is not None:
        body["budget_bytes"] = e.budget_bytes
    if e.min_feasible_host_bytes is not None:
        body["min_feasible_host_bytes"] = e.min_feasible_host_bytes
    if e.host_budget_bytes is not None:
        body["host_budget_bytes"] = e.host_budget_bytes
    return JSONResponse(status_code=e.status, content=body, headers=e.headers)


async def _validation_error(_request: Request, exc: Exception) -> JSONResponse:
    raw = cast(RequestValidationError, exc).errors()
    if raw and raw[0].get("type") == "json_invalid":
        ctx = raw[0].get("ctx") or {}
        return error_json(
            400, f"request body is not valid JSON ({ctx.get('error', 'parse error')}); send a JSON document"
        )
    if raw and raw[0].get("loc") == ("body",) and raw[0].get("type") == "missing":
        return error_json(422, "request body is missing; send a JSON document (see the OpenAPI docs)", "body")
    wrapped = _Errors(raw)
    # describe_validation_error only calls .errors(), which the wrapper provides with the cleaned locations;
    # it keeps the API's messages identical to the CLI's ("field: problem; fix: ...").
    detail = describe_validation_error(cast(ValidationError, wrapped), "request")
    return error_json(422, detail, _field(wrapped.errors()[0]["loc"]) if raw else None)


async def _http_error(_request: Request, exc: Exception) -> JSONResponse:
    e = cast(StarletteHTTPException, exc)
    return JSONResponse(status_code=e.status_code, content={"detail": str(e.detail), "field": None}, headers=e.headers)


async def _memsched_error(_request: Request, exc: Exception) -> JSONResponse:
    return await _api_error(_request, from_memsched_error(cast(MemschedError, exc)))


async def _database_error(request: Request, exc: Exception) -> JSONResponse:
    if isinstance(exc, DataError):
        # A value the database cannot store slipped past validation: the input's fault, but worth a look.
        log.warning("database refused a value on %s %s: %s", request.method, request.url.path, exc.orig)
        return error_json(422, f"a value in the request cannot be stored: {exc.orig}")
    log.error("database unavailable on %s %s: %s", request.method, request.url.path, exc)
    return JSONResponse(
        status_code=503,
        content={"detail": "the database is unavailable; retry shortly (GET /readyz reports it)", "field": None},
        headers={"Retry-After": "5"},
    )


async def _broker_error(request: Request, exc: Exception) -> JSONResponse:
    log.error("broker unavailable on %s %s: %s", request.method, request.url.path, exc)
    return JSONResponse(
        status_code=503,
        content={
            "detail": f"{exc}; nothing was stored: retry shortly (GET /readyz reports the broker)",
            "field": None,
        },
        headers={"Retry-After": "5"},
    )


async def _internal_error(request: Request, exc: Exception) -> JSONResponse:
    # Reaching this is a bug: log it with the traceback; the client gets a JSON body without internals.
    log.error("internal error on %s %s", request.method, request.url.path, exc_info=exc)
    return error_json(500, "internal server error; it has been logged")


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(MemschedError, _memsched_error)
    app.add_exception_handler(OperationalError, _database_error)
    app.add_exception_handler(InterfaceError, _database_error)
    app.add_exception_handler(DataError, _database_error)
    app.add_exception_handler(BrokerUnavailable, _broker_error)
    app.add_exception_handler(Exception, _internal_error)
