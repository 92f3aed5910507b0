"""The REST service end to end, against a real uvicorn server over SQLite and over PostgreSQL."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import pytest

from helpers.api import KEY_A, KEY_B, Server
from memsched.api.examples import synthetic_trace
from memsched.errors import InfeasibleBudgetError, MemschedError
from memsched.optimizer.budget import min_feasible_budget, resolve_budget
from memsched.options import SolveOptions
from memsched.schema import Schedule, Trace, check_schedule
from memsched.service import solve_trace

HEUR = {"solver": "heuristic", "time_limit_s": 5}


def trace_json(n: int = 5, scale: int = 1) -> dict:
    return synthetic_trace(n, scale=scale).model_dump(mode="json")


def test_probes(server: Server, database_url: str) -> None:
    with server.client(key=None) as c:
        assert c.get("/healthz").json()["status"] == "ok"
        ready = c.get("/readyz").json()
        assert ready["database"] == database_url.split(":", maxsplit=1)[0].split("+", maxsplit=1)[0]
        assert ready["workers"] == 2


def test_auth_required_and_json_errors(server: Server) -> None:
    with server.client(key=None) as c:
        r = c.post("/v1/traces", json=trace_json())
        assert r.status_code == 401
        assert r.headers["www-authenticate"] == "Bearer"
        assert "Bearer" in r.json()["detail"]
    with server.client(key="not-a-configured-key") as c:
        r = c.get("/v1/traces/" + "0" * 64)
        assert r.status_code == 401 and r.json()["field"] == "Authorization"


def test_traces_are_idempotent_and_private(server: Server) -> None:
    body = trace_json(4, scale=3)
    with server.client() as a, server.client(KEY_B) as b:
        r1 = a.post("/v1/traces", json=body)
        assert r1.status_code == 201, r1.text
        tid = r1.json()["id"]
        assert tid == Trace.model_validate(body).content_hash()
        assert r1.headers["location"] == f"/v1/traces/{tid}"
        # Same trace, keys in another order: same id, 200.
        r2 = a.post(
            "/v1/traces", content=json.dumps(body, sort_keys=True), headers={"content-type": "application/json"}
        )
        assert r2.status_code == 200 and r2.json()["id"] == tid
        got = a.get(f"/v1/traces/{tid}")
        assert got.status_code == 200
        assert Trace.model_validate(got.json()["trace"]) == Trace.model_validate(body)
        assert got.json()["n_layers"] == 4
        # Another key does not see it...
        assert b.get(f"/v1/traces/{tid}").status_code == 404
        # ...until it stores the same trace itself (201 for that key).
        assert b.post("/v1/traces", json=body).status_code == 201


def test_schedule_job_lifecycle_and_cache(server: Server) -> None:
    tr = synthetic_trace(6, scale=2)
    with server.client() as c:
        tid = c.post("/v1/traces", json=tr.model_dump(mode="json")).json()["id"]
        r = c.post("/v1/schedules", json={"trace_id": tid, "budget": "60%", **HEUR})
        assert r.status_code in (200, 202), r.text
        job = r.json()
        assert job["cached"] is False and job["trace_id"] == tid
        assert r.headers["location"] == f"/v1/schedules/{job['id']}"
        assert job["budget_bytes"] == resolve_budget("60%", tr)
        done = c.get(f"/v1/schedules/{job['id']}", params={"wait": 20})
        assert done.status_code == 200
        d = done.json()
        assert d["status"] == "done", d
        sc = Schedule.model_validate(d["schedule"])
        check_schedule(sc, tr)
        assert sc.prediction.peak_bytes <= d["budget_bytes"]
        # The same request again: the same job, from the cache, no new solve.
        again = c.post("/v1/schedules", json={"trace_id": tid, "budget": "60%", **HEUR})
        assert again.status_code == 200
        assert again.json()["id"] == job["id"] and again.json()["cached"] is True
        # The same budget written in bytes is the same question.
        same = c.post("/v1/schedules", json={"trace_id": tid, "budget": d["budget_bytes"], **HEUR})
        assert same.json()["id"] == job["id"]
    with server.client(KEY_B) as b:
        # Another key cannot see the job...
        assert b.get(f"/v1/schedules/{job['id']}").status_code == 404
        # ...but asking the same question (inline trace) is answered from the stored schedule as its own job.
        r = b.post("/v1/schedules", json={"trace": tr.model_dump(mode="json"), "budget": "60%", **HEUR})
        assert r.status_code == 200
        assert r.json()["id"] != job["id"]
        assert r.json()["cached"] is True and r.json()["status"] == "done"
        assert r.json()["schedule"] == d["schedule"]


def test_wait_returns_the_schedule(server: Server) -> None:
    tr = synthetic_trace(5, scale=5)
    with server.client() as c:
        r = c.post(
            "/v1/schedules", params={"wait": 20}, json={"trace": tr.model_dump(mode="json"), "budget": "70%", **HEUR}
        )
        assert r.status_code == 200, r.text
        assert r.json()["status"] == "done"
        check_schedule(Schedule.model_validate(r.json()["schedule"]), tr)


def _solved_by_the_service(server: Server, tr: Trace, budget: str, time_limit_s: float) -> Schedule:
    """POST the trace for a schedule with the default solver and wait for it (200, done)."""
    with server.client() as c:
        r = c.post(
            "/v1/schedules",
            params={"wait": 30},
            json={
                "trace": tr.model_dump(mode="json"),
                "budget": budget,
                "solver": "auto",
                "time_limit_s": time_limit_s,
            },
        )
        assert r.status_code == 200, r.text
        job = r.json()
        assert job["status"] == "done", job
    return Schedule.model_validate(job["schedule"])


def test_exact_solver_in_the_worker_pool(server: Server) -> None:
    """The default solver (the ILP) runs in the worker processes and its answer is checked like any other."""
    tr = synthetic_trace(6, scale=37)
    sc = _solved_by_the_service(server, tr, "60%", 10)
    check_schedule(sc, tr)
    local = solve_trace(tr, "60%", SolveOptions(solver="heuristic"))
    # Never worse than the heuristic (docs/architecture.md, 'What "done" means'): the service returns the optimizer's answer unchanged.
    assert sc.prediction.overhead_s <= local.prediction.overhead_s + 1e-9


def test_infeasible_budget_names_the_smallest_feasible(server: Server) -> None:
    tr = synthetic_trace(5, scale=7)
    with server.client() as c:
        r = c.post("/v1/schedules", json={"trace": tr.model_dump(mode="json"), "budget": "5%", **HEUR})
        assert r.status_code == 422
        e = r.json()
        assert e["field"] == "budget"
        assert e["min_feasible_bytes"] == min_feasible_budget(tr)
        assert "smallest feasible budget" in e["detail"]


def test_a_cpu_traces_smallest_budget_is_the_one_its_job_fits(server: Server) -> None:
    """A CPU trace plans keep and recompute by default, whose smallest budget lies above offload's. The submission
    quoted offload's (24.49 MiB on a CPU GPT-2) and the job then failed at it, naming 25.77 MiB; now the number
    given is the solve's, and a job at it is solved."""
    tr = synthetic_trace(6, scale=11)
    tr = tr.model_copy(update={"device": tr.device.model_copy(update={"name": "cpu (x86_64, 2 cores)"})})
    with pytest.raises(InfeasibleBudgetError) as local:
        solve_trace(tr, "1%", SolveOptions(**HEUR))
    assert local.value.min_feasible_bytes > min_feasible_budget(tr)  # above offload's: the case at hand
    with server.client() as c:
        body = {"trace": tr.model_dump(mode="json"), **HEUR}
        r = c.post("/v1/schedules", params={"wait": 30}, json={**body, "budget": "1%"})
        assert r.status_code in (200, 202, 422), r.text
        least = r.json()["min_feasible_bytes"]
        # The solve's own (its exact DP's, within the job's limit; the local one above ran in as much time).
        assert least > min_feasible_budget(tr), r.json()
        r = c.post("/v1/schedules", params={"wait": 30}, json={**body, "budget": least})
        assert r.status_code == 200 and r.json()["status"] == "done", r.text


