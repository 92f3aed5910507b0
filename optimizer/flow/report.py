"""A solve's candidates and its answer's record, with the plain sentence said to the user."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from memsched.optimizer.ilp.outcome import Outcome
from memsched.optimizer.jit import KernelsPending
from memsched.optimizer.simulate import SimResult
from memsched.schema import Schedule, SolverRecord, SolverStatus

if TYPE_CHECKING:
    from memsched.optimizer.dp import DpOutcome

log = logging.getLogger(__name__)


@dataclass
class Candidate:
    """A schedule someone proposed, as judged by the simulator."""

    name: str
    """Where it came from: 'heuristic', 'ratio' (optimizer/ratio.py), 'link-plan' (optimizer/link_plan.py), a baseline
    policy, 'dp-beam', 'dp-fifo-beam', 'dp', 'dp-fifo', 'dp-lagrangian', 'local-search' or 'ilp'."""
    sim: SimResult
    """Simulated under the budget (timing filled in)."""


@dataclass
class SolveReport:
    """The returned schedule and how it came about (for tests and benchmarks)."""

    schedule: Schedule
    """What solve() returns."""
    outcome: Outcome | None
    """The MILP backend's raw result (None where no backend ran)."""
    ilp_sim: SimResult | None
    """The simulator's verdict on the backend's incumbent, if there was one."""
    dp: DpOutcome | None = None
    """The exact DP's result (None where it did not run)."""


def record(
    backend: str,
    status: SolverStatus,
    objective: float,
    wall: float,
    message: str,
    bound: float | None = None,
    details: list[str] | None = None,
) -> SolverRecord:
    gap = None
    if bound is not None:
        bound = max(0.0, min(bound, objective))
        gap = (objective - bound) / objective if objective > 0 else 0.0
    return SolverRecord(
        backend=backend,
        status=status,
        objective_s=objective,
        best_bound_s=bound,
        gap=gap,
        wall_s=wall,
        message=message,
        details=details or [],
    )


_BOUND_SOURCES = {
    "dp": "the exact dynamic program",
    "dp-fifo": "the exact dynamic program with FIFO copies",
    "dp-link-work": "the exact dynamic program with each copy's latency on its link",
    "dp-in-flight": "the exact dynamic program with each copy's latency on its link and the latest copy's bytes held",
    "dp-lagrangian": "the exact dynamic program with the host budget priced (a Lagrangian bound)",
    "lagrangian": "the Lagrangian bound on the memory rows",
    "lagrangian-link": "the Lagrangian bound on the copy links' windows",
    "stage": "the stage bound (each stage's memory alone, every copy paying its latency)",
    "cbc": "the CBC MILP",
    "highs": "the HiGHS MILP",
    "cpsat": "the CP-SAT model",
    "start": "an earlier solve of this budget (with the schedule this one started from)",
    "exhaustive": "every keep / recompute plan of this trace, each simulated",
}
"""Where a proven bound came from, in words (solve()'s plain sentence)."""


def plain_summary(
    status: SolverStatus,
    objective_s: float,
    bound_s: float,
    bound_source: str,
    gap: float,
    requested_gap: float,
    time_limit_s: float,
    wall_s: float,
    kernels_s: float = 0.0,
    setup_s: float = 0.0,
    kernels_pending: KernelsPending | None = None,
) -> str:
    """One sentence for the user: what was proven about the answer, and what limited the proof. Where the solve
    passed its limit by more than the promise allows (1.1 x limit + 0.5 s), it says so, and names what took more than
    a quarter of the limit before any search could start: `setup_s` (the command's start, the trace, the first
    plans) and `kernels_s` (loading or compiling the compiled kernels). `kernels_pending`: the kernels were still
    loading or compiling when the solve stopped waiting for them, so no search or bound that runs on them did."""
    source = _BOUND_SOURCES.get(bound_source, bound_source)
    if status == SolverStatus.OPTIMAL:
        if objective_s <= 0:
            return "Optimal: the schedule has no overhead."
        within = "exactly" if gap <= 1e-9 else f"within {100 * requested_gap:.3g}%"
        return (
            f"Optimal {within}: {source} proves that no schedule has less than {bound_s:.4g} s of overhead "
            f"(this one: {objective_s:.4g} s)."
        )
    limited = (
        f"the time limit of {time_limit_s:g} s ran out"
        if wall_s >= 0.9 * time_limit_s
        else "the solver's searches ended"
    )
    if bound_source == "none":
        sentence = (
            f"Not proven: no lower bound above 0 was found before {limited}, so this schedule "
            f"({objective_s:.4g} s of overhead) may be far from the best."
        )
    else:
        sentence = (
            f"Not proven optimal: a better schedule could save at most {100 * gap:.3g}% of this one's "
            f"{objective_s:.4g} s of overhead ({source} proves at least {bound_s:.4g} s), and {limited} "
            f"before that gap closed to {100 * requested_gap:.3g}%."
        )
    if kernels_pending == KernelsPending.LOADING:
        sentence += (
            f" The optimizer's compiled kernels were still loading from numba's cache after {kernels_s:.2g} s, so no "
            "search or bound that runs on them did (a load takes about a second, once per process: a longer time "
            "limit covers it)."
        )
    elif kernels_pending is not None:
        sentence += (
            f" The optimizer's compiled kernels were still compiling after {kernels_s:.2g} s, so no search or bound "
            "that runs on them did (the first solve in an environment compiles them, once; `make install` does it "
            "ahead; they go on compiling in the background for the next solve)."
        )
    if wall_s > 1.1 * time_limit_s + 0.5:
        sentence += f" The solve took {wall_s:.3g} s, past its time limit of {time_limit_s:g} s"
        causes = []
        if setup_s > 0.25 * time_limit_s:
            causes.append(
                f"{setup_s:.2g} s went to starting (the interpreter and its imports, reading the trace, the first "
                "greedy plans: no limit shortens these)"
            )
        if kernels_s > 0.25 * time_limit_s:
            causes.append(
                f"{kernels_s:.2g} s to preparing the optimizer's compiled kernels (the first solve in an environment "
                "compiles them; `make install` does it ahead)"
            )
        sentence += (": " + " and ".join(causes) if causes else "") + "."
    return sentence
