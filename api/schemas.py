"""Request and response bodies of the HTTP API (pydantic), with the examples the OpenAPI docs show."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PlainValidator, WithJsonSchema, field_validator

from memsched.api.examples import EXAMPLE_TRACE
from memsched.hardware import LinkPreset, parse_link
from memsched.options import SolveOptions, not_a_bool, option_help, parse_host_budget
from memsched.schema import JobStatus, Schedule, Trace, validate_trace
from memsched.service import CompareRow
from memsched.service.sweep import SweepResult
from memsched.units import MAX_BYTES

TraceId = Annotated[
    str,
    Field(pattern=r"^[0-9a-f]{64}$", description="a trace id: the sha256 content hash returned by POST /v1/traces"),
]
JobId = Annotated[str, Field(pattern=r"^[0-9a-f]{32}$", description="a schedule job id")]


def _strict_trace(v: object) -> object:
    # Strictness set on the field does not reach nested models, so the whole trace is validated here
    # (validate_trace: strictly, as the CLI reads a trace file).
    return validate_trace(v) if isinstance(v, dict) else v


StrictTrace = Annotated[Trace, BeforeValidator(_strict_trace)]
"""A Trace as the API accepts it: the same model, validated strictly."""


def _check_budget(v: object) -> int | str:
    # One validator for both forms, so an error names the field `budget` (a pydantic union would report one
    # error per branch under internal names such as `budget.constrained-int`).
    if isinstance(v, int) and not isinstance(v, bool):
        if v <= 0:
            raise ValueError(f"must be > 0 bytes, got {v}; give a positive size such as 8589934592 or '8GiB'")
        return v
    if isinstance(v, str):
        if not 1 <= len(v) <= 64:
            raise ValueError("write the budget as 1 to 64 characters, like '8GiB', '500MB' or '50%'")
        return v
    raise ValueError(f"must be an integer number of bytes or a string like '8GiB' or '50%', got {type(v).__name__}")


# The budget is an integer number of bytes (the whole device-memory peak) or a string the CLI also reads:
# "8GiB", "500MB", "1.5e9", or "N%" (static bytes + N% of the keep-all activation peak; docs/architecture.md,
# 'Units and budgets').
Budget = Annotated[
    int | str,
    PlainValidator(_check_budget),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "integer", "exclusiveMinimum": 0, "description": "bytes (the whole device-memory peak)"},
                {
                    "type": "string",
                    "minLength": 1,
                    "maxLength": 64,
                    "description": "a size such as '8GiB', '500MB', '1.5e9', or a percentage such as '50%'",
                },
            ],
            "title": "Budget",
            "description": "memory budget: bytes as an integer, or '8GiB' / '500MB' / '50%' as a string",
        }
    ),
]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ErrorBody(BaseModel):
    """Every 4xx answer: what is wrong, and which field, so a client can show it next to the input."""

    detail: str = Field(description="what is wrong and how to fix it")
    field: str | None = Field(default=None, description="the offending field, e.g. 'budget' or 'trace.layers'")
    min_feasible_bytes: int | None = Field(
        default=None, description="for an infeasible budget: the smallest budget that is feasible, in bytes"
    )
    budget_bytes: int | None = Field(default=None, description="for an infeasible budget: the budget asked for")
    min_feasible_host_bytes: int | None = Field(
        default=None,
        description="for a host budget that no plan fits at this device budget: the smallest host budget that "
        "works, in bytes (see `detail` where it is an upper estimate: the search for a smaller one ran out of time)",
    )
    host_budget_bytes: int | None = Field(default=None, description="for an infeasible host budget: the one asked for")

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "detail": "budget: 11.56 MiB (12121000 bytes) is infeasible; the smallest feasible budget "
                    "for this trace is 15.46 MiB (16210000 bytes). Raise the request's `budget` field to at least that",
                    "field": "budget",
                    "min_feasible_bytes": 16210000,
                    "budget_bytes": 12121000,
                }
            ]
        }
    )


class TraceRef(BaseModel):
    """A stored trace, without its body."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "id": "31c90ea80ae7eeec499e0d0e38c4be0ad36b155a713af3f3cd4bbb5506af0fa5",
                    "model": "synthetic/mlp",
                    "n_layers": 3,
                    "created_at": "2026-11-22T09:52:41.203299Z",
                }
            ]
        }
    )

    id: TraceId
    model: str = Field(description="the trace's model id")
    n_layers: int = Field(description="number of layers")
    created_at: datetime = Field(description="when it was first stored (UTC)")