@pytest.mark.parametrize(
    ("body", "params", "status", "field"),
    [
        ({"budget": "abc"}, None, 422, "budget"),
        ({"budget": "0%"}, None, 422, "budget"),
        ({"budget": -5}, None, 422, "budget"),
        ({"budget": 2**70}, None, 422, "budget"),
        ({"budget": "1e300%"}, None, 422, "budget"),
        ({"budget": "50%", "solver": "gurobi"}, None, 422, "solver"),
        ({"budget": "50%", "time_limit_s": 1e6}, None, 422, "time_limit_s"),
        ({"budget": "50%", "time_limit_s": 0}, None, 422, "time_limit_s"),
        ({"budget": "50%", "gap": 1}, None, 422, "gap"),
        ({"budget": "50%", "window": 0}, None, 422, "window"),
        # JSON's true / false are not the numbers 1 / 0 (pydantic reads them so): refused, not solved at 1 s or gap 0.
        ({"budget": "50%", "time_limit_s": True}, None, 422, "time_limit_s"),
        ({"budget": "50%", "gap": False}, None, 422, "gap"),
        ({"budget": "50%", "max_segment": True}, None, 422, "max_segment"),
        ({"budget": True}, None, 422, "budget"),
        ({"budget": "50%", "colour": "red"}, None, 422, "colour"),
        ({"budget": "50%"}, {"wait": -1}, 422, "wait"),
        ({"budget": "50%"}, {"wait": "soon"}, 422, "wait"),
    ],
)
def test_bad_schedule_requests_get_4xx_naming_the_field(server: Server, body, params, status, field) -> None:
    with server.client() as c:
        r = c.post("/v1/schedules", params=params, json={"trace": trace_json(3), "solver": "heuristic", **body})
        assert r.status_code == status, r.text
        assert r.json()["field"] == field, r.json()
        assert r.json()["detail"]


