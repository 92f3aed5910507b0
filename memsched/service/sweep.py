"""The memory/time curve of a trace (`memsched sweep` and POST /v1/sweeps): one service function, `sweep_trace`,
that solves a set of budgets through `solve_trace` (the function `memsched solve` uses) and returns the curve
with its bound band and knee points, as JSON, a PNG or an interactive page."""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import time
from concurrent.futures import Future, ProcessPoolExecutor

from pydantic import BaseModel, ConfigDict, Field

from memsched.errors import InfeasibleBudgetError, InfeasibleHostBudgetError, MemschedError, UnsettledBudgetError
from memsched.optimizer.sweep_curve import MAX_POINTS, MIN_POINTS, SweepCurve, solved_now, sweep
from memsched.options import SolveOptions
from memsched.schema import Schedule, SolverStatus, Trace
from memsched.units import BudgetSpec

log = logging.getLogger(__name__)

DEFAULT_POINTS = 20
"""Points a sweep solves unless told otherwise."""
DEFAULT_POINT_TIME_LIMIT_S = 5.0
"""Each point's solve limit unless told otherwise: a sweep is an overview, so each point gets less time than
one `memsched solve`; the bound band shows where that left a gap."""


class SweepPoint(BaseModel):
    """One budget of the curve."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    budget_bytes: int
    """The budget, bytes."""
    overhead_s: float
    """Predicted overhead of the best schedule found, seconds."""
    overhead_pct: float
    """The same, percent of the keep-all step."""
    step_s: float
    """Predicted step time, seconds."""
    peak_bytes: int
    """Predicted peak of the schedule, bytes."""
    bound_s: float | None
    """A true lower bound on any schedule's overhead at this budget, seconds (null: none proven)."""
    gap: float | None
    """(overhead - bound) / overhead (null without a bound)."""
    status: SolverStatus
    """optimal (within the requested gap), feasible (a larger gap) or heuristic (no bound)."""
    reused_from: int | None = None
    """The smaller budget whose schedule this point reuses (it beat this budget's own solve)."""
    solve_s: float
    """Wall seconds of this point's solve."""
    actions: dict[str, int]
    """How many layers keep, offload and recompute."""
    schedule: Schedule
    """The schedule itself."""


class SweepKnee(BaseModel):
    """A budget below which the cost rises steeply."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    budget_bytes: int
    """The knee's budget, bytes."""
    overhead_s: float
    """Overhead there, seconds."""
    slope_below_s_per_gib: float
    """Seconds of overhead each GiB less costs just below the knee."""
    slope_above_s_per_gib: float
    """Seconds of overhead each GiB more saves just above it."""


class SweepResult(BaseModel):
    """The curve of step time against budget for one trace."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    trace_hash: str
    """Trace.content_hash() of the trace swept."""
    model: str
    """The trace's model."""
    static_bytes: int
    """Static bytes (params, grads, optimizer state): no budget goes below them."""
    lo_bytes: int
    """The smallest budget swept."""
    hi_bytes: int
    """The largest budget swept (keep-all's peak unless a smaller end was asked for)."""
    keepall_step_s: float
    """The in-core step time the overheads are measured against, seconds."""
    options: SolveOptions
    """The options every point was solved with (time_limit_s is per point)."""
    points: list[SweepPoint]
    """The solved budgets, smallest first."""
    knees: list[SweepKnee]
    """The knee points, smallest budget first."""
    zero_overhead_bytes: int | None
    """The smallest swept budget with no overhead (null: every swept budget costs time)."""
    wall_s: float
    """Wall seconds of the sweep, from the caller's start (`sweep_trace`'s started_at: the CLI's process start)."""
    workers: int
    """Solver processes the sweep used."""
    notes: list[str] = Field(default_factory=list)
    """What the sweep adjusted (a start below the smallest feasible budget, ...)."""


def _resolve(spec: BudgetSpec | str | int | None, trace: Trace, what: str) -> int | None:
    from memsched.service import resolve_budget

    if spec is None:
        return None
    try:
        return resolve_budget(spec, trace)
    except MemschedError as e:
        raise MemschedError(f"{what}: {e}") from None


