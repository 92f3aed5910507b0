"""Plans restricted to some actions (SolveOptions.actions): the DP's problem without offload or without
recompute, and the feasibility of a budget without offload.

With offload allowed, the smallest feasible budget is exact and cheap (optimizer/budget.py: every layer
offloaded synchronously is the pointwise memory minimum). Without offload there is no such closed form: the
smallest budget a keep / recompute plan reaches is found by the exact DP (which is exact here: with no copies
its fluid relaxation has nothing to relax), bisecting between a lower bound (that pointwise minimum) and the
best recompute-only baseline. Where the DP cannot settle a budget in the time given, the answer says so
rather than guessing.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from memsched.errors import InfeasibleBudgetError, UnsettledBudgetError
from memsched.optimizer.baselines import BASELINES
from memsched.optimizer.budget import check_budget_feasible, min_feasible_budget
from memsched.optimizer.decisions import ALL_ACTIONS, uses_only
from memsched.optimizer.jit import KernelsPending, pending
from memsched.optimizer.simulate import SimResult, simulate
from memsched.schema import Action, Trace
from memsched.units import format_bytes

if TYPE_CHECKING:
    from memsched.optimizer.dp.problem import DpProblem

log = logging.getLogger(__name__)


def restrict(p: DpProblem, allowed: frozenset[Action]) -> DpProblem:
    """The DP's problem with only the `allowed` actions (in place; returns it)."""
    if Action.OFFLOAD not in allowed:
        p.offload = [[] for _ in range(p.n)]
        p.offload_complete = True
    p.recompute = Action.RECOMPUTE in allowed
    return p


def restricted_problem(
    trace: Trace, budget_bytes: int, allowed: frozenset[Action], deadline: float | None = None
) -> DpProblem:
    from memsched.optimizer.dp.problem import build_problem  # numba loads here, not on every CLI start

    return restrict(build_problem(trace, budget_bytes, deadline), allowed)


@dataclass
class Verdict:
    """What the DP established about one budget."""

    feasible: bool | None
    """True: a plan fits (`sim`); False: proven that none does; None: the DP could not tell in time."""
    sim: SimResult | None = None
    """The cheapest plan found, where one fits."""
    why: str = ""
    """Where `feasible` is None: what stopped the DP from telling."""


def dp_verdict(trace: Trace, budget_bytes: int, allowed: frozenset[Action], deadline: float) -> Verdict:
    """Whether any plan of the `allowed` actions fits `budget_bytes`, by the exact DP without an incumbent."""
    from memsched.optimizer.dp import exact_search  # numba loads here
    from memsched.optimizer.jit import kernels_by

    if budget_bytes < trace.static.total:
        return Verdict(False)
    if not kernels_by(deadline):  # the first run in an environment: still compiling the DP's kernels
        return Verdict(None, why="the exact DP's compiled kernels were still compiling")
    p = restricted_problem(trace, budget_bytes, allowed, deadline)
    out = exact_search(trace, budget_bytes, deadline, None, 0.0, problem=p)
    if out.schedules:
        return Verdict(True, out.schedules[0])
    # A finished sweep with no final label proves that nothing fits (its memory is a relaxation, so it drops no
    # plan that fits); one cut by the clock, or coarsened by the label cap, proves nothing; nor do finals that
    # the simulator finds over the budget (where the DP leaves bytes out: a producer recomputed before the layer
    # before, simulate.shared_input_holders; an output held past its reader, DpProblem.output_relaxed).
    if out.timed_out:
        return Verdict(None, why="the search for it ran out of time")
    if out.cap_hit:
        return Verdict(None, why="the exact DP reached its label cap")
    if out.found_plans:
        return Verdict(None, why="the exact DP's cheapest plans there did not fit once simulated")
    return Verdict(False)


def recompute_baselines(trace: Trace, allowed: frozenset[Action]) -> list[SimResult]:
    """The baselines that use only `allowed` actions, simulated without a budget, lowest peak first."""
    sims = []
    for build in BASELINES.values():
        decisions = build(trace)
        if uses_only(decisions, allowed):
            sims.append(simulate(trace, decisions, with_events=False))
    return sorted(sims, key=lambda s: s.peak_bytes)