def test_other_bad_inputs(server: Server) -> None:
    with server.client() as c:
        # Neither or both of trace / trace_id.
        r = c.post("/v1/schedules", json={"budget": "50%"})
        assert r.status_code == 422 and r.json()["field"] == "trace_id"
        # A trace id that is not stored (for this key).
        r = c.post("/v1/schedules", json={"trace_id": "a" * 64, "budget": "50%"})
        assert r.status_code == 404 and r.json()["field"] == "trace_id"
        assert c.get("/v1/schedules/" + "b" * 32).status_code == 404
        assert c.get("/v1/schedules/not-an-id").status_code == 422
        # Not JSON.
        r = c.post("/v1/traces", content=b"{nope", headers={"content-type": "application/json"})
        assert r.status_code == 400 and "JSON" in r.json()["detail"]
        # An invalid trace: the message names the field path.
        bad = trace_json(3)
        bad["layers"][1]["deps"] = [2]
        r = c.post("/v1/traces", json=bad)
        assert r.status_code == 422 and "layers[1].deps[0]" in r.json()["detail"]
        bad = trace_json(3)
        bad["layers"][0]["forward_s"] = -1
        r = c.post("/v1/traces", json=bad)
        assert r.status_code == 422 and r.json()["field"] == "layers[0].forward_s"
        # Over the layer limit (40 on this server).
        r = c.post("/v1/traces", json=trace_json(41))
        assert r.status_code == 422 and r.json()["field"] == "layers" and "41 layers" in r.json()["detail"]
        r = c.post("/v1/schedules", json={"trace": trace_json(41), "budget": "50%"})
        assert r.status_code == 422 and r.json()["field"] == "trace.layers"
        # Over the body limit (512 KiB on this server), declared and chunked.
        big = b'{"x": "' + b"a" * (600 * 1024) + b'"}'
        r = c.post("/v1/traces", content=big, headers={"content-type": "application/json"})
        assert r.status_code == 413 and r.json()["field"] == "body"

        def chunks():
            for _ in range(12):
                yield b"a" * 65536

        r = c.post("/v1/traces", content=chunks(), headers={"content-type": "application/json"})
        assert r.status_code == 413
        # Unknown route and method: JSON too.
        r = c.get("/v1/nothing")
        assert r.status_code == 404 and "detail" in r.json()
        assert c.delete("/v1/traces").status_code == 405


def _absurd(kind: str) -> dict:
    t = trace_json(3, scale=41)
    if kind == "times":
        for layer in t["layers"]:
            layer["forward_s"] = layer["backward_s"] = 1e300
        t["baseline"]["step_s"] = 1e301  # consistent with its layers (the schema checks that), yet absurd
    elif kind == "bandwidth":
        t["device"]["h2d_bytes_per_s"] = t["device"]["d2h_bytes_per_s"] = 1e-300
    else:
        t["device"]["copy_latency_s"] = 1e307
    return t


