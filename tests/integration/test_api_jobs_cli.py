"""`memsched jobs list|get|wait|cancel` against a real `memsched serve` (SQLite and PostgreSQL): the same calls as
the API's GET /v1/schedules, GET /v1/schedules/{id} and POST /v1/schedules/{id}/cancel."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from helpers.api import KEY_A, KEY_B, Server
from memsched.errors import SolverError
from memsched.optimizer.synthetic import make_trace
from memsched.schema import JobStatus, Schedule
from memsched.service.client import MemschedClient

CLI = [sys.executable, "-c", "from memsched.cli import main; main()"]


def jobs(server: Server, *argv: str, key: str = KEY_A) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, "jobs", *argv, "--server", server.url, "--api-key", key],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_list_get_wait_and_cancel(server: Server, tmp_path) -> None:
    tr = make_trace(30, 3)
    body = {"trace": tr.model_dump(mode="json"), "solver": "heuristic", "time_limit_s": 5}
    with server.client() as c:
        done = c.post("/v1/schedules", params={"wait": 30}, json={**body, "budget": "60%"}).json()
        # A solve that runs for its whole time limit (the exact DP cannot prove this one within 3 s).
        slow = c.post("/v1/schedules", json={**body, "budget": "30%", "solver": "dp", "time_limit_s": 3, "gap": 0})
        slow_id = slow.json()["id"]
        cancelled = c.post(f"/v1/schedules/{slow_id}/cancel")
    assert done["status"] == JobStatus.DONE
    assert cancelled.status_code == 200 and cancelled.json()["status"] == JobStatus.CANCELLED

    # list: newest first, this key's jobs only, filterable by state
    r = jobs(server, "list", "--json")
    assert r.returncode == 0, r.stderr
    ids = [j["id"] for j in json.loads(r.stdout)["jobs"]]
    assert ids.index(slow_id) < ids.index(done["id"])
    r = jobs(server, "list", "--json", "--status", "cancelled")
    listed = json.loads(r.stdout)["jobs"]
    assert slow_id in [j["id"] for j in listed] and all(j["status"] == "cancelled" for j in listed)
    assert all(j["schedule"] is None for j in listed)  # a list leaves the schedules out
    r = jobs(server, "list", "--json", key=KEY_B)
    assert done["id"] not in r.stdout and slow_id not in r.stdout
    r = jobs(server, "list", "--status", "finished")
    assert r.returncode == 2 and "--status" in r.stderr and "Traceback" not in r.stderr

    # get -o writes the schedule of a done job; a cancelled one has none to write
    out = tmp_path / "s.json"
    r = jobs(server, "get", done["id"], "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert Schedule.model_validate_json(out.read_text()).trace_hash == tr.content_hash()
    r = jobs(server, "get", slow_id, "-o", str(tmp_path / "none.json"))
    assert r.returncode == 2 and "cancelled" in r.stderr

    # wait: a cancelled job ends the wait with its reason, exit 1 (not a user error)
    r = jobs(server, "wait", slow_id, "--timeout", "5")
    assert r.returncode == 1 and "cancelled" in r.stderr and "internal error" not in r.stderr

    # cancel: a done job cannot be; another key's job is not found
    r = jobs(server, "cancel", done["id"])
    assert r.returncode == 2 and "already done" in r.stderr
    r = jobs(server, "cancel", slow_id, key=KEY_B)
    assert r.returncode == 2 and "404" in r.stderr

    # The cancelled solve ends at its time limit; its answer is discarded and the job stays cancelled.
    time.sleep(4)
    with server.client() as c:
        after = c.get(f"/v1/schedules/{slow_id}").json()
        assert after["status"] == JobStatus.CANCELLED and after["schedule"] is None
        # Asking the same question again solves it anew (a cancelled question asked again is wanted again).
        again = c.post("/v1/schedules", json={**body, "budget": "30%", "solver": "dp", "time_limit_s": 3, "gap": 0})
        assert again.json()["id"] == slow_id and again.json()["status"] in (JobStatus.QUEUED, JobStatus.RUNNING)
        # A wait that ends before the job does says that the job goes on, and how to fetch it later.
        with MemschedClient(server.url, KEY_A) as client, pytest.raises(SolverError) as e:
            client.wait(again.json(), 0.01)
        c.post(f"/v1/schedules/{slow_id}/cancel")
    assert "goes on there and keeps its answer" in str(e.value), e.value
    assert f"memsched jobs wait {slow_id} --server {server.url}" in str(e.value), e.value


def test_unknown_query_parameters_and_bad_dates_are_422(server: Server) -> None:
    with server.client() as c:
        r = c.get("/v1/schedules", params={"statsu": "done"})
        assert (
            r.status_code == 422
            and r.json()["field"] == "statsu"
            and "takes: before, limit, status" in r.json()["detail"]
        )
        r = c.post("/v1/schedules", params={"wiat": 5}, json={"budget": "50%"})
        assert r.status_code == 422 and r.json()["field"] == "wiat" and "wait" in r.json()["detail"]
        r = c.get("/v1/schedules", params={"before": "0.5"})
        assert r.status_code == 422 and r.json()["field"] == "before"
        r = c.get("/v1/schedules", params={"before": "2026-11-24T17:30:06Z", "limit": 1})
        assert r.status_code == 200
        assert c.get("/healthz", params={"x": 1}).status_code == 422
