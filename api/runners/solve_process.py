"""What runs inside the solver processes. Plain functions of plain (picklable) arguments: the parent sends
JSON text and gets JSON text back, so nothing depends on pickling pydantic models across processes."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from memsched.errors import InfeasibleBudgetError, InfeasibleHostBudgetError, MemschedError
from memsched.options import SolveOptions, SolveResources, SolverName
from memsched.schema import Trace
from memsched.service import prepare_solver, solve_trace

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SolveOutcome:
    """The result of one solve, as the parent stores it."""

    schedule_json: str | None
    """The Schedule as JSON when the solve succeeded."""
    error: str | None = None
    """Why it failed, phrased for the user."""
    min_feasible_bytes: int | None = None
    """Set when the budget was infeasible."""
    min_feasible_host_bytes: int | None = None
    """Set when the host budget was too small (InfeasibleHostBudgetError): the smallest that works."""
    wall_s: float = 0.0
    """Seconds the solve took."""


class _Overrun(Exception):
    """Raised by the alarm when the solver ignores its own time limit."""


def _alarm(_signum: int, _frame: FrameType | None) -> None:
    raise _Overrun


def descendants(pid: int) -> list[int]:
    """Process ids of pid's children, grandchildren, ... (Linux /proc; empty where there is none). Solver
    backends run binaries as child processes (pulp's CBC), which must not outlive a stopped or killed job."""
    proc = Path("/proc")
    if not proc.is_dir():
        return []
    children: dict[int, list[int]] = {}
    for d in proc.iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue  # exited while we looked
        # Field 2 (the command) is parenthesised and may contain spaces: the parent id follows the last ')'.
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        children.setdefault(ppid, []).append(int(d.name))
    out: list[int] = []
    stack = [pid]
    while stack:
        for c in children.get(stack.pop(), []):
            out.append(c)
            stack.append(c)
    return out


def kill_descendants(pid: int) -> None:
    for child in descendants(pid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(child, signal.SIGKILL)


def watch_parent(parent_pid: int, interval_s: float = 1.0) -> None:
    """Pool initializer: exit when the server that started this worker is gone. A pool worker whose parent was
    killed (kill -9, the OOM killer) would otherwise wait on its queue forever, holding memory."""
    # Ctrl-C at the terminal signals the whole process group, these workers included; the server stops them
    # itself at shutdown (kill_pool), and a KeyboardInterrupt here would only print a traceback per worker.
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    def watch() -> None:
        while True:
            time.sleep(interval_s)
            if os.getppid() != parent_pid:
                kill_descendants(os.getpid())
                os._exit(1)

    threading.Thread(target=watch, name="memsched-parent-watch", daemon=True).start()


def warm_up() -> int:
    """Import everything a solve needs and get the solver's kernels ready, so the first real job does not pay
    for it."""
    prepare_solver()
    return os.getpid()


def run_solve(
    trace_json: str, budget_bytes: int, params: SolveOptions, overrun_s: float, threads: int | None = None
) -> SolveOutcome:
    """Solve one job of the embedded pool. The solver gets `time_limit_s`; if it is still running `overrun_s`
    later, an alarm in this process stops it and the job falls back to the heuristic (same service function,
    solver 'heuristic'), whose schedule says so in its solver message. The parent's watchdog kills the process
    if even that does not come back."""
    signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, params.time_limit_s + overrun_s)
    try:
        return solve_with_fallback(
            trace_json,
            budget_bytes,
            params,
            SolveResources(threads=threads),
            _Overrun,
            f"ran past its time limit of {params.time_limit_s:g} s by more than {overrun_s:g} s",
            lambda: signal.setitimer(signal.ITIMER_REAL, overrun_s),
        )
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


def solve_with_fallback(
    trace_json: str,
    budget_bytes: int,
    options: SolveOptions,
    resources: SolveResources,
    stopped: type[BaseException],
    overran: str,
    arm_fallback: Callable[[], object],
) -> SolveOutcome:
    """Solve; when `stopped` is raised (the embedded pool's alarm, or Celery's soft time limit), kill the
    solver binaries this process started and return the heuristic's schedule instead, saying so in its solver
    message (its status is 'heuristic': no bound is claimed that the stopped solver did not prove). If the
    heuristic is stopped too, the job fails with the reason. `overran` completes "the <solver> solver ..."."""
    t0 = time.perf_counter()
    try:
        trace = Trace.model_validate_json(trace_json)
        try:
            schedule = solve_trace(trace, budget_bytes, options, resources)
        except stopped:
            kill_descendants(os.getpid())  # e.g. a CBC binary still running past its own -sec limit
            if options.solver == SolverName.HEURISTIC:
                raise
            note = f"the {options.solver} solver {overran} and was stopped"
            log.warning("%s; falling back to the heuristic", note)
            arm_fallback()
            heuristic = options.model_copy(update={"solver": SolverName.HEURISTIC})
            schedule = solve_trace(trace, budget_bytes, heuristic, resources)
            note = f"{note}; this is the heuristic's schedule"
            schedule.solver = schedule.solver.model_copy(
                update={"message": f"{note} ({schedule.solver.message})" if schedule.solver.message else note}
            )
        return SolveOutcome(schedule.model_dump_json(), wall_s=time.perf_counter() - t0)
    except stopped:
        kill_descendants(os.getpid())
        return SolveOutcome(
            None,
            f"the solver {overran} (and the heuristic fallback did not finish either) and was stopped; resubmit "
            "with a smaller trace",
            wall_s=time.perf_counter() - t0,
        )
    except InfeasibleBudgetError as e:
        from memsched.api.errors import api_message

        return SolveOutcome(None, api_message(e), e.min_feasible_bytes, wall_s=time.perf_counter() - t0)
    except InfeasibleHostBudgetError as e:
        from memsched.api.errors import api_message

        return SolveOutcome(
            None, api_message(e), min_feasible_host_bytes=e.min_host_bytes, wall_s=time.perf_counter() - t0
        )
    except MemschedError as e:
        from memsched.api.errors import api_message  # the request's field names, not the CLI's flags

        return SolveOutcome(None, api_message(e), wall_s=time.perf_counter() - t0)
    except Exception as e:
        # A solver bug or a backend failure (SolverError): the job fails with the reason, the worker lives on.
        log.exception("solve failed")
        return SolveOutcome(None, f"solver error: {type(e).__name__}: {e}", wall_s=time.perf_counter() - t0)


def render_plot(trace_json: str, schedule_json: str) -> bytes:
    """The timeline PNG of a schedule (memsched.service.plot, matplotlib Agg), rendered in a worker process because
    pyplot keeps global state and rendering is CPU-bound."""
    from memsched.schema import Schedule
    from memsched.service.plot import plot_timeline

    trace = Trace.model_validate_json(trace_json)
    schedule = Schedule.model_validate_json(schedule_json)
    with tempfile.TemporaryDirectory(prefix="memsched-plot-") as d:
        out = plot_timeline(trace, schedule, Path(d) / "timeline.png")
        return Path(out).read_bytes()
