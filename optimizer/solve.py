"""The optimizer's front door: trace + budget + options -> Schedule.

Flow: check the budget (InfeasibleBudgetError with the smallest feasible budget); keep-all if it fits;
otherwise the greedy heuristic and the baselines give candidates (one with zero overhead is optimal as it
stands); the recompute-only model (phase 1) and the local search (phase 2, optimizer/polish.py) add theirs;
the full model is warm-started with the candidate that is best within its windows; its schedule is re-simulated (the
simulator is the yardstick), and the best of {ILP, candidates} is returned, so the result is never worse
than a baseline even when the solver stops at its time limit. Every substitution is stated in the
SolverRecord's message.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

from memsched.errors import MemschedError, SolverError
from memsched.optimizer.baselines import evaluate_baselines
from memsched.optimizer.budget import check_budget_feasible
from memsched.optimizer.heuristic import heuristic
from memsched.optimizer.ilp.model import MilpModel, build_model
from memsched.optimizer.ilp.outcome import Found, Outcome
from memsched.optimizer.ilp.warm import representable
from memsched.optimizer.plan import KEEP, Decision, make_schedule
from memsched.optimizer.polish import polish
from memsched.optimizer.simulate import SimResult, simulate, stage_memory
from memsched.schema import Action, Schedule, SolverRecord, SolverStatus, Trace

log = logging.getLogger(__name__)

SOLVERS = ("auto", "cbc", "highs", "cpsat", "heuristic")
AUTO_BACKEND = "cbc"  # measured fastest on our 2-core machine (bench/results/solver_bench.md)
_REL_TOL = 1e-9


@dataclass(frozen=True)
class SolveOptions:
    """How to solve."""

    solver: str = "auto"
    """auto | cbc | highs | cpsat | heuristic."""
    time_limit_s: float = 30.0
    """Wall-clock limit for the exact solver, seconds."""
    gap: float = 0.01
    """Relative optimality gap at which the exact solver may stop."""
    export_model: Path | None = None
    """Where to write the solver's model (LP/MPS or CP-SAT proto) for reproduction, if anywhere."""
    window: int | None = None
    """W: done-by / prefetch-at stages of layer i lie in [i, i + W]; None = n on small traces, else 12."""
    max_segment: int | None = None
    """L: the longest recompute segment the ILP may choose; None = n on small traces, else 16."""
    threads: int | None = None
    """Solver threads; None = the backend's default (CP-SAT: 2)."""

    def __post_init__(self) -> None:
        # The one place the options are checked: the CLI, the API's request schema and its jobs all build a
        # SolveOptions, so a bad value gets the same message wherever it comes from.
        if self.solver not in SOLVERS:
            raise MemschedError(f"solver: {self.solver!r} is not one of {', '.join(SOLVERS)}; pick one of those")
        if not self.time_limit_s > 0:
            raise MemschedError(f"time limit: must be > 0 seconds, got {self.time_limit_s}; e.g. --time-limit 30")
        if not 0 <= self.gap < 1:
            raise MemschedError(f"gap: must be in [0, 1), got {self.gap}; e.g. --gap 0.01 for 1%")
        for name, value in (("window", self.window), ("max segment", self.max_segment)):
            if value is not None and value < 1:
                raise MemschedError(f"{name}: must be >= 1, got {value}; leave it unset for the default")


@dataclass
class Candidate:
    """A schedule someone proposed, as judged by the simulator."""

    name: str
    """'heuristic' or a baseline policy name."""
    sim: SimResult
    """Simulated under the budget (timing filled in)."""


@dataclass
class SolveReport:
    """The returned schedule and how it came about (for tests and benchmarks)."""

    schedule: Schedule
    """What solve() returns."""
    outcome: Outcome | None
    """The exact backend's raw result (None for the heuristic or keep-all)."""
    ilp_sim: SimResult | None
    """The simulator's verdict on the backend's incumbent, if there was one."""


def _record(backend: str, status: SolverStatus, objective: float, wall: float, message: str,
            bound: float | None = None) -> SolverRecord:
    gap = None
    if bound is not None:
        bound = max(0.0, min(bound, objective))
        gap = (objective - bound) / objective if objective > 0 else 0.0
    return SolverRecord(backend=backend, status=status, objective_s=objective, best_bound_s=bound, gap=gap,
                        wall_s=wall, message=message)


def _candidates(trace: Trace, budget_bytes: int) -> list[Candidate]:
    out = [Candidate("heuristic", heuristic(trace, budget_bytes).sim)]
    out += [Candidate(r.policy, r.sim) for r in evaluate_baselines(trace, budget_bytes) if r.feasible]
    return sorted((c for c in out if c.sim.feasible), key=lambda c: c.sim.overhead_s)


