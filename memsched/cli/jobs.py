"""`memsched jobs list|get|wait|cancel`: the jobs a user submitted to a memsched service (`solve --server`), the
same calls as the API's (GET /v1/schedules, GET /v1/schedules/{id}, POST /v1/schedules/{id}/cancel)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from memsched.errors import MemschedError
from memsched.io import save_model
from memsched.schema import JobStatus, Schedule
from memsched.units import format_bytes

if TYPE_CHECKING:
    from memsched.service.client import MemschedClient

jobs_app = typer.Typer(help="The jobs you submitted to a memsched service (solve --server).", no_args_is_help=True)
out = Console()

ServerOpt = Annotated[
    str, typer.Option("--server", envvar="MEMSCHED_SERVER", help="The service's URL (env MEMSCHED_SERVER).")
]
KeyOpt = Annotated[str | None, typer.Option("--api-key", envvar="MEMSCHED_API_KEY", help="Bearer key.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
OutputOpt = Annotated[
    Path | None, typer.Option("-o", "--output", help="Write the job's schedule here once it is done.")
]


def _client(server: str, api_key: str | None) -> MemschedClient:
    try:
        from memsched.service.client import MemschedClient
    except ModuleNotFoundError as e:
        if e.name != "httpx":
            raise
        raise MemschedError("memsched jobs needs the HTTP client httpx: pip install 'memsched[api]'") from None
    return MemschedClient(server, api_key)


def _print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2) + "\n")


def _table(jobs: list[dict[str, Any]], title: str) -> Table:
    t = Table(title=title)
    for col in ("id", "status", "created (UTC)", "budget", "solver", "overhead", "reason"):
        t.add_column(col)
    for j in jobs:
        sched = j.get("schedule")
        overhead = f"{sched['prediction']['overhead_pct']:+.2f}%" if sched else ""
        t.add_row(
            j["id"],
            j["status"],
            str(j["created_at"])[:19].replace("T", " "),
            f"{j['budget']} ({format_bytes(j['budget_bytes'])})",
            j["solver"],
            overhead,
            (j.get("reason") or "")[:80],
        )
    return t


def _report(job: dict[str, Any], output: Path | None, as_json: bool) -> None:
    """Write the job's schedule (with -o) and print the job: JSON or a one-row table."""
    _save_schedule(job, output)
    if as_json:
        _print_json(job)
        return
    out.print(_table([job], f"job {job['id']}"))


def _save_schedule(job: dict[str, Any], output: Path | None) -> None:
    if output is None:
        return
    if job["status"] != JobStatus.DONE or not job.get("schedule"):
        raise MemschedError(f"-o {output}: job {job['id']} is {job['status']}, so it has no schedule to write yet")
    save_model(Schedule.model_validate(job["schedule"]), output)


@jobs_app.command("list")
def list_cmd(
    server: ServerOpt,
    api_key: KeyOpt = None,
    status: Annotated[str | None, typer.Option(help="Only jobs in this state: " + " | ".join(JobStatus))] = None,
    limit: Annotated[int, typer.Option(help="At most this many jobs (1 to 500).")] = 50,
    as_json: JsonOpt = False,
) -> None:
    """Your jobs on the service, newest first."""
    if status is not None and status not in set(JobStatus):
        raise MemschedError(f"--status: {status!r} is not a job state; use one of {', '.join(JobStatus)}")
    if not 1 <= limit <= 500:
        raise MemschedError(f"--limit: must be 1 to 500, got {limit}")
    with _client(server, api_key) as c:
        page = c.jobs(status, limit)
    if as_json:
        _print_json(page)
        return
    out.print(_table(page["jobs"], f"{len(page['jobs'])} jobs on {server}"))


@jobs_app.command("get")
def get_cmd(
    job_id: Annotated[str, typer.Argument(help="The job's id.")],
    server: ServerOpt,
    api_key: KeyOpt = None,
    output: OutputOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """One job's state (and its schedule, with -o, once it is done)."""
    with _client(server, api_key) as c:
        job = c.job(job_id)
    _report(job, output, as_json)


@jobs_app.command("wait")
def wait_cmd(
    job_id: Annotated[str, typer.Argument(help="The job's id.")],
    server: ServerOpt,
    api_key: KeyOpt = None,
    timeout: Annotated[float, typer.Option(help="Give up after this many seconds.")] = 600.0,
    output: OutputOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Wait until the job is done (write its schedule with -o); a failed or cancelled job exits 1 with its reason."""
    if not timeout > 0:
        raise MemschedError(f"--timeout: must be > 0 seconds, got {timeout}")
    with _client(server, api_key) as c:
        c.wait(c.job(job_id), timeout)  # raises with the reason unless it is done
        job = c.job(job_id)
    _report(job, output, as_json)


@jobs_app.command("cancel")
def cancel_cmd(
    job_id: Annotated[str, typer.Argument(help="The job's id.")],
    server: ServerOpt,
    api_key: KeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Cancel a queued or running job (a running solve ends at its time limit; its answer is discarded)."""
    with _client(server, api_key) as c:
        job = c.cancel(job_id)
    _report(job, None, as_json)
