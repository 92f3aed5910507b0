"""Unit tests of the service's parts that need no server: settings, keys, cache keys, the client's error
mapping, the worker's time-limit guard, the body-size limit, database URLs, and the no-auth mode in-process."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from memsched.api import Settings, create_app
from memsched.api.crud import cache_key
from memsched.api.db import make_engine
from memsched.api.deps import owner_of
from memsched.api.examples import synthetic_trace
from memsched.api.middleware import BodySizeLimit
from memsched.api.runners import solve_process as worker
from memsched.errors import InfeasibleBudgetError, MemschedError, SolverError
from memsched.optimizer.budget import min_feasible_budget
from memsched.options import SolveOptions
from memsched.schema import Schedule, check_schedule
from memsched.service.client import MemschedClient, budget_to_json
from memsched.units import BudgetSpec

# ------------------------------------------------------------------------------------------------ settings


def test_settings_from_env(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    monkeypatch.setenv("MEMSCHED_API_KEYS", " key-one-123 , key-two-456,, ")
    monkeypatch.setenv("MEMSCHED_WORKERS", "3")
    s = Settings()
    assert s.api_keys == ["key-one-123", "key-two-456"] and s.auth_enabled
    assert s.workers == 3
    assert s.database_url == f"sqlite:///{tmp_path / 'memsched' / 'memsched.db'}"


def test_settings_defaults_need_nothing(monkeypatch) -> None:
    for k in ("MEMSCHED_API_KEYS", "MEMSCHED_DATABASE_URL"):
        monkeypatch.delenv(k, raising=False)
    s = Settings()
    assert s.api_keys == [] and not s.auth_enabled
    assert s.database_url.startswith("sqlite:///")


def test_short_keys_are_refused(monkeypatch) -> None:
    monkeypatch.setenv("MEMSCHED_API_KEYS", "abc")
    with pytest.raises(ValueError, match="at least 8 characters"):
        Settings()


def test_owner_ids_hide_the_key() -> None:
    assert owner_of("key-one-123") == owner_of("key-one-123")
    assert owner_of("key-one-123") != owner_of("key-two-456")
    assert "key-one" not in owner_of("key-one-123")


def test_cache_key_covers_budget_and_options() -> None:
    p = SolveOptions(solver="auto", time_limit_s=30.0, gap=0.01)
    base = cache_key("h", 100, p)
    assert base == cache_key("h", 100, SolveOptions(solver="auto", time_limit_s=30.0, gap=0.01))
    others = {
        cache_key("h2", 100, p),
        cache_key("h", 101, p),
        cache_key("h", 100, SolveOptions(solver="cbc", time_limit_s=30.0, gap=0.01)),
        cache_key("h", 100, SolveOptions(solver="auto", time_limit_s=31.0, gap=0.01)),
        cache_key("h", 100, SolveOptions(solver="auto", time_limit_s=30.0, gap=0.02)),
        cache_key("h", 100, SolveOptions(solver="auto", time_limit_s=30.0, gap=0.01, window=4)),
        cache_key("h", 100, SolveOptions(solver="auto", time_limit_s=30.0, gap=0.01, max_segment=4)),
    }
    assert base not in others and len(others) == 7


def test_database_urls_are_checked(tmp_path) -> None:
    with pytest.raises(MemschedError, match="not a database URL"):
        make_engine("nonsense")
    with pytest.raises(MemschedError, match="postgresql\\+psycopg"):
        make_engine("postgresql+asyncpg://u@h/db")
    engine = make_engine(f"sqlite:///{tmp_path / 'sub' / 'x.db'}")  # creates the folder
    assert (tmp_path / "sub").is_dir()
    engine.dispose()


# ------------------------------------------------------------------------------------------------ worker

HEUR = SolveOptions(solver="heuristic", time_limit_s=5.0)


def test_worker_solves_and_reports_infeasible() -> None:
    tr = synthetic_trace(4)
    ok = worker.run_solve(tr.model_dump_json(), min_feasible_budget(tr) + 10, HEUR, 5.0)
    assert ok.error is None and ok.schedule_json is not None
    check_schedule(Schedule.model_validate_json(ok.schedule_json), tr)
    bad = worker.run_solve(tr.model_dump_json(), min_feasible_budget(tr) - 1, HEUR, 5.0)
    assert bad.schedule_json is None and bad.min_feasible_bytes == min_feasible_budget(tr)


def test_worker_stops_a_solver_that_overruns_its_time_limit(monkeypatch) -> None:
    def stuck(*_args: object) -> Schedule:
        time.sleep(30)
        raise AssertionError("not reached")

    monkeypatch.setattr(worker, "solve_trace", stuck)
    t0 = time.perf_counter()
    out = worker.run_solve(
        synthetic_trace(3).model_dump_json(), 10**9, SolveOptions(solver="auto", time_limit_s=0.2), 0.3
    )
    assert time.perf_counter() - t0 < 5
    assert out.schedule_json is None and "ran past its time limit of 0.2 s" in (out.error or "")


def test_worker_falls_back_to_the_heuristic_when_the_exact_solver_overruns(monkeypatch) -> None:
    real = worker.solve_trace

    def slow_exact(trace, budget, options, resources):  # type: ignore[no-untyped-def]
        if options.solver != "heuristic":
            time.sleep(30)
        return real(trace, budget, options, resources)

    monkeypatch.setattr(worker, "solve_trace", slow_exact)
    tr = synthetic_trace(4)
    t0 = time.perf_counter()
    out = worker.run_solve(
        tr.model_dump_json(), min_feasible_budget(tr) + 10, SolveOptions(solver="cbc", time_limit_s=0.2), 0.3
    )
    assert time.perf_counter() - t0 < 5
    assert out.error is None and out.schedule_json is not None
    sc = Schedule.model_validate_json(out.schedule_json)
    check_schedule(sc, tr)
    assert sc.solver.status == "heuristic"
    assert sc.solver.message.startswith("the cbc solver ran past its time limit of 0.2 s")


def test_worker_turns_solver_crashes_into_reasons(monkeypatch) -> None:
    def broken(*_args: object) -> Schedule:
        raise RuntimeError("backend exploded")

    monkeypatch.setattr(worker, "solve_trace", broken)
    out = worker.run_solve(
        synthetic_trace(3).model_dump_json(), 10**9, SolveOptions(solver="auto", time_limit_s=1.0), 1.0
    )
    assert out.error == "solver error: RuntimeError: backend exploded"


# ------------------------------------------------------------------------------------------------ body limit


def _echo_app(limit: int) -> TestClient:
    async def echo(request: Request) -> JSONResponse:
        return JSONResponse({"n": len(await request.body())})

    return TestClient(BodySizeLimit(Starlette(routes=[Route("/", echo, methods=["POST"])]), max_bytes=limit))


def test_body_limit() -> None:
    c = _echo_app(100)
    assert c.post("/", content=b"x" * 100).json() == {"n": 100}
    r = c.post("/", content=b"x" * 101)
    assert r.status_code == 413 and r.json()["field"] == "body" and "MEMSCHED_MAX_BODY_BYTES" in r.json()["detail"]
    r = c.post("/", content=iter([b"x" * 60, b"x" * 60]))  # chunked: no Content-Length
    assert r.status_code == 413


# ------------------------------------------------------------------------------------------------ client


def _client(handler) -> MemschedClient:  # type: ignore[no-untyped-def]
    return MemschedClient("http://svc", "key-one-123", transport=httpx.MockTransport(handler))


def test_client_maps_errors() -> None:
    def infeasible(_req: httpx.Request) -> httpx.Response:
        return httpx.Response(
            422, json={"detail": "budget: too small", "field": "budget", "min_feasible_bytes": 123, "budget_bytes": 100}
        )

    with pytest.raises(InfeasibleBudgetError) as e:
        _client(infeasible).submit("a" * 64, 100)
    assert e.value.min_feasible_bytes == 123 and e.value.budget_bytes == 100 and str(e.value) == "budget: too small"

    def unauthorized(_req: httpx.Request) -> httpx.Response:
        return httpx.Response(401, json={"detail": "unknown API key", "field": "Authorization"})

    with pytest.raises(MemschedError, match="401: Authorization: unknown API key"):
        _client(unauthorized).submit("a" * 64, 100)

    def broken(_req: httpx.Request) -> httpx.Response:
        return httpx.Response(500, text="oops")

    with pytest.raises(SolverError, match="500"):
        _client(broken).submit("a" * 64, 100)

    def refused(req: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=req)

    with pytest.raises(MemschedError, match="cannot reach http://svc"):
        _client(refused).submit("a" * 64, 100)


def test_client_reports_failed_jobs_and_polls() -> None:
    calls: list[str] = []
    job = {"id": "j" * 32, "status": "queued", "budget_bytes": 5}

    def handler(req: httpx.Request) -> httpx.Response:
        calls.append(f"{req.method} {req.url.path} {req.url.query.decode()}")
        if req.method == "POST":
            body = json.loads(req.content)
            assert body["budget"] == "50%" and body["solver"] == "heuristic" and "trace" in body
            assert req.headers["authorization"] == "Bearer key-one-123"
            return httpx.Response(202, json=job)
        return httpx.Response(200, json={**job, "status": "failed", "reason": "worker died"})

    c = _client(handler)
    submitted = c.submit(synthetic_trace(3), BudgetSpec(percent=50), SolveOptions(solver="heuristic"))
    with pytest.raises(SolverError, match="failed: worker died"):
        c.wait(submitted, timeout_s=10)
    assert calls[1].startswith("GET /v1/schedules/" + "j" * 32 + " wait=")


def test_client_refuses_a_non_http_url() -> None:
    with pytest.raises(MemschedError, match="not an http"):
        MemschedClient("svc:8000")


def test_budget_to_json() -> None:
    assert budget_to_json(BudgetSpec(percent=50.0)) == "50%"
    assert budget_to_json(BudgetSpec(bytes=123)) == 123
    assert budget_to_json("8GiB") == "8GiB"


# ------------------------------------------------------------------------------------------------ in-process app


def test_no_auth_mode_in_process(tmp_path) -> None:
    """Without MEMSCHED_API_KEYS everyone is one anonymous owner; the app runs in-process (TestClient)."""
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'a.db'}", api_keys=[], workers=1)
    with TestClient(create_app(settings)) as c:
        tr = synthetic_trace(3)
        r = c.post("/v1/traces", json=tr.model_dump(mode="json"))
        assert r.status_code == 201
        assert c.get(f"/v1/traces/{r.json()['id']}").status_code == 200
        job = c.post(
            "/v1/schedules",
            params={"wait": 20},
            json={"trace_id": r.json()["id"], "budget": "60%", "solver": "heuristic"},
        ).json()
        assert job["status"] == "done", job
        # The example in the OpenAPI docs is itself a valid request.
        example = create_app(settings).openapi()["components"]["schemas"]["ScheduleRequest"]["examples"][0]
        assert c.post("/v1/schedules", json=example).status_code in (200, 202)


def _spawns_and_hangs(*_args: object) -> Schedule:
    import os
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    with open(os.environ["MEMSCHED_TEST_PIDFILE"], "w") as f:
        f.write(str(child.pid))
    time.sleep(30)
    raise AssertionError("not reached")


def test_worker_kills_solver_binaries_it_started_when_it_overruns(monkeypatch, tmp_path) -> None:
    """A backend binary (like pulp's CBC) still running when the alarm fires must not outlive the job. Run in
    a forked worker process, as in the service, so that only the job's own children are its descendants."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    monkeypatch.setattr(worker, "solve_trace", _spawns_and_hangs)
    monkeypatch.setenv("MEMSCHED_TEST_PIDFILE", str(tmp_path / "pid"))
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("fork")) as pool:
        out = pool.submit(
            worker.run_solve,
            synthetic_trace(3).model_dump_json(),
            10**9,
            SolveOptions(solver="auto", time_limit_s=0.2),
            0.3,
        ).result(timeout=30)
    assert "ran past its time limit" in (out.error or "")
    pid = int((tmp_path / "pid").read_text())
    time.sleep(0.2)
    stat = Path(f"/proc/{pid}/stat")
    assert not stat.exists() or stat.read_text().split(")")[-1].split()[0] == "Z", "solver binary still running"