def smallest_budget(
    trace: Trace, allowed: frozenset[Action], deadline: float, known_infeasible: int | None = None
) -> tuple[int, bool, str]:
    """(the smallest budget a plan of `allowed` actions fits, proven, why not proven): bisection with the DP
    between the pointwise minimum (a lower bound: no plan of any actions peaks lower) and the best baseline that
    uses only those actions. `proven` is False when the DP could not tell a budget (the clock, its label cap, or
    cheapest plans that do not fit once simulated: Verdict.why): the budget is then one that fits, and the true
    smallest lies between the last budget proven infeasible and it."""
    lo = max(min_feasible_budget(trace), trace.static.total) - 1  # infeasible for every plan
    if known_infeasible is not None:
        lo = max(lo, known_infeasible)
    hi = recompute_baselines(trace, allowed)[0].peak_bytes  # keep-all is always among them: it fits
    while hi - lo > 1:
        mid = (lo + hi) // 2
        verdict = dp_verdict(trace, mid, allowed, deadline)
        if verdict.feasible is None:
            return hi, False, verdict.why
        if verdict.feasible:
            assert verdict.sim is not None
            hi = min(mid, verdict.sim.peak_bytes)
        else:
            lo = mid
    return hi, True, ""


_LATE_SHARE = 0.5
"""Where loading the kernels ran past the DP's deadline, the DP gets this share of the time then left to the solve's."""


def _after_kernels(deadline: float, end: float) -> float:
    """The feasibility DP's deadline once its kernels are ready: a load from numba's cache (0.2-1.3 s) is waited for
    up to `end`, past `deadline`, and a compile (20-45 s, the first solve in an environment) only up to `deadline`.
    A 2 s CLI solve of a CPU trace reached its 1 s deadline mid-load and answered that the kernels "were still
    compiling" (2026-12-07). The DP gets at least _LATE_SHARE of the time then left to `end`."""
    from memsched.optimizer.jit import kernels_by

    if kernels_by(end, unless_compiling_at=deadline):
        now = time.perf_counter()
        return max(deadline, now + _LATE_SHARE * max(0.0, end - now))
    return deadline


def check_feasible(
    trace: Trace, budget_bytes: int, allowed: frozenset[Action], deadline: float, end: float | None = None
) -> SimResult | None:
    """Raise InfeasibleBudgetError (with the smallest budget these actions reach) if no plan of the `allowed`
    actions fits; else return a plan that fits when one had to be searched for (None when a baseline or the
    heuristic will do). `end`: the solve's own deadline, up to which the DP's kernels are waited for where they
    are being loaded from numba's cache rather than compiled (`_after_kernels`)."""
    if Action.OFFLOAD in allowed:
        check_budget_feasible(trace, budget_bytes)
        return None
    best = recompute_baselines(trace, allowed)  # keep-all is always among them
    if best[0].peak_bytes <= budget_bytes:
        return None
    # Below the pointwise minimum no plan of any actions fits; above it, the DP decides.
    below = budget_bytes < max(min_feasible_budget(trace), trace.static.total)
    if not below and end is not None:
        deadline = _after_kernels(deadline, end)
    verdict = Verdict(False) if below else dp_verdict(trace, budget_bytes, allowed, deadline)
    if verdict.feasible:
        return verdict.sim
    what = "keep and recompute" if Action.RECOMPUTE in allowed else "keep alone"
    if verdict.feasible is None:
        waiting = pending()
        if waiting == KernelsPending.LOADING:
            why = "the exact DP's compiled kernels were still loading from numba's cache, as they do once per process"
            fix = "Give a longer time limit (a load takes about a second), raise the budget"
        elif waiting == KernelsPending.COMPILING:
            why = "the exact DP's compiled kernels were still compiling, as they do once per environment"
            fix = (
                "Solve again once they are compiled (a background process finishes them; `python -m "
                "memsched.optimizer.jit` waits for them), raise the budget"
            )
        else:
            why = verdict.why.replace("the search for it", "the exact DP")
            fix = "Raise the budget, give a longer time limit"
        raise UnsettledBudgetError(
            f"budget: no plan of {what} under {format_bytes(budget_bytes)} was found or ruled out ({why}); the "
            f"smallest budget memsched found for them is {format_bytes(best[0].peak_bytes)} "
            f"({best[0].peak_bytes} bytes). {fix}, or allow offload (--actions keep,offload,recompute)",
            best[0].peak_bytes,
        )
    t0 = time.perf_counter()
    minimum, proven, why = smallest_budget(trace, allowed, deadline, known_infeasible=budget_bytes)
    log.info(
        "smallest %s budget: %d bytes (%s) in %.2f s",
        what,
        minimum,
        "proven" if proven else "found",
        time.perf_counter() - t0,
    )
    detail = f"no plan of {what} fits it" + ("" if below else ": the exact DP proved it")
    raise InfeasibleBudgetError(budget_bytes, minimum, detail, proven=proven, unproven_why=why)


__all__ = [
    "ALL_ACTIONS",
    "Verdict",
    "check_feasible",
    "dp_verdict",
    "restrict",
    "restricted_problem",
    "smallest_budget",
]
