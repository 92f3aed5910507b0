"""A database written by the previous memsched (one column per solve option) is migrated in place when a server
starts on it: every job keeps its options, its cache key and its schedule. Over SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import create_engine, inspect, text

from memsched.api import crud
from memsched.api.db import Database
from memsched.api.routes.common import job_out
from memsched.options import SolveOptions, SolverName

# schedule_jobs as memsched 0.1.0 created it (before the options became one JSON column).
_OLD_JOBS = """
CREATE TABLE schedule_jobs (
    id VARCHAR(32) PRIMARY KEY, owner VARCHAR(64) NOT NULL, trace_id VARCHAR(64) NOT NULL,
    cache_key VARCHAR(64) NOT NULL, budget_bytes BIGINT NOT NULL, budget_spec VARCHAR(64) NOT NULL,
    solver VARCHAR(32) NOT NULL, time_limit_s FLOAT NOT NULL, gap FLOAT NOT NULL, "window" INTEGER,
    max_segment INTEGER, status VARCHAR(16) NOT NULL, reason TEXT, min_feasible_bytes BIGINT, schedule TEXT,
    plot_png BYTEA, cached BOOLEAN NOT NULL, attempts INTEGER NOT NULL, solve_s FLOAT,
    created_at TIMESTAMP WITH TIME ZONE NOT NULL, started_at TIMESTAMP WITH TIME ZONE,
    finished_at TIMESTAMP WITH TIME ZONE,
    CONSTRAINT uq_job_owner_cache_key UNIQUE (owner, cache_key)
)
"""

_OLD_ROWS = [
    {"solver": "heuristic", "time_limit_s": 5.0, "gap": 0.01, "window": None, "max_segment": None},
    {"solver": "cbc", "time_limit_s": 12.5, "gap": 0.0, "window": 4, "max_segment": 3},
]


@pytest.fixture(params=["sqlite", "postgresql"])
def empty_database(request: pytest.FixtureRequest, tmp_path) -> Iterator[str]:  # type: ignore[no-untyped-def]
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'old.db'}"
        return
    with request.getfixturevalue("pg_target").throwaway_database("memsched_migrate") as url:
        yield url


def test_old_job_rows_keep_their_options_and_cache_keys(empty_database: str) -> None:
    engine = create_engine(empty_database)
    ddl = _OLD_JOBS if engine.dialect.name == "postgresql" else _OLD_JOBS.replace("BYTEA", "BLOB")
    with engine.begin() as conn:
        conn.execute(text(ddl))
        for i, opts in enumerate(_OLD_ROWS):
            key = crud.cache_key("ab" * 32, 1000 + i, SolveOptions(**opts))
            conn.execute(
                text(
                    "INSERT INTO schedule_jobs (id, owner, trace_id, cache_key, budget_bytes, budget_spec, solver, "
                    "time_limit_s, gap, \"window\", max_segment, status, cached, attempts, created_at) VALUES (:id, '', "
                    ":t, :key, :b, :spec, :solver, :time_limit_s, :gap, :window, :max_segment, 'done', false, 1, "
                    "CURRENT_TIMESTAMP)"
                ),
                {"id": f"{i:032x}", "t": "ab" * 32, "key": key, "b": 1000 + i, "spec": str(1000 + i), **opts},
            )
    engine.dispose()

    db = Database(empty_database)
    db.create_all()  # what a server does on start
    db.create_all()  # and again on the next start: a no-op
    columns = {c["name"] for c in inspect(db.engine).get_columns("schedule_jobs")}
    assert "options" in columns and not columns & {"solver", "time_limit_s", "gap", "window", "max_segment"}
    assert "min_feasible_host_bytes" in columns  # added since, null in the old rows
    with db.session() as s:
        for i, opts in enumerate(_OLD_ROWS):
            row = crud.get_job(s, "", f"{i:032x}")
            assert row is not None
            params = crud.params_of(row)
            assert params == SolveOptions(**opts)
            # The same question still finds the same job: nothing is solved twice after an upgrade.
            assert row.cache_key == crud.cache_key(row.trace_id, row.budget_bytes, params)
            out = job_out(row)
            assert out.solver == SolverName(opts["solver"]) and out.window == opts["window"]
            assert out.min_feasible_host_bytes is None
    db.dispose()