class TraceOut(TraceRef):
    """A stored trace with its body."""

    trace: Trace


class ScheduleRequest(SolveOptions):
    """Solve one trace (stored, by id; or inline, which also stores it) under one budget. The solve options are
    SolveOptions' own fields; an absent `time_limit_s` takes the server's default (MEMSCHED_DEFAULT_TIME_LIMIT_S),
    and any is capped by MEMSCHED_MAX_TIME_LIMIT_S."""

    trace_id: TraceId | None = Field(default=None, description="id of a stored trace (give this or `trace`)")
    trace: StrictTrace | None = Field(default=None, description="an inline trace (give this or `trace_id`)")
    budget: Budget

    def options(self) -> SolveOptions:
        """The request's solve options alone."""
        return SolveOptions.model_validate({name: getattr(self, name) for name in SolveOptions.model_fields})

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {"trace": EXAMPLE_TRACE, "budget": "70%", "solver": "heuristic", "time_limit_s": 10},
                {"trace_id": "0" * 64, "budget": 20605000, "solver": "auto", "time_limit_s": 30},
            ]
        }
    )


class CompareRequest(_Strict):
    """Judge every baseline policy on one trace under one budget."""

    trace_id: TraceId | None = Field(default=None, description="id of a stored trace (give this or `trace`)")
    trace: StrictTrace | None = Field(default=None, description="an inline trace (give this or `trace_id`)")
    budget: Budget
    link: Annotated[LinkPreset | float | None, BeforeValidator(lambda v: None if v is None else parse_link(v))] = Field(
        default=None, description=option_help("link")
    )
    ranks_per_link: int | None = Field(default=None, ge=1, le=4096, description=option_help("ranks_per_link"))
    host_budget: Annotated[int | None, BeforeValidator(lambda v: None if v is None else parse_host_budget(v))] = Field(
        default=None, ge=0, le=MAX_BYTES, description=option_help("host_budget")
    )

    model_config = ConfigDict(json_schema_extra={"examples": [{"trace": EXAMPLE_TRACE, "budget": "70%"}]})


class SweepRequest(SolveOptions):
    """Solve a trace at `points` budgets, from `budget_from` (default: the smallest feasible) to `budget_to`
    (default: keep-all's peak), placed where the curve bends. The solve options are SolveOptions' own fields;
    `time_limit_s` is each point's limit (absent: 5 s)."""

    trace_id: TraceId | None = Field(default=None, description="id of a stored trace (give this or `trace`)")
    trace: StrictTrace | None = Field(default=None, description="an inline trace (give this or `trace_id`)")
    points: int = Field(default=20, ge=2, le=200, description="how many budgets to solve (2-200)")
    budget_from: Budget | None = Field(default=None, description="the smallest budget (default: the smallest feasible)")
    budget_to: Budget | None = Field(default=None, description="the largest budget (default: keep-all's peak)")
    refine: bool = Field(
        default=True,
        description="solve the points left outside the gap again with the time the sweep has left of its budget "
        "(points x time_limit_s over the server's workers)",
    )

    def options(self) -> SolveOptions:
        """The request's solve options alone."""
        return SolveOptions.model_validate({name: getattr(self, name) for name in SolveOptions.model_fields})

    @field_validator("points", mode="before")
    @classmethod
    def _points_a_number(cls, v: object) -> object:
        return not_a_bool(v, "a number of budgets (2-200)")


class SweepOut(SweepResult):
    """The curve (memsched.service.sweep.SweepResult) and the stored trace it belongs to."""

    trace_id: TraceId


class TimelineRequest(_Strict):
    """A schedule of a stored trace, to be drawn."""

    trace_id: TraceId = Field(description="id of the stored trace the schedule was made for")
    schedule: Schedule = Field(description="the schedule (a point of a sweep, or any schedule of this trace)")