def sweep_trace(
    trace: Trace,
    options: SolveOptions | None = None,
    points: int = DEFAULT_POINTS,
    lo: BudgetSpec | str | int | None = None,
    hi: BudgetSpec | str | int | None = None,
    workers: int = 1,
    refine: bool = True,
    started_at: float | None = None,
) -> SweepResult:
    """Solve `points` budgets from `lo` (default: the smallest feasible) to `hi` (default: keep-all's peak),
    placed where the curve bends, each with `options` (its time limit per point), on `workers` processes.
    `refine`: then solve the points left outside the gap again with the time the sweep has left of its budget,
    points x the time limit over the workers (optimizer/sweep_curve.py, `_refine`).

    `started_at`: the caller's start (perf_counter; the CLI: its process's), from which the result's `wall_s`
    counts, so that it is what the caller waited, the start and the kernels' load included (None: this call's).

    Raises MemschedError for an empty range or a bad count, InfeasibleBudgetError (with the smallest feasible
    budget) for a range wholly below it."""
    now = time.perf_counter()
    began = now if started_at is None else min(started_at, now)
    from memsched.service import check_computable

    options = options or SolveOptions(time_limit_s=DEFAULT_POINT_TIME_LIMIT_S)
    check_computable(trace, options.link, options.ranks_per_link)
    if not MIN_POINTS <= points <= MAX_POINTS:
        raise MemschedError(f"points: {points} is out of range; give {MIN_POINTS} to {MAX_POINTS}")
    if workers < 1:
        raise MemschedError(f"workers: {workers} is out of range; give 1 or more")
    lo_b, hi_b = _resolve(lo, trace, "from"), _resolve(hi, trace, "to")
    workers = min(workers, points)
    # The kernels first, here, as the pool's workers do (`_init_worker`): in a fresh environment they compile (tens of
    # seconds, once), which no point's time limit could hold; a point left waiting on them answered "not found or
    # ruled out" and stopped the whole sweep. Compiled here, the workers load them from numba's cache.
    from memsched.service import prepare_solver

    compile_s = prepare_solver()
    limit_s = options.time_limit_s if refine else None
    if workers == 1:
        submit = solved_now(lambda b: _solve(trace, b, options))

        def again(budget: int, seconds: float, start: Schedule) -> Future[Schedule]:
            return solved_now(lambda b: _solve(trace, b, _with_limit(options, seconds), start))(budget)

        curve = sweep(trace, submit, points, lo_b, hi_b, options.gap, refine=again, point_limit_s=limit_s)
    else:
        ctx = multiprocessing.get_context("spawn")  # the caller may hold threads (the service): never fork them
        with ProcessPoolExecutor(
            workers, mp_context=ctx, initializer=_init_worker, initargs=(trace.model_dump_json(), options)
        ) as pool:

            def in_pool(budget: int, seconds: float | None = None, start: Schedule | None = None) -> Future[Schedule]:
                out: Future[Schedule] = Future()

                def done(f: Future[tuple[str, str | int]]) -> None:
                    # Whatever the worker raised goes to the waiting sweep, which raises it.
                    exc = f.exception()
                    if exc is not None:
                        out.set_exception(exc)
                        return
                    try:
                        out.set_result(_unwrap(budget, f.result()))
                    except (InfeasibleBudgetError, InfeasibleHostBudgetError, UnsettledBudgetError) as e:
                        out.set_exception(e)

                start_json = start.model_dump_json() if start is not None else None
                pool.submit(_solve_in_worker, budget, seconds, start_json).add_done_callback(done)
                return out

            curve = sweep(
                trace, in_pool, points, lo_b, hi_b, options.gap, parallel=workers, refine=in_pool, point_limit_s=limit_s
            )
    res = _result(trace, options, curve, workers)
    res.wall_s = round(time.perf_counter() - began, 3)
    if compile_s >= COMPILE_NOTE_S:
        res.notes.insert(
            0,
            f"compiled the optimizer's kernels first: {compile_s:.0f} s before the first point, once per environment "
            "(`make install` or `python -m memsched.optimizer.jit` does it ahead)",
        )
    return res


COMPILE_NOTE_S = 1.0
"""A kernel preparation this long was a compile (loading them from numba's cache takes under a second): said."""