@pytest.mark.parametrize(("kind", "field"), [("times", "layers"), ("bandwidth", "device"), ("latency", "device")])
def test_traces_whose_numbers_overflow_are_refused(server: Server, kind: str, field: str) -> None:
    """Valid by the schema, but no step time can be computed: a 4xx naming the part, never a 500 or a failed job."""
    with server.client() as c:
        for path, body, where in (
            ("/v1/traces", _absurd(kind), field),
            ("/v1/schedules", {"trace": _absurd(kind), "budget": "70%"}, f"trace.{field}"),
            ("/v1/compare", {"trace": _absurd(kind), "budget": "70%"}, f"trace.{field}"),
        ):
            r = c.post(path, json=body)
            assert r.status_code == 422, r.text
            assert r.json()["field"] == where and "check the units" in r.json()["detail"]


def test_nul_characters_are_accepted(server: Server) -> None:
    """JSON allows NUL in strings and PostgreSQL text does not: still a normal answer on both databases."""
    t = trace_json(3, scale=43)
    t["model"] = "odd\u0000model"
    t["layers"][0]["name"] = "layer\u0000zero"
    with server.client() as c:
        r = c.post("/v1/traces", json=t)
        assert r.status_code == 201, r.text
        got = c.get(f"/v1/traces/{r.json()['id']}").json()
        assert got["trace"]["layers"][0]["name"] == "layer\u0000zero"  # the trace itself is kept exactly
        r = c.post("/v1/schedules", params={"wait": 20}, json={"trace": t, "budget": "70%", **HEUR})
        assert r.status_code == 200 and r.json()["status"] == "done"


def test_compare(server: Server) -> None:
    tr = synthetic_trace(5)
    with server.client() as c:
        r = c.post("/v1/compare", json={"trace": tr.model_dump(mode="json"), "budget": "50%"})
        assert r.status_code == 200, r.text
        out = r.json()
        assert out["trace_id"] == tr.content_hash()
        assert out["budget_bytes"] == resolve_budget("50%", tr)
        assert {"keep-all", "checkpoint-all"} <= {row["policy"] for row in out["rows"]}
        keep = next(row for row in out["rows"] if row["policy"] == "keep-all")
        assert keep["feasible"] is False  # 50% cannot hold every activation
        r = c.post("/v1/compare", json={"trace_id": out["trace_id"], "budget": "zzz"})
        assert r.status_code == 422 and r.json()["field"] == "budget"


def test_plot_png(server: Server) -> None:
    pytest.importorskip(
        "memsched.service.plot", reason="memsched.service.plot (the timeline plot) is not in this tree yet"
    )
    tr = synthetic_trace(4, scale=11)
    with server.client() as c:
        job = c.post(
            "/v1/schedules", params={"wait": 20}, json={"trace": tr.model_dump(mode="json"), "budget": "60%", **HEUR}
        ).json()
        assert job["status"] == "done"
        r = c.get(job["links"]["plot"], timeout=60)
        assert r.status_code == 200, r.text
        assert r.headers["content-type"] == "image/png"
        assert r.content.startswith(b"\x89PNG\r\n\x1a\n")
        assert c.get(job["links"]["plot"]).content == r.content  # stored, not redrawn
    with server.client(KEY_B) as b:
        assert b.get(job["links"]["plot"]).status_code == 404


def test_metrics(server: Server) -> None:
    with server.client() as c:
        c.post("/v1/schedules", params={"wait": 20}, json={"trace": trace_json(3, scale=13), "budget": "80%", **HEUR})
        c.post("/v1/schedules", json={"trace": trace_json(3, scale=13), "budget": "80%", **HEUR})
        text = c.get("/metrics").text
    assert 'memsched_jobs{state="done"}' in text
    assert "memsched_solve_seconds_count" in text
    hits = [line for line in text.splitlines() if line.startswith("memsched_cache_hits_total")]
    assert hits and float(hits[0].split()[-1]) >= 1


