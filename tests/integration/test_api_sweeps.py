"""POST /v1/sweeps and /v1/sweeps/timeline on a real server (SQLite and PostgreSQL): a sweep answers the curve
the service function gives, on the link asked for; bad input is a 422 naming the field (an empty or infeasible
budget range, a link of 0, too many points), never a 500; the page and its script come from the server."""

from __future__ import annotations

import pytest

from helpers.api import Server, upload_trace
from memsched.api.examples import synthetic_trace
from memsched.optimizer.budget import keepall_activation_peak, min_feasible_budget

pytestmark = pytest.mark.timeout(300)

TRACE = synthetic_trace(6, model="synthetic/sweep")


@pytest.fixture(scope="module")
def trace_id(server: Server) -> str:
    return upload_trace(server, TRACE)


def test_sweep_answers_the_curve(server: Server, trace_id: str) -> None:
    with server.client(timeout=120) as c:
        r = c.post("/v1/sweeps", json={"trace_id": trace_id, "points": 4, "time_limit_s": 2, "link": "pcie3"})
        assert r.status_code == 200, r.text
        doc = r.json()
    assert doc["trace_id"] == trace_id and len(doc["points"]) == 4
    assert doc["lo_bytes"] == min_feasible_budget(TRACE)
    assert doc["hi_bytes"] == TRACE.static.total + keepall_activation_peak(TRACE)
    for p in doc["points"]:
        assert p["schedule"]["planned_for"]["link"] == "pcie3"
        assert p["schedule"]["prediction"]["peak_bytes"] <= p["budget_bytes"]
        assert p["bound_s"] is None or p["bound_s"] <= p["overhead_s"] + 1e-12
    assert doc["points"][-1]["overhead_s"] == 0.0
    with server.client() as c:
        tl = c.post("/v1/sweeps/timeline", json={"trace_id": trace_id, "schedule": doc["points"][0]["schedule"]})
        assert tl.status_code == 200, tl.text
        assert len(tl.json()["stages"]) == 2 * TRACE.n and tl.json()["link"] == "pcie3"


@pytest.mark.parametrize(
    ("body", "field", "needle"),
    [
        ({"budget_from": 30_000_000, "budget_to": 30_000_000}, "budget_from", "not below the end"),
        ({"budget_from": "90%", "budget_to": "10%"}, "budget_from", "not below the end"),
        ({"link": 0}, "link", "> 0 bytes/s"),
        ({"link": "-5e9"}, "link", "> 0 bytes/s"),
        ({"link": "pcie9"}, "link", "unknown link"),
        ({"ranks_per_link": 0}, "ranks_per_link", "greater than or equal to 1"),
        ({"points": 1}, "points", "greater than or equal to 2"),
        ({"points": 201}, "points", "less than or equal to 200"),
        ({"points": True}, "points", "not true"),
        ({"time_limit_s": True}, "time_limit_s", "not true"),
        ({"points": 200, "time_limit_s": 60}, "points", "ceiling"),
        ({"time_limit_s": 0}, "time_limit_s", "greater than 0"),
        ({"budget_to": "lots"}, "budget_to", ""),
        ({"gap": 2}, "gap", "less than 1"),
        ({"trace_id": None}, "trace_id", "exactly one of"),
        ({"colour": "red"}, "colour", "Extra inputs"),
        ({"refine": "sometimes"}, "refine", "boolean"),
    ],
)
def test_bad_input_is_422(server: Server, trace_id: str, body: dict, field: str, needle: str) -> None:
    with server.client() as c:
        r = c.post("/v1/sweeps", json={"trace_id": trace_id, "points": 3, "time_limit_s": 1, **body})
    assert r.status_code == 422, r.text
    err = r.json()
    assert err["field"] == field and needle in err["detail"], err


def test_range_below_the_smallest_feasible_budget(server: Server, trace_id: str) -> None:
    floor = min_feasible_budget(TRACE)
    with server.client() as c:
        r = c.post("/v1/sweeps", json={"trace_id": trace_id, "points": 3, "budget_to": floor - 1})
    assert r.status_code == 422, r.text
    err = r.json()
    assert err["min_feasible_bytes"] == floor and err["field"] == "budget_to" and "infeasible" in err["detail"]


def test_unknown_trace_and_foreign_schedule(server: Server, trace_id: str) -> None:
    with server.client() as c:
        assert c.post("/v1/sweeps", json={"trace_id": "0" * 64, "points": 3}).status_code == 404
        other = synthetic_trace(4, model="synthetic/other")
        oid = c.post("/v1/traces", json=other.model_dump(mode="json")).json()["id"]
        sweep = c.post("/v1/sweeps", json={"trace_id": oid, "points": 2, "time_limit_s": 1}).json()
        r = c.post("/v1/sweeps/timeline", json={"trace_id": trace_id, "schedule": sweep["points"][0]["schedule"]})
        assert r.status_code == 422 and r.json()["field"] == "schedule", r.text


def test_compare_takes_a_link(server: Server, trace_id: str) -> None:
    with server.client() as c:
        ok = c.post("/v1/compare", json={"trace_id": trace_id, "budget": "50%", "link": "pcie4", "ranks_per_link": 2})
        assert ok.status_code == 200, ok.text
        bad = c.post("/v1/compare", json={"trace_id": trace_id, "budget": "50%", "link": 0})
        assert bad.status_code == 422 and bad.json()["field"] == "link", bad.text


def test_page_and_script_come_from_the_server(server: Server, trace_id: str) -> None:
    with server.client(key=None) as c:  # a browser navigating has no key: the page holds no data
        page = c.get(f"/ui/traces/{trace_id}")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert "http://" not in page.text and "https://" not in page.text and "cdn" not in page.text.lower()
        assert '<script src="/ui/plotly.min.js">' in page.text
        js = c.get("/ui/plotly.min.js")
        assert js.status_code == 200 and len(js.content) > 1_000_000 and b"plotly" in js.content[:2000].lower()
        assert c.get("/ui/traces/not-a-hash").status_code == 422