def _best_start(m: MilpModel, starts: list[list[Decision]]) -> list[Decision] | None:
    """The start that is best *in the model's terms*: each is pulled into the model's windows
    (warm.representable, which can cost a lot: a done-by clipped to W stages makes the forward wait), and
    the best of those that still fit the budget, by the simulator, warm-starts the backend."""
    best: tuple[float, list[Decision]] | None = None
    for start in starts:
        rep = representable(m, start)
        if rep is None:
            continue
        sim = simulate(m.trace, rep, m.budget_bytes, with_events=False)
        if sim.feasible and (best is None or sim.overhead_s < best[0]):
            best = (sim.overhead_s, rep)
    return best[1] if best is not None else None


def _run_backend(trace: Trace, budget_bytes: int, options: SolveOptions, backend: str,
                 starts: list[list[Decision]], time_limit_s: float, offload: bool = True,
                 export: Path | None = None) -> Outcome:
    m = build_model(trace, budget_bytes, options.window, options.max_segment, offload=offload)
    warm = _best_start(m, starts)
    if backend == "cpsat":
        from memsched.optimizer.ilp.cpsat_backend import export_cpsat, solve_cpsat

        if export is not None:
            export_cpsat(m, export)
        return solve_cpsat(m, time_limit_s, options.gap, warm, options.threads)
    from memsched.optimizer.ilp.pulp_backend import export_pulp, solve_pulp

    if export is not None:
        export_pulp(m, export)
    return solve_pulp(m, backend, time_limit_s, options.gap, warm, options.threads)


def _recompute_phase(trace: Trace, budget_bytes: int, options: SolveOptions, backend: str,
                     cands: list[Candidate]) -> None:
    """Phase 1: the recompute-only model (no offload variables: small, and its LP is tight) for up to a
    third of the time limit; its schedule joins the candidates that warm-start the full model. Skipped on
    small traces, where the full model is solved outright."""
    if trace.n <= 24:
        return
    starts = [c.sim.decisions for c in cands if all(d.action != Action.OFFLOAD for d in c.sim.decisions)]
    try:
        out = _run_backend(trace, budget_bytes, options, backend, starts, options.time_limit_s / 3, offload=False)
    except SolverError as exc:  # reported below by the full run if it persists; phase 1 is optional
        log.info("recompute-only phase failed: %s", exc)
        return
    if out.decisions is not None:
        sim = simulate(trace, out.decisions, budget_bytes, with_events=False)
        if sim.feasible:
            cands.append(Candidate("recompute-ilp", sim))
            cands.sort(key=lambda c: c.sim.overhead_s)


def _polish_phase(trace: Trace, budget_bytes: int, options: SolveOptions, cands: list[Candidate]) -> None:
    """Phase 2: local search (optimizer/polish.py) from the best candidate so far, for up to a quarter of
    the time limit (it stops earlier once a whole oscillation cycle finds nothing). Its schedule joins the
    candidates, so the full model starts from it where it can represent it, and solve() returns it when
    the backend finds nothing better."""
    res = polish(trace, budget_bytes, cands[0].sim.decisions, options.time_limit_s / 4)
    if res.improved:
        cands.append(Candidate("local-search", res.sim))
        cands.sort(key=lambda c: c.sim.overhead_s)


def _zero_overhead(trace: Trace, budget_bytes: int, best: Candidate, wall: float) -> SolveReport:
    """No stall and no recompute: nothing can do better, so the exact backend has nothing to prove."""
    rec = _record(best.name, SolverStatus.OPTIMAL, 0.0, wall,
                  f"the {best.name} schedule fits the budget with no overhead: optimal", bound=0.0)
    return SolveReport(make_schedule(trace, best.sim.decisions, budget_bytes, best.name, rec), None, None)


def _candidate_schedule(trace: Trace, budget_bytes: int, best: Candidate, outcome: Outcome, wall: float,
                        msg: str) -> Schedule:
    """A candidate's schedule. When the backend proved a bound, it is kept (status feasible, with the
    gap): it bounds every schedule with done-by / prefetch-at within W stages and segments of at most L
    layers (all schedules on traces of up to 24 layers)."""
    obj = best.sim.overhead_s
    bound = outcome.bound_s
    if bound is not None and bound <= obj:
        rec = _record(best.name, SolverStatus.FEASIBLE, obj, wall,
                      msg + f"; the bound is {outcome.backend}'s", bound=bound)
    else:
        rec = _record(best.name, SolverStatus.HEURISTIC, obj, wall, msg)
    return make_schedule(trace, best.sim.decisions, budget_bytes, best.name, rec)