class CompareOut(BaseModel):
    """The baseline table (the same as `memsched compare`)."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "trace_id": "31c90ea80ae7eeec499e0d0e38c4be0ad36b155a713af3f3cd4bbb5506af0fa5",
                    "budget_bytes": 14347000,
                    "static_bytes": 10000000,
                    "keepall_activation_bytes": 6210000,
                    "rows": [
                        {
                            "policy": "keep-all",
                            "feasible": False,
                            "peak_bytes": 16210000,
                            "step_s": 0.05,
                            "overhead_pct": 0.0,
                        },
                        {
                            "policy": "checkpoint-all",
                            "feasible": True,
                            "peak_bytes": 13310000,
                            "step_s": 0.056,
                            "overhead_pct": 12.0,
                        },
                    ],
                }
            ]
        }
    )

    trace_id: TraceId
    budget_bytes: int = Field(description="the resolved budget in bytes")
    static_bytes: int = Field(description="static bytes of the trace")
    keepall_activation_bytes: int = Field(description="keep-all peak activation bytes (what 100% means)")
    rows: list[CompareRow]


class JobOut(SolveOptions):
    """A schedule job: its state, its solve options (SolveOptions' fields), and the schedule once done."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "id": "215a780705da42519e5630ceb401966a",
                    "status": "queued",
                    "trace_id": "31c90ea80ae7eeec499e0d0e38c4be0ad36b155a713af3f3cd4bbb5506af0fa5",
                    "budget": "50%",
                    "budget_bytes": 17605000,
                    "solver": "auto",
                    "time_limit_s": 30.0,
                    "gap": 0.01,
                    "window": None,
                    "max_segment": None,
                    "cached": False,
                    "reason": None,
                    "min_feasible_bytes": None,
                    "attempts": 0,
                    "solve_s": None,
                    "created_at": "2026-11-22T09:52:41.223034Z",
                    "started_at": None,
                    "finished_at": None,
                    "schedule": None,
                    "links": {
                        "self": "/v1/schedules/215a780705da42519e5630ceb401966a",
                        "trace": "/v1/traces/31c90ea80ae7eeec499e0d0e38c4be0ad36b155a713af3f3cd4bbb5506af0fa5",
                        "plot": "/v1/schedules/215a780705da42519e5630ceb401966a/plot.png",
                    },
                }
            ]
        }
    )

    id: JobId
    status: JobStatus = Field(description="queued | running | done | failed | cancelled")
    trace_id: TraceId
    budget: str = Field(description="the budget as requested")
    budget_bytes: int = Field(description="the budget in bytes")
    cached: bool = Field(description="true when the schedule came from an identical earlier request")
    reason: str | None = Field(default=None, description="why the job failed (or what happened to it)")
    min_feasible_bytes: int | None = Field(default=None, description="for an infeasible budget: the smallest one")
    min_feasible_host_bytes: int | None = Field(
        default=None, description="for a host budget too small at this budget: the smallest one that works"
    )
    attempts: int = Field(description="how many times a worker has started it")
    solve_s: float | None = Field(default=None, description="wall seconds the solve took")
    created_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None
    schedule: Schedule | None = Field(default=None, description="the schedule, once status is done")
    links: dict[str, str] = Field(default_factory=dict, description="related URLs: self, trace, plot")


class JobList(BaseModel):
    """A page of the caller's schedule jobs, newest first, without their schedules (GET each for it)."""

    jobs: list[JobOut] = Field(description="the jobs (`schedule` is left out: GET /v1/schedules/{id} has it)")
    next_before: datetime | None = Field(
        default=None, description="pass as `before` for the next page; absent on the last page"
    )


class Health(BaseModel):
    status: str = Field(description="'ok'")
    version: str = Field(description="memsched version")


class Ready(Health):
    database: str = Field(description="database backend (sqlite or postgresql)")
    workers: int = Field(
        description="solver processes of this server; in distributed mode, the live Celery workers consuming the queue"
    )
    broker: str | None = Field(default=None, description="distributed mode: the broker (redis or amqp)")
    queue_depth: int | None = Field(default=None, description="distributed mode: jobs waiting in the broker's queue")


def error_responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` entries for the listed 4xx codes, all with the ErrorBody shape."""
    text = {
        400: "malformed request (e.g. not JSON)",
        401: "missing or unknown Bearer key",
        404: "no such resource for this key",
        409: "the job has no schedule yet (queued, running or failed)",
        413: "request body larger than MEMSCHED_MAX_BODY_BYTES",
        422: "invalid input; `field` names it (infeasible budgets carry `min_feasible_bytes`)",
        429: "too many queued jobs; retry later",
        503: "not ready, or a dependency is down (database, broker, plotting); retry after `Retry-After` seconds",
    }
    return {c: {"model": ErrorBody, "description": text[c]} for c in codes}
