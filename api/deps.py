"""FastAPI dependencies (Annotated aliases, as in the full-stack template): settings, database, session,
job runner, and the caller's identity."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterator
from typing import Annotated, Any

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session

from memsched.api.db import Database
from memsched.api.errors import ApiError
from memsched.api.metrics import Metrics
from memsched.api.runners import Runner
from memsched.api.settings import Settings

# The app's state, not the process-wide settings: tests run apps with different settings in one process.


def get_app_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


def get_database(request: Request) -> Database:
    db: Database = request.app.state.db
    return db


def get_runner(request: Request) -> Runner:
    runner: Runner = request.app.state.runner
    return runner


def get_metrics(request: Request) -> Metrics:
    metrics: Metrics = request.app.state.metrics
    return metrics


SettingsDep = Annotated[Settings, Depends(get_app_settings)]
DatabaseDep = Annotated[Database, Depends(get_database)]
RunnerDep = Annotated[Runner, Depends(get_runner)]
MetricsDep = Annotated[Metrics, Depends(get_metrics)]


def get_session(db: DatabaseDep) -> Iterator[Session]:
    with db.session() as s:
        yield s


SessionDep = Annotated[Session, Depends(get_session)]

bearer = HTTPBearer(
    auto_error=False,
    description="An API key from MEMSCHED_API_KEYS, as `Authorization: Bearer <key>` (only when keys are set)",
)


def owner_of(key: str) -> str:
    """The owner id stored with rows: a hash of the key, so the database never holds the key itself."""
    return hashlib.sha256(b"memsched-owner:" + key.encode()).hexdigest()[:32]


def get_owner(settings: SettingsDep, creds: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]) -> str:
    """Who is asking. Without configured keys everyone is the same anonymous owner ('')."""
    if not settings.auth_enabled:
        return ""
    challenge = {"WWW-Authenticate": "Bearer"}
    if creds is None:
        raise ApiError(
            401,
            "missing credentials: send 'Authorization: Bearer <key>' with a key from MEMSCHED_API_KEYS",
            "Authorization",
            headers=challenge,
        )
    given = creds.credentials.encode()
    # Compare against every key in constant time, so timing does not reveal how much of a key matched.
    ok = False
    for key in settings.api_keys:
        ok |= hmac.compare_digest(given, key.encode())
    if not ok:
        raise ApiError(
            401, "unknown API key; use one of the keys in MEMSCHED_API_KEYS", "Authorization", headers=challenge
        )
    return owner_of(creds.credentials)


OwnerDep = Annotated[str, Depends(get_owner)]


def reject_unknown_query(request: Request) -> None:
    """A query parameter the operation does not take is a mistake (a typo of `wait`, a stray `?l=`): answer 422
    naming it and what the operation takes, rather than ignoring it (an app-wide dependency)."""
    route = request.scope.get("route")
    dependant = getattr(route, "dependant", None)
    if dependant is None:
        return  # /docs and its assets: no operation of the API
    known = {p.alias for p in _query_params(dependant)}
    unknown = sorted(set(request.query_params.keys()) - known)
    if unknown:
        takes = ", ".join(sorted(known)) or "none"
        raise ApiError(422, f"unknown query parameter {unknown[0]!r}; this operation takes: {takes}", unknown[0])


def _query_params(dependant: Any) -> list[Any]:
    """The query parameters of an operation, its dependencies' included."""
    out = list(dependant.query_params)
    for sub in dependant.dependencies:
        out += _query_params(sub)
    return out