def test_solve_via_server_round_trip(server: Server) -> None:
    from memsched.cli.api import solve_via_server

    tr = synthetic_trace(7, scale=17)
    opts = SolveOptions(solver="heuristic", time_limit_s=5)
    remote = solve_via_server(server.url, tr, "55%", opts, KEY_A)
    local = solve_trace(tr, "55%", opts)
    check_schedule(remote, tr)
    assert remote.actions == local.actions
    assert remote.prediction == local.prediction
    assert remote.budget_bytes == local.budget_bytes
    with pytest.raises(InfeasibleBudgetError) as e:
        solve_via_server(server.url, tr, "1%", opts, KEY_A)
    assert e.value.min_feasible_bytes == min_feasible_budget(tr)
    # Said as this command's user fixes it: the flag, not the request field; the key as --api-key.
    assert "Raise --budget to at least that" in str(e.value) and "request's" not in str(e.value)
    with pytest.raises(MemschedError) as no_key:
        solve_via_server(server.url, tr, "55%", opts, None)
    assert "--api-key" in str(no_key.value) and "Bearer" not in str(no_key.value)
    with pytest.raises(MemschedError, match="unknown API key"):
        solve_via_server(server.url, tr, "55%", opts, "wrong-key-123")


def test_cli_solve_with_server(server: Server, tmp_path) -> None:
    """`memsched solve --server URL` posts to the service and writes the schedule it gets back."""
    tr = synthetic_trace(5, scale=19)
    src = tmp_path / "trace.json"
    src.write_text(tr.model_dump_json())
    out = tmp_path / "schedule.json"
    cmd = [
        sys.executable,
        "-c",
        "from memsched.cli import main; main()",
        "solve",
        str(src),
        "--budget",
        "60%",
        "--solver",
        "heuristic",
        "--time-limit",
        "5",
        "--server",
        server.url,
        "-o",
        str(out),
        "--json",
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env={**_env(), "MEMSCHED_API_KEY": KEY_A})
    assert r.returncode == 0, r.stderr
    check_schedule(Schedule.model_validate_json(out.read_text()), tr)
    # The job is on the server: the same request is now a cache hit.
    with server.client() as c:
        again = c.post("/v1/schedules", json={"trace": tr.model_dump(mode="json"), "budget": "60%", **HEUR})
        assert again.json()["cached"] is True
    # A server that is not there: exit 2 with one line naming the URL.
    r = subprocess.run(
        [*cmd[:-5], "--server", "http://127.0.0.1:9", "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=60,
        env=_env(),
    )
    assert r.returncode == 2 and "cannot reach http://127.0.0.1:9" in r.stderr


def _env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if k != "MEMSCHED_API_KEY"}


def test_no_5xx_in_server_log(server: Server) -> None:
    """Whatever the tests above sent, the server answered none of it with a 5xx."""
    assert '" 5' not in server.log(), server.log()


def test_openapi_is_complete(server: Server) -> None:
    spec = httpx.get(server.url + "/openapi.json").json()
    paths = spec["paths"]
    for p in (
        "/v1/traces",
        "/v1/traces/{trace_id}",
        "/v1/schedules",
        "/v1/schedules/{job_id}",
        "/v1/schedules/{job_id}/plot.png",
        "/v1/compare",
        "/healthz",
        "/readyz",
        "/metrics",
    ):
        assert p in paths, p
    req = spec["components"]["schemas"]["ScheduleRequest"]
    assert req.get("examples"), "ScheduleRequest has examples"
    assert "422" in paths["/v1/schedules"]["post"]["responses"]
    assert "bearer" in json.dumps(spec.get("components", {}).get("securitySchemes", {})).lower()


def test_a_trace_whose_code_saves_between_layers_gets_segments_that_end_there(server: Server) -> None:
    """A trace per sub-module (Layer.code_after_saves on every gap): the service's schedule recomputes in one-layer
    segments, checks against the trace, and its details say why; the marks survive the round trip."""
    tr = synthetic_trace(8, scale=37)
    for layer in tr.layers[:-1]:
        layer.code_after_saves = True
    sc = _solved_by_the_service(server, tr, "30%", 5)
    check_schedule(sc, tr)  # the same hash: the marks reached the solver
    assert any(a.action == "recompute" for a in sc.actions)
    assert all(a.recompute_group in (None, i) for i, a in enumerate(sc.actions))
    assert any("code_after_saves" in d for d in sc.solver.details)