def _solve(trace: Trace, budget: int, options: SolveOptions, start: Schedule | None = None) -> Schedule:
    from memsched.service import solve_trace

    return solve_trace(trace, budget, options, start=start)


_WORKER: dict[str, tuple[Trace, SolveOptions]] = {}
"""In a pool process: the trace and options its initializer received (sent once, not with every budget)."""


def _init_worker(trace_json: str, options: SolveOptions) -> None:
    from memsched.service import prepare_solver

    _WORKER["job"] = (Trace.model_validate_json(trace_json), options)
    prepare_solver()


def _with_limit(options: SolveOptions, seconds: float) -> SolveOptions:
    """The same options with another time limit (a point solved again)."""
    return options.model_copy(update={"time_limit_s": seconds})


def _solve_in_worker(budget: int, seconds: float | None = None, start_json: str | None = None) -> tuple[str, str | int]:
    """A picklable answer: ('ok', schedule JSON), ('infeasible', smallest feasible budget), ('host', the
    InfeasibleHostBudgetError's numbers as JSON) or ('unsettled', the UnsettledBudgetError's message and budget).
    A point solved again: `seconds`, its time limit instead of the sweep's, and `start_json`, its earlier answer to
    start from."""
    trace, options = _WORKER["job"]
    if seconds is not None:
        options = _with_limit(options, seconds)
    start = Schedule.model_validate_json(start_json) if start_json is not None else None
    try:
        return "ok", _solve(trace, budget, options, start).model_dump_json()
    except InfeasibleBudgetError as e:
        return "infeasible", e.min_feasible_bytes if e.proven else -e.min_feasible_bytes
    except InfeasibleHostBudgetError as e:
        return "host", json.dumps([e.host_budget_bytes, e.budget_bytes, e.min_host_bytes, e.proven, e.detail])
    except UnsettledBudgetError as e:
        return "unsettled", json.dumps([str(e), e.fits_bytes])


def _unwrap(budget: int, r: tuple[str, str | int]) -> Schedule:
    kind, value = r
    if kind == "ok":
        assert isinstance(value, str)
        return Schedule.model_validate_json(value)
    if kind == "host":
        assert isinstance(value, str)
        host, at, least, proven, detail = json.loads(value)
        raise InfeasibleHostBudgetError(host, at, least, proven, detail)
    if kind == "unsettled":
        assert isinstance(value, str)
        message, fits = json.loads(value)
        raise UnsettledBudgetError(message, fits)
    assert isinstance(value, int)
    raise InfeasibleBudgetError(budget, abs(value), proven=value > 0)


def _result(trace: Trace, options: SolveOptions, curve: SweepCurve, workers: int) -> SweepResult:
    gib = float(2**30)
    return SweepResult(
        trace_hash=trace.content_hash(),
        model=trace.model,
        static_bytes=trace.static.total,
        lo_bytes=curve.lo_bytes,
        hi_bytes=curve.hi_bytes,
        keepall_step_s=curve.keepall_step_s,
        options=options,
        points=[
            SweepPoint(
                budget_bytes=p.budget_bytes,
                overhead_s=p.overhead_s,
                overhead_pct=p.schedule.prediction.overhead_pct,
                step_s=p.schedule.prediction.step_s,
                peak_bytes=p.schedule.prediction.peak_bytes,
                bound_s=p.bound_s,
                gap=p.gap,
                status=p.status,
                reused_from=p.reused_from,
                solve_s=round(p.solve_s, 4),
                actions=p.schedule.action_counts(),
                schedule=p.schedule,
            )
            for p in curve.points
        ],
        knees=[
            SweepKnee(
                budget_bytes=k.budget_bytes,
                overhead_s=k.overhead_s,
                slope_below_s_per_gib=k.slope_below_s_per_byte * gib,
                slope_above_s_per_gib=k.slope_above_s_per_byte * gib,
            )
            for k in curve.knees
        ],
        zero_overhead_bytes=curve.zero_overhead_bytes,
        wall_s=round(curve.wall_s, 3),
        workers=workers,
        notes=curve.notes,
    )


def default_workers() -> int:
    """One solver process per core this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)
