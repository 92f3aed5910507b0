"""The host budget over HTTP, on a real server (SQLite and PostgreSQL): a sweep and a schedule job solved under
it stay within it and record it; a host budget below what any plan needs at the range's top answers 422 with
the smallest one that works (the service function's own answer, to the byte); a bad value is a 422 naming the
field; the comparison marks baselines over it infeasible."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers.api import KEY_A, Server, upload_trace
from memsched.api.examples import synthetic_trace
from memsched.errors import InfeasibleHostBudgetError
from memsched.optimizer.actions import smallest_budget
from memsched.optimizer.budget import min_feasible_budget
from memsched.options import SolveOptions
from memsched.schema import Action, Schedule
from memsched.service import solve_trace

pytestmark = pytest.mark.timeout(300)

TRACE = synthetic_trace(6, model="synthetic/host-budget")


@pytest.fixture(scope="module")
def trace_id(server: Server) -> str:
    return upload_trace(server, TRACE)


def _smallest_host(budget: int, host: int) -> int:
    """What the service function says at `budget` (the API must answer the same)."""
    with pytest.raises(InfeasibleHostBudgetError) as e:
        solve_trace(TRACE, budget, SolveOptions(host_budget=host, time_limit_s=10))
    assert e.value.proven
    return e.value.min_host_bytes


@pytest.mark.parametrize("host", [0, 1_000_000])
def test_sweep_with_a_host_budget_below_any_plan_is_422_with_the_smallest(
    server: Server, trace_id: str, host: int
) -> None:
    # Between the smallest budget of any plan and the smallest of keep / recompute plans only offload fits.
    recompute_floor, proven, _ = smallest_budget(
        TRACE, frozenset({Action.KEEP, Action.RECOMPUTE}), time.perf_counter() + 60
    )
    assert proven
    top = (min_feasible_budget(TRACE) + recompute_floor) // 2
    want = _smallest_host(top, host)
    assert want > host
    with server.client(timeout=120) as c:
        r = c.post(
            "/v1/sweeps",
            json={"trace_id": trace_id, "points": 3, "time_limit_s": 2, "budget_to": top, "host_budget": host},
        )
    assert r.status_code == 422, r.text
    err = r.json()
    assert err["field"] == "host_budget" and err["min_feasible_host_bytes"] == want
    assert err["host_budget_bytes"] == host and err["budget_bytes"] == top
    assert f"({want} bytes)" in err["detail"] and "`host_budget`" in err["detail"]


def test_schedule_job_with_a_host_budget_below_any_plan_fails_with_the_smallest(
    server: Server, trace_id: str, tmp_path: Path
) -> None:
    # A job is solved later, so it fails (rather than a 422) and carries the number, as a field; `memsched solve
    # --server --json` then reports it as a local solve does.
    recompute_floor, _, _ = smallest_budget(TRACE, frozenset({Action.KEEP, Action.RECOMPUTE}), time.perf_counter() + 60)
    top = (min_feasible_budget(TRACE) + recompute_floor) // 2
    want = _smallest_host(top, 0)
    body = {"trace_id": trace_id, "budget": top, "host_budget": 0, "time_limit_s": 10}
    with server.client(timeout=120) as c:
        r = c.post("/v1/schedules", params={"wait": 30}, json=body)
    assert r.status_code == 200, r.text
    job = r.json()
    assert job["status"] == "failed" and job["min_feasible_host_bytes"] == want, job
    assert job["min_feasible_bytes"] is None and f"({want} bytes)" in job["reason"]
    src, out = tmp_path / "trace.json", tmp_path / "schedule.json"
    src.write_text(TRACE.model_dump_json())
    cli = [sys.executable, "-c", "from memsched.cli import main; main()", "solve", str(src), "--budget", str(top)]
    r = subprocess.run(
        [*cli, "--host-budget", "0", "--time-limit", "10", "--server", server.url, "-o", str(out), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "MEMSCHED_API_KEY": KEY_A},
    )
    assert r.returncode == 2, r.stderr
    err = json.loads(r.stdout)["error"]
    assert err["code"] == "infeasible_host_budget" and err["min_host_bytes"] == want, err
    assert not out.exists()


def test_sweep_under_a_host_budget_stays_within_it(server: Server, trace_id: str) -> None:
    host = 4_000_000
    with server.client(timeout=120) as c:
        r = c.post("/v1/sweeps", json={"trace_id": trace_id, "points": 4, "time_limit_s": 2, "host_budget": "4MB"})
        assert r.status_code == 200, r.text
        doc = r.json()
    assert doc["options"]["host_budget"] == host
    for p in doc["points"]:
        sc = p["schedule"]
        assert sc["host_budget_bytes"] == host and sc["prediction"]["host_peak_bytes"] <= host
        assert sc["prediction"]["peak_bytes"] <= p["budget_bytes"]
        assert p["bound_s"] is None or p["bound_s"] <= p["overhead_s"] + 1e-12
    # Below some budget 4 MB of host memory is too little: the sweep starts above it and says so.
    assert doc["lo_bytes"] > min_feasible_budget(TRACE)
    assert any("host budget" in n for n in doc["notes"])


def test_schedule_job_records_the_host_budget_and_keys_on_it(server: Server, trace_id: str) -> None:
    body = {"trace_id": trace_id, "budget": "40%", "solver": "heuristic", "time_limit_s": 5}
    with server.client() as c:
        a = c.post("/v1/schedules", params={"wait": 20}, json={**body, "host_budget": 6_000_000})
        assert a.status_code == 200, a.text
        b = c.post("/v1/schedules", params={"wait": 20}, json={**body, "host_budget": "6MB"})
        other = c.post("/v1/schedules", params={"wait": 20}, json=body)
    job = a.json()
    assert job["status"] == "done" and job["host_budget"] == 6_000_000
    sc = Schedule.model_validate(job["schedule"])
    assert sc.host_budget_bytes == 6_000_000 and sc.prediction.host_peak_bytes is not None
    assert sc.prediction.host_peak_bytes <= 6_000_000
    assert b.json()["id"] == job["id"] and b.json()["cached"] is True  # the same bytes, the same job
    assert other.json()["id"] != job["id"] and other.json()["host_budget"] is None


@pytest.mark.parametrize(("value", "needle"), [(-1, ">= 0 bytes"), ("lots", "cannot read"), ("50%", "not a share")])
def test_bad_host_budget_is_422(server: Server, trace_id: str, value: object, needle: str) -> None:
    with server.client() as c:
        for path, body in (
            ("/v1/sweeps", {"points": 3}),
            ("/v1/schedules", {"budget": "50%"}),
            ("/v1/compare", {"budget": "50%"}),
        ):
            r = c.post(path, json={"trace_id": trace_id, "host_budget": value, **body})
            assert r.status_code == 422, r.text
            assert r.json()["field"] == "host_budget" and needle in r.json()["detail"], r.json()


def test_compare_marks_baselines_over_the_host_budget(server: Server, trace_id: str) -> None:
    with server.client() as c:
        r = c.post("/v1/compare", json={"trace_id": trace_id, "budget": "100%", "host_budget": 0})
    assert r.status_code == 200, r.text
    rows = {row["policy"]: row for row in r.json()["rows"]}
    assert rows["keep-all"]["feasible"] and rows["keep-all"]["host_peak_bytes"] == 0
    assert rows["offload-all-sync"]["host_peak_bytes"] > 0 and not rows["offload-all-sync"]["feasible"]
