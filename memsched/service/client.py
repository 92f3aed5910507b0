"""HTTP client of the memsched service (`memsched solve --server URL`).

Errors come back as the core's exceptions, so the CLI reports a remote error exactly like a local one:
4xx -> MemschedError (InfeasibleBudgetError when the server names the smallest feasible budget,
InfeasibleHostBudgetError when it names the smallest host budget, from a 422 or a failed job),
an unreachable server -> MemschedError naming the URL, a failed job or a 5xx -> SolverError.
"""

from __future__ import annotations

import logging
import time
from types import TracebackType
from typing import Any

import httpx

from memsched.errors import (
    CLI_TO_API_FIXES,
    InfeasibleBudgetError,
    InfeasibleHostBudgetError,
    MemschedError,
    SolverError,
)
from memsched.options import SERVER_QUEUE_SLACK_S, SolveOptions
from memsched.schema import JobStatus, Schedule, Trace, check_schedule
from memsched.units import BudgetSpec

log = logging.getLogger(__name__)

# Each long-poll asks the server to hold the request this long; the server clips it to MEMSCHED_MAX_WAIT_S.
_POLL_WAIT_S = 30.0


class MemschedClient:
    """A thin client over the REST API; one httpx connection pool per instance (use as a context manager)."""

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        timeout_s: float = 60.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise MemschedError(f"server: {base_url!r} is not an http(s) URL; write it like http://host:8000")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.base_url = base_url.rstrip("/")
        # The read timeout must outlast a long-poll, or every wait would end in a timeout error.
        self._http = httpx.Client(
            base_url=self.base_url,
            headers=headers,
            timeout=httpx.Timeout(timeout_s + _POLL_WAIT_S, connect=10.0),
            transport=transport,  # tests pass httpx.MockTransport
        )

    def __enter__(self) -> MemschedClient:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    # ------------------------------------------------------------------ requests

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            resp = self._http.request(method, path, **kwargs)
        except httpx.TransportError as e:
            raise MemschedError(
                f"server: cannot reach {self.base_url} ({type(e).__name__}: {e}); check the URL and that "
                "`memsched serve` is running there"
            ) from None
        if resp.status_code < 400:
            return resp
        try:
            body = resp.json()
        except ValueError:
            body = {}
        detail = body.get("detail") if isinstance(body, dict) else None
        detail = _as_cli(str(detail or resp.text[:500] or resp.reason_phrase))
        if resp.status_code >= 500:
            raise SolverError(f"server {self.base_url} failed ({resp.status_code}): {detail}")
        if isinstance(body, dict) and isinstance(body.get("min_feasible_bytes"), int):
            budget = body.get("budget_bytes")
            raise _InfeasibleFromServer(
                detail, int(budget) if isinstance(budget, int) else 0, int(body["min_feasible_bytes"])
            )
        if isinstance(body, dict) and isinstance(body.get("min_feasible_host_bytes"), int):
            raise _HostInfeasibleFromServer(detail, body, int(body["min_feasible_host_bytes"]))
        field = body.get("field") if isinstance(body, dict) else None
        prefix = "" if not field or str(detail).startswith(str(field)) else f"{field}: "
        raise MemschedError(f"server answered {resp.status_code}: {prefix}{detail}")

    def upload_trace(self, trace: Trace) -> str:
        """Store a trace; returns its id (the content hash). Idempotent."""
        resp = self._request(
            "POST", "/v1/traces", content=trace.model_dump_json(), headers={"content-type": "application/json"}
        )
        return str(resp.json()["id"])

    def submit(
        self,
        trace: Trace | str,
        budget: BudgetSpec | str | int,
        options: SolveOptions | None = None,
        wait_s: float = 0.0,
    ) -> dict[str, Any]:
        """Queue a solve of a trace (inline, or a stored trace's id); returns the job (JSON)."""
        options = options or SolveOptions()
        # The request extends SolveOptions: its fields go as they are (None: the server's default).
        body: dict[str, Any] = {"budget": budget_to_json(budget), **options.model_dump(mode="json", exclude_none=True)}
        if isinstance(trace, Trace):
            body["trace"] = trace.model_dump(mode="json")
        else:
            body["trace_id"] = trace
        resp = self._request("POST", "/v1/schedules", json=body, params={"wait": wait_s} if wait_s else None)
        job: dict[str, Any] = resp.json()
        return job

    def job(self, job_id: str, wait_s: float = 0.0) -> dict[str, Any]:
        resp = self._request("GET", f"/v1/schedules/{job_id}", params={"wait": wait_s} if wait_s else None)
        job: dict[str, Any] = resp.json()
        return job

    def jobs(self, status: str | None = None, limit: int = 50, before: str | None = None) -> dict[str, Any]:
        """A page of this key's jobs, newest first (GET /v1/schedules)."""
        params: dict[str, Any] = {"limit": limit}
        if status is not None:
            params["status"] = status
        if before is not None:
            params["before"] = before
        page: dict[str, Any] = self._request("GET", "/v1/schedules", params=params).json()
        return page

    def cancel(self, job_id: str) -> dict[str, Any]:
        """Cancel a queued or running job (POST /v1/schedules/{id}/cancel); the job as it is afterwards."""
        job: dict[str, Any] = self._request("POST", f"/v1/schedules/{job_id}/cancel").json()
        return job

    def wait(self, job: dict[str, Any], timeout_s: float) -> Schedule:
        """Long-poll the job until it is done (its Schedule) or failed (SolverError / MemschedError)."""
        deadline = time.monotonic() + timeout_s
        while job["status"] not in JobStatus.finished():
            left = deadline - time.monotonic()
            if left <= 0:
                raise SolverError(
                    f"server: job {job['id']} is still {job['status']} after {timeout_s:g} s of waiting; it goes "
                    f"on there and keeps its answer: fetch it later with `memsched jobs wait {job['id']} --server "
                    f"{self.base_url}` (or GET {self.base_url}/v1/schedules/{job['id']})"
                )
            job = self.job(job["id"], wait_s=min(_POLL_WAIT_S, max(left, 0.1)))
        if job["status"] == JobStatus.CANCELLED:
            raise SolverError(f"server: job {job['id']} was cancelled ({job.get('reason') or 'no reason given'})")
        if job["status"] == JobStatus.FAILED:
            reason = job.get("reason") or "no reason given"
            if job.get("min_feasible_bytes") is not None:
                raise _InfeasibleFromServer(reason, int(job["budget_bytes"]), int(job["min_feasible_bytes"]))
            if job.get("min_feasible_host_bytes") is not None:
                raise _HostInfeasibleFromServer(reason, job, int(job["min_feasible_host_bytes"]))
            raise SolverError(f"server: job {job['id']} failed: {reason}")
        return Schedule.model_validate(job["schedule"])

    def compare(self, trace: Trace | str, budget: BudgetSpec | str | int) -> dict[str, Any]:
        body: dict[str, Any] = {"budget": budget_to_json(budget)}
        if isinstance(trace, Trace):
            body["trace"] = trace.model_dump(mode="json")
        else:
            body["trace_id"] = trace
        out: dict[str, Any] = self._request("POST", "/v1/compare", json=body).json()
        return out

    def plot(self, job_id: str) -> bytes:
        return self._request("GET", f"/v1/schedules/{job_id}/plot.png").content