def test_queue_limit_answers_429(tmp_path, monkeypatch) -> None:
    """Beyond MEMSCHED_MAX_QUEUED_JOBS new solves are refused with 429 + Retry-After; repeats still answer."""
    from memsched.api.runners.embedded import EmbeddedRunner

    async def idle(self: EmbeddedRunner) -> None:  # no dispatcher: queued jobs stay queued
        return None

    monkeypatch.setattr(EmbeddedRunner, "_dispatch", idle)
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'q.db'}", api_keys=[], workers=1, max_queued_jobs=1)
    body = {"trace": synthetic_trace(3).model_dump(mode="json"), "solver": "heuristic"}
    with TestClient(create_app(settings)) as c:
        first = c.post("/v1/schedules", json={**body, "budget": "70%"})
        assert first.status_code == 202 and first.json()["status"] == "queued"
        r = c.post("/v1/schedules", json={**body, "budget": "80%"})
        assert (
            r.status_code == 429
            and r.headers["retry-after"] == "10"
            and "MEMSCHED_MAX_QUEUED_JOBS" in r.json()["detail"]
        )
        again = c.post("/v1/schedules", json={**body, "budget": "70%"})
        assert again.status_code == 202 and again.json()["id"] == first.json()["id"]


def test_openapi_examples_are_valid() -> None:
    """The examples the docs show are real: each one validates against its own model."""
    from memsched.api import schemas

    models = [
        schemas.JobOut,
        schemas.TraceRef,
        schemas.CompareOut,
        schemas.ErrorBody,
        schemas.ScheduleRequest,
        schemas.CompareRequest,
    ]
    for model in models:
        examples = model.model_json_schema().get("examples", [])
        assert examples, model.__name__
        for ex in examples:
            model.model_validate(ex)