def solve_report(trace: Trace, budget_bytes: int, options: SolveOptions | None = None) -> SolveReport:
    """solve(), with the backend's raw outcome kept."""
    options = options or SolveOptions()
    check_budget_feasible(trace, budget_bytes)
    t0 = time.perf_counter()
    if max(stage_memory(trace, [KEEP] * trace.n)) + trace.static.total <= budget_bytes:
        rec = _record("keep-all", SolverStatus.OPTIMAL, 0.0, time.perf_counter() - t0,
                      "keep-all fits the budget: no overhead", bound=0.0)
        return SolveReport(make_schedule(trace, [KEEP] * trace.n, budget_bytes, "keep-all", rec), None, None)
    cands = _candidates(trace, budget_bytes)
    assert cands, "a feasible budget always admits the heuristic's schedule"
    best = cands[0]
    if best.sim.overhead_s <= 0.0:
        return _zero_overhead(trace, budget_bytes, best, time.perf_counter() - t0)
    if options.solver == "heuristic":
        heur = next(c for c in cands if c.name == "heuristic")
        msg = "greedy heuristic"
        if best.name != "heuristic" and best.sim.overhead_s < heur.sim.overhead_s * (1 - _REL_TOL):
            msg = f"the {best.name} baseline beats the greedy heuristic ({best.sim.overhead_s:.6g} s vs " \
                  f"{heur.sim.overhead_s:.6g} s overhead)"
        rec = _record(best.name, SolverStatus.HEURISTIC, best.sim.overhead_s, time.perf_counter() - t0, msg)
        return SolveReport(make_schedule(trace, best.sim.decisions, budget_bytes, best.name, rec), None, None)

    backend = AUTO_BACKEND if options.solver == "auto" else options.solver
    _recompute_phase(trace, budget_bytes, options, backend, cands)
    _polish_phase(trace, budget_bytes, options, cands)
    best = cands[0]
    if best.sim.overhead_s <= 0.0:
        return _zero_overhead(trace, budget_bytes, best, time.perf_counter() - t0)
    # The warm start: the candidate that is best within the model's windows (see _best_start). The time
    # limit covers the whole solve (candidates, phase 1, the local search, model building), not only the search.
    left = options.time_limit_s - (time.perf_counter() - t0)
    outcome = _run_backend(trace, budget_bytes, options, backend, [c.sim.decisions for c in cands],
                           max(1.0, left), export=options.export_model)
    wall = time.perf_counter() - t0
    if outcome.found == Found.INFEASIBLE:
        raise SolverError(
            f"{backend} reported the model infeasible although the budget is feasible "
            f"({outcome.message}); this is a bug: please report it with --export-model output"
        )
    ilp_sim = None
    if outcome.decisions is not None:
        ilp_sim = simulate(trace, outcome.decisions, budget_bytes, with_events=False)
        if not ilp_sim.feasible:
            log.warning("%s incumbent simulates over budget (%d > %d bytes): solver tolerance; discarded",
                        backend, ilp_sim.peak_bytes, budget_bytes)
            ilp_sim = None
        elif outcome.objective_s is not None:
            diff = abs(outcome.objective_s - ilp_sim.overhead_s)
            if diff > 1e-6 * max(ilp_sim.overhead_s, 1e-6) and backend != "cpsat":
                log.warning("%s objective %.9g s differs from the simulated %.9g s", backend,
                            outcome.objective_s, ilp_sim.overhead_s)
    if ilp_sim is None:
        why = "found no schedule" if outcome.decisions is None else "returned a schedule over budget"
        msg = (f"{backend} {why} within {options.time_limit_s:g} s ({outcome.message}); returning the best "
               f"of the heuristic and the baselines ({best.name})")
        return SolveReport(_candidate_schedule(trace, budget_bytes, best, outcome, wall, msg), outcome, None)
    obj = ilp_sim.overhead_s
    if best.sim.overhead_s < obj * (1 - _REL_TOL) - 1e-12:
        # Only possible at a time limit, or when the candidate uses segments longer than L.
        msg = (f"the {best.name} schedule ({best.sim.overhead_s:.6g} s overhead) beats {backend}'s "
               f"({obj:.6g} s, {outcome.found.value}; {outcome.message}); returning {best.name}")
        return SolveReport(_candidate_schedule(trace, budget_bytes, best, outcome, wall, msg), outcome, ilp_sim)
    status = SolverStatus.OPTIMAL if outcome.found == Found.OPTIMAL else SolverStatus.FEASIBLE
    msg = outcome.message
    if status == SolverStatus.FEASIBLE:
        msg += f"; time limit {options.time_limit_s:g} s reached before the gap closed"
    rec = _record(backend, status, obj, wall, msg, bound=outcome.bound_s)
    return SolveReport(make_schedule(trace, ilp_sim.decisions, budget_bytes, "ilp", rec), outcome, ilp_sim)


def solve(trace: Trace, budget_bytes: int, options: SolveOptions | None = None) -> Schedule:
    """Return the best schedule found for the budget; InfeasibleBudgetError if none can fit."""
    return solve_report(trace, budget_bytes, options).schedule