class _InfeasibleFromServer(InfeasibleBudgetError):
    """InfeasibleBudgetError carrying the server's own message (same wording as a local solve's)."""

    def __init__(self, message: str, budget_bytes: int, min_feasible_bytes: int) -> None:
        super().__init__(budget_bytes, min_feasible_bytes)
        self.args = (message,)

    def __str__(self) -> str:
        return str(self.args[0])


class _HostInfeasibleFromServer(InfeasibleHostBudgetError):
    """InfeasibleHostBudgetError carrying the server's own message, from a 422 body or a failed job (their
    `host_budget_bytes` / `host_budget` and `budget_bytes` where given)."""

    def __init__(self, message: str, body: dict[str, Any], min_host_bytes: int) -> None:
        host = body.get("host_budget_bytes", body.get("host_budget"))
        budget = body.get("budget_bytes")
        super().__init__(
            int(host) if isinstance(host, int) else 0, int(budget) if isinstance(budget, int) else 0, min_host_bytes
        )
        self.args = (message,)

    def __str__(self) -> str:
        return str(self.args[0])


def budget_to_json(budget: BudgetSpec | str | int) -> int | str:
    """The API's budget: integer bytes, or the string form ('50%', '8GiB') for the server to resolve."""
    if isinstance(budget, BudgetSpec):
        if budget.percent is not None:
            return f"{budget.percent:g}%"
        assert budget.bytes is not None
        return budget.bytes
    return budget


def solve_via_server(
    url: str,
    trace: Trace,
    budget: BudgetSpec | str | int,
    options: SolveOptions | None = None,
    api_key: str | None = None,
) -> Schedule:
    """Solve on a memsched service instead of locally: same inputs, same Schedule, same errors."""
    options = options or SolveOptions()
    timeout_s = options.time_limit_s + SERVER_QUEUE_SLACK_S
    with MemschedClient(url, api_key) as client:
        job = client.submit(trace, budget, options, wait_s=min(_POLL_WAIT_S, timeout_s))
        log.info("server job %s: %s", job["id"], job["status"])
        schedule = client.wait(job, timeout_s)
    # The server's schedule must belong to this trace: catches a misbehaving proxy or server version skew.
    check_schedule(schedule, trace)
    return schedule


_API_KEY_FIX = "send 'Authorization: Bearer <key>' with a key from MEMSCHED_API_KEYS"


def _as_cli(detail: str) -> str:
    """A server's error as this command's user fixes it: the flag to change, not the request field (the service's
    wording, errors.CLI_TO_API_FIXES turned back), and --api-key for the Authorization header."""
    for cli, api in CLI_TO_API_FIXES.items():
        detail = detail.replace(api, cli)
    return detail.replace(
        _API_KEY_FIX, "give --api-key KEY (or MEMSCHED_API_KEY), a key from the server's MEMSCHED_API_KEYS"
    )
