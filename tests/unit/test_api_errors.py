"""The service's errors name the request's fields, never the CLI's flags."""

from __future__ import annotations

from pathlib import Path

from fastapi.testclient import TestClient

from memsched.api import Settings, create_app
from memsched.api.errors import from_memsched_error
from memsched.api.examples import synthetic_trace
from memsched.api.runners import solve_process as worker
from memsched.errors import InfeasibleBudgetError
from memsched.optimizer.budget import min_feasible_budget
from memsched.options import SolveOptions


def test_infeasible_budget_names_the_request_field() -> None:
    e = from_memsched_error(InfeasibleBudgetError(100, 12345))
    assert e.field == "budget" and e.min_feasible_bytes == 12345 and e.budget_bytes == 100
    assert "--budget" not in e.detail
    assert e.detail.endswith("(12345 bytes). Raise the request's `budget` field to at least that")


def test_infeasible_job_names_the_request_field() -> None:
    # The job path (the worker's outcome, stored as the job's reason) says the same as the synchronous 422.
    tr = synthetic_trace(4)
    bad = worker.run_solve(
        tr.model_dump_json(), min_feasible_budget(tr) - 1, SolveOptions(solver="heuristic", time_limit_s=5.0), 5.0
    )
    assert bad.error is not None and "--budget" not in bad.error
    assert "Raise the request's `budget` field to at least that" in bad.error


def test_infeasible_request_in_process(tmp_path: Path) -> None:
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'a.db'}", api_keys=[], workers=1)
    tr = synthetic_trace(5, scale=7)
    with TestClient(create_app(settings)) as c:
        r = c.post(
            "/v1/schedules",
            params={"wait": 20},
            json={"trace": tr.model_dump(mode="json"), "budget": "5%", "solver": "heuristic"},
        )
    assert r.status_code == 422, r.text
    body = r.json()
    assert body["field"] == "budget" and body["min_feasible_bytes"] == min_feasible_budget(tr)
    assert "--budget" not in body["detail"] and "`budget` field" in body["detail"]
