"""The optimizer's front door: trace + budget + options -> Schedule.

How it proceeds (docs/formulation.md, 'How solve() uses it'): check the budget (InfeasibleBudgetError with the smallest
feasible budget); keep-all if it fits; the greedy heuristic and the baselines give candidates (one with zero
overhead is optimal as it stands); then

1. the beam DP (optimizer/dp/) adds a strong candidate, fast;
2. the local search (optimizer/polish.py) improves the best candidate;
3. the exact DP, pruned by the best candidate, proves a lower bound that holds for every schedule;
4. a MILP backend (optimizer/ilp/) when asked for by name, or, under `auto`, on small traces where its
   windows cover every schedule and the DP left a gap.

Each solver's phases and their shares of the time limit are data (`plan_for`); one loop runs any plan. The
phases themselves are optimizer/flow/'s (`Flow`), their shares and the measurements behind them in
optimizer/flow/shares.py, and each MILP backend is an entry of `BACKENDS` (optimizer/flow/backends.py).

Every schedule is judged by the simulator and the best is returned, so the result is never worse than a
baseline. The reported bound is the best *true* bound found: the DP's, or a MILP's only where the MILP's
windows cover the whole problem (a windowed MILP's bound is mentioned in the message, never reported as a
bound). `optimal` means that bound proves the requested gap. The time limit bounds the whole call.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from enum import StrEnum

from memsched.errors import InfeasibleBudgetError, InfeasibleHostBudgetError, MemschedError
from memsched.optimizer.actions import check_feasible, smallest_budget
from memsched.optimizer.baselines import evaluate_baselines
from memsched.optimizer.budget import keepall_activation_peak, min_feasible_budget, min_feasible_decisions
from memsched.optimizer.decisions import ALL_ACTIONS, KEEP, decisions_from_schedule, uses_only
from memsched.optimizer.flow import shares
from memsched.optimizer.flow.backends import AUTO_BACKEND, BACKENDS
from memsched.optimizer.flow.phases import Flow
from memsched.optimizer.flow.report import Candidate, SolveReport, record
from memsched.optimizer.flow.state import LagrangeKind, candidates, lagrange_kind, near_exact_ranges
from memsched.optimizer.heuristic import heuristic
from memsched.optimizer.host import HostNeed, fits_host, min_host_bytes
from memsched.optimizer.simulate import SimResult, make_schedule, simulate, stage_memory
from memsched.options import SolveOptions, SolveResources, SolverName
from memsched.schema import Action, Schedule, SolverStatus, Trace, check_schedule
from memsched.units import format_bytes

__all__ = [
    "BACKENDS",
    "Candidate",
    "LagrangeKind",
    "Phase",
    "SolveReport",
    "Step",
    "plan_for",
    "solve",
    "solve_report",
]

_REL_TOL = 1e-9


def _zero_overhead(trace: Trace, budget_bytes: int, best: Candidate, wall: float) -> SolveReport:
    """No stall and no recompute: nothing can do better, so nothing has to be proved."""
    rec = record(
        best.name,
        SolverStatus.OPTIMAL,
        0.0,
        wall,
        f"the {best.name} schedule fits the budget with no overhead: optimal",
        bound=0.0,
    )
    return SolveReport(make_schedule(trace, best.sim.decisions, budget_bytes, best.name, rec), None, None)


def _heuristic_only(trace: Trace, budget_bytes: int, flow: Flow) -> SolveReport:
    best = flow.best
    heur = next((c for c in flow.cands if c.name == "heuristic"), None)
    msg = "greedy heuristic"
    if heur is None:
        msg = f"the {best.name} schedule (the greedy heuristic's did not fit with these actions)"
    elif best.name != "heuristic" and best.sim.overhead_s < heur.sim.overhead_s * (1 - _REL_TOL):
        what = (
            "ratio plan (recompute the cheapest layers per byte, offload the rest)"
            if best.name == "ratio"
            else f"{best.name} baseline"
        )
        msg = (
            f"the {what} beats the greedy heuristic ({best.sim.overhead_s:.6g} s vs "
            f"{heur.sim.overhead_s:.6g} s overhead)"
        )
    rec = record(
        best.name, SolverStatus.HEURISTIC, best.sim.overhead_s, time.perf_counter() - flow.t0, msg, details=flow.notes
    )
    return SolveReport(make_schedule(trace, best.sim.decisions, budget_bytes, best.name, rec), None, None)


_FEASIBILITY_SHARE = 0.5
"""Without offload, the DP that settles a budget below the best baseline gets up to this share of the limit."""
_ANSWER_RESERVE_S = 0.1
"""Of the limit, what the searches for the number an infeasible budget's error names leave for the answer."""
_MIN_SEARCH_S = 0.05
"""The least those searches get where the limit has passed: a DP step or two, whose number may then be unproven
(said so). They had a second, which a 0.2 s solve (wall at most 0.72 s) could not pay."""
_HOST_NOTE = (
    "planned keep and recompute only: this trace was measured on the CPU, where host memory is the "
    "device's memory and an offload lowers no peak (--actions keep,offload,recompute emulates offload)"
)
"""Said with every plan whose actions the CPU default restricted."""


class Step(StrEnum):
    """What a phase of the solve runs (the Flow method of the same name)."""

    PROVE = "prove"
    STAGE_BOUND = "stage_bound"
    BEAM = "beam"
    RATIO = "ratio"
    DP_PROBE = "dp_probe"
    DP_FIRST = "dp_first"
    LAGRANGE = "lagrange"
    LINK_PLAN = "link_plan"
    LAGRANGE_MIXED = "lagrange_mixed"
    POLISH = "polish"
    FIFO_EARLY = "fifo_early"
    LINK_WORK_EARLY = "link_work_early"
    FIFO_PROBE = "fifo_probe"
    EXACT_DP = "exact_dp"
    FIFO_AGAIN = "fifo_again"
    LATE_BEAM = "late_beam"
    LATE_FIFO_BEAM = "late_fifo_beam"
    LOSS_BEAM = "loss_beam"
    SEED_POLISH = "seed_polish"
    STAGE_REFINE = "stage_refine"
    MILP = "milp"


@dataclass(frozen=True)
class Phase:
    """One phase of a solver's plan and its share of the time limit."""

    step: Step
    """What runs."""
    share: float | None = None
    """Its time: this share of the limit (None: up to the deadline; the FIFO steps size their own)."""
    from_start: bool = False
    """The share ends at that fraction of the limit counted from the solve's start, not from the phase's."""
    only_if_open: bool = True
    """Skipped once the best answer is proven within the gap."""
    min_left_s: float = 0.0
    """Skipped unless at least this many seconds are left."""
    backend: SolverName | None = None
    """MILP phases: the backend."""
    exact_windows: bool = False
    """MILP phases: windows W = L = n, so the model covers every schedule and its bound is a true bound."""
    last_until: float | None = None
    """DP_FIRST: the fraction of the limit, from the solve's start, to which the finest relaxed step may run (the
    exact DP phase's own end; None: its share's)."""
    early: bool = False
    """STAGE_REFINE: the slot before the exact DP's first sweeps, which runs where layers have too many saved tensors
    to try every subset; the later slot, after the first local search, runs on the other traces."""


def _relaxed_offload(options: SolveOptions, trace: Trace, allowed: frozenset[Action]) -> bool:
    """Whether plan_for's `relaxed` matters and holds: auto on a trace short enough for the exact-window MILP, with
    offload allowed, a limit that leaves the MILP time to run (MILP_MIN_LEFT_S), and some layer whose offload
    subsets are too many to try (asked only there: it loads the DP)."""
    milp_s = (1.0 - shares.DP_UNTIL_RELAXED) * options.time_limit_s
    if options.solver != SolverName.AUTO or trace.n > shares.AUTO_MILP_MAX_LAYERS or Action.OFFLOAD not in allowed:
        return False
    if milp_s < 1.5 * shares.MILP_MIN_LEFT_S:
        return False
    from memsched.optimizer.dp.problem import offload_enumerable

    # A near-exact relaxation's sweep proves more than the MILP's bound where it finishes (gpt2-medium on an
    # H100 at 75%: 0.0160 s against CBC's 0.0144 s), so there the DP keeps DP_UNTIL.
    return not offload_enumerable(trace) and near_exact_ranges(trace) is None


def plan_for(
    solver: SolverName,
    n_layers: int,
    allowed: frozenset[Action] = ALL_ACTIONS,
    lagrange: LagrangeKind | None = None,
    relaxed: bool = False,
) -> list[Phase]:
    """The phases `solver` runs on a trace of `n_layers` layers, in order (docs/formulation.md, 'How solve()
    proceeds'). The stage bound first (milliseconds), then candidates (beam DP, local search; long traces give the
    local search the larger share,
    as the exact DP rarely finishes there), then the FIFO sweep's probe, then what proves the bound. On short traces
    the exact DP runs before the local search where its sweeps are what proves (`Step.DP_FIRST`, DP_FIRST_SHARE).
    `lagrange`: the Lagrangian bound to run (`lagrange_kind`). On the memory rows its prices bound every
    completion and the exact DP finishes on long traces too, so they keep the local search's short share; the
    link windows' share comes out of the local search's long share, so the exact DP keeps its time.
    `relaxed`: some layer has too many saved tensors to try every offload subset (`_relaxed_offload`): where
    the exact-window MILP follows, the DP leaves it a larger share (DP_UNTIL_RELAXED). On traces of
    LATE_BEAM_MIN_LAYERS to LATE_BEAM_MAX_LAYERS a late, wider beam comes before the last local search, whose
    plan's own search that one races (`Flow.late_beam`).

    With some actions left out (`allowed`): the FIFO sweep only matters where there are copies (with no offload
    the fluid sweep is exact; with offload alone it prices the stalls that the fluid sweep drains as it goes); the
    MILP always models recompute, so without it the local search takes its place (a MILP asked for by name is
    refused up front)."""
    if solver == SolverName.HEURISTIC:
        return []
    long_trace = n_layers > shares.LONG_TRACE
    searches = [
        Phase(Step.STAGE_BOUND),
        Phase(Step.BEAM, shares.BEAM_SHARE / 2 if long_trace else shares.BEAM_SHARE, only_if_open=False),
        # Even once proven (the stage bound can prove a beam's first plans within the gap): it costs ms on such
        # traces and often beats them (bert-large on an H100 at 75%: 0.006772 -> 0.006715 s, of 0.006707 s).
        Phase(Step.RATIO, shares.RATIO_SHARE, only_if_open=False),
    ]
    if Action.OFFLOAD in allowed and n_layers <= shares.FIFO_MAX_LAYERS:
        # The FIFO sweep at once where the beams say stalls decide the plans (Flow.fifo_early).
        searches.append(Phase(Step.FIFO_EARLY, shares.FIFO_EARLY_SHARE))
    if Action.OFFLOAD in allowed and not long_trace:
        # The link-work sweep where copy latency decides the stalls (Flow.link_work_early): a tenth of a second.
        searches.append(Phase(Step.LINK_WORK_EARLY, shares.LINK_WORK_EARLY_SHARE))
    if not long_trace and lagrange != LagrangeKind.ROWS:
        searches.append(Phase(Step.DP_PROBE, shares.DP_PROBE_SHARE))
    if lagrange == LagrangeKind.ROWS:
        searches.append(Phase(Step.LAGRANGE, shares.LAGRANGE_SHARE_LONG if long_trace else shares.LAGRANGE_SHARE))
    elif lagrange == LagrangeKind.LINK:
        searches.append(Phase(Step.LAGRANGE, shares.LAGRANGE_SHARE))
        searches.append(Phase(Step.LINK_PLAN, shares.LINK_PLAN_SHARE))
    if not long_trace:
        # The relaxed FIFO beam's round that the beam's share cut, where the gap is open (Flow.late_fifo_beam): a
        # better incumbent also prunes the exact DP's sweeps after it.
        searches.append(Phase(Step.LATE_FIFO_BEAM, shares.LATE_FIFO_BEAM_SHARE))
        # The stage bound's finer passes (Flow.stage_refine), here where layers have too many saved tensors to try
        # every subset: the exact DP's relaxed sweeps after it take the rest of a short limit.
        searches.append(Phase(Step.STAGE_REFINE, shares.STAGE_REFINE_SHARE, early=True))
        # The relaxed FIFO beam once more with the future table's loss-point row, where it decides
        # (Flow.loss_beam); after the finer passes, which take milliseconds and may prove the answer it has.
        searches.append(Phase(Step.LOSS_BEAM, shares.LOSS_BEAM_SHARE))
        # The exact DP before any local search, where its sweeps are what proves (dp_first).
        searches.append(Phase(Step.DP_FIRST, shares.DP_FIRST_SHARE))
    # On long traces the exact DP, after this local search, climbs and stops at its pace where it cannot finish
    # (DP_UNTIL_LONG); the local search then goes on where it stopped. Where the memory rows' prices prune
    # the DP it finishes, as on short traces.
    dp_long = long_trace and lagrange != LagrangeKind.ROWS
    polish_share = shares.POLISH_SHARE
    if dp_long:
        link = lagrange == LagrangeKind.LINK
        polish_share = shares.POLISH_SHARE_LONG - (shares.LAGRANGE_SHARE + shares.LINK_PLAN_SHARE if link else 0.0)
    # Before it a Lagrangian or (short traces) the exact DP can prove the requested gap; when one has, the answer is
    # what was asked for.
    searches.append(Phase(Step.POLISH, polish_share, only_if_open=lagrange is not None or not long_trace))
    # Elsewhere after this local search: a finer pass then only runs where the gap is still open, and it does not
    # take the time the search needs (Flow.stage_refine).
    searches.append(Phase(Step.STAGE_REFINE, shares.STAGE_REFINE_SHARE))
    if Action.OFFLOAD in allowed:
        searches.append(Phase(Step.FIFO_PROBE))
    if solver in BACKENDS:
        if Action.RECOMPUTE not in allowed:
            raise MemschedError(
                f"solver: {solver} solves a model that always includes recompute, so it cannot plan without it; "
                "use --solver auto or dp with these --actions"
            )
        # A true bound first (the DP), then the backend asked for by name with the rest of the time.
        return [
            *searches,
            Phase(Step.EXACT_DP, shares.DP_SHARE_BEFORE_MILP),
            Phase(Step.MILP, only_if_open=False, backend=solver),
        ]
    # The exact DP gets most of what is left; where it cannot finish, the FIFO sweep may run again, and the
    # last part goes to the exact-window MILP (auto, small traces) and the local search.
    milp_ok = solver == SolverName.AUTO and n_layers <= shares.AUTO_MILP_MAX_LAYERS and Action.RECOMPUTE in allowed
    # The local search takes what is left at the end (after the MILP too: CBC stops short of the deadline to
    # leave room for its kill grace, and on a relaxed trace the MILP's share is large).
    polish = Phase(Step.POLISH, 1.0, min_left_s=0.2)
    # Before the MILP, the local search from the exact DP's plan where the DP prices plans exactly (Flow.seed_polish):
    # the MILP would otherwise take the time that search needs.
    milp = [
        Phase(Step.SEED_POLISH, shares.SEED_POLISH_SHARE),
        Phase(Step.MILP, min_left_s=0.2, backend=AUTO_BACKEND, exact_windows=True),
    ]
    last = [*milp, polish] if milp_ok else [polish]
    if shares.LATE_BEAM_MIN_LAYERS <= n_layers <= shares.LATE_BEAM_MAX_LAYERS:
        last.insert(0, Phase(Step.LATE_BEAM, shares.LATE_BEAM_SHARE))
    dp_until = shares.DP_UNTIL_LONG if dp_long else shares.DP_UNTIL_RELAXED if relaxed and milp_ok else shares.DP_UNTIL
    dp = Phase(Step.EXACT_DP) if solver == SolverName.DP else Phase(Step.EXACT_DP, dp_until, from_start=True)
    # The early DP's finest relaxed step may run to where the exact DP phase ends: cut at its share, it would run
    # again from the start after the local search (DP_FIRST_SHARE).
    first_until = 1.0 if solver == SolverName.DP else dp_until
    searches = [dataclasses.replace(p, last_until=first_until) if p.step == Step.DP_FIRST else p for p in searches]
    # The FIFO climb, where the fluid sweep finished with the gap open, has up to where the DP would have stopped.
    fifo_until = None if solver == SolverName.DP else dp_until
    fifo_again = [Phase(Step.FIFO_AGAIN, fifo_until, from_start=True)] if Action.OFFLOAD in allowed else []
    # The memory rows' bound again with the mixed rule for checkpoint inputs, where the DP left the gap open.
    mixed = [Phase(Step.LAGRANGE_MIXED, shares.LAGRANGE_MIXED_SHARE)] if lagrange == LagrangeKind.ROWS else []
    return [*searches, dp, *mixed, *fifo_again, *last]


def _run_phase(flow: Flow, phase: Phase) -> None:
    if phase.share is None:
        until = flow.deadline - flow.reserve
    elif phase.from_start:
        until = flow.until_from_start(phase.share)
    else:
        until = flow.until(phase.share)
    if phase.step == Step.PROVE:
        flow.prove_start(until)
    elif phase.step == Step.STAGE_BOUND:
        flow.stage_memory_bound()
    elif phase.step == Step.BEAM:
        flow.beam(until)
    elif phase.step == Step.RATIO:
        flow.ratio(until)
    elif phase.step == Step.DP_FIRST:
        last = phase.last_until
        flow.dp_first(until, None if last is None else flow.until_from_start(last))
    elif phase.step == Step.DP_PROBE:
        flow.dp_probe(until)
    elif phase.step == Step.LAGRANGE:
        flow.lagrange(until)
    elif phase.step == Step.LINK_PLAN:
        flow.link_plan(until)
    elif phase.step == Step.LAGRANGE_MIXED:
        flow.lagrange_mixed(until)
    elif phase.step == Step.POLISH:
        flow.polish(until)
    elif phase.step == Step.FIFO_EARLY:
        flow.fifo_early(until)
    elif phase.step == Step.LINK_WORK_EARLY:
        flow.link_work_early(until)
    elif phase.step == Step.FIFO_PROBE:
        flow.fifo_probe()
    elif phase.step == Step.EXACT_DP:
        flow.exact_dp(until)
    elif phase.step == Step.LATE_BEAM:
        flow.late_beam(until)
    elif phase.step == Step.LATE_FIFO_BEAM:
        flow.late_fifo_beam(until)
    elif phase.step == Step.SEED_POLISH:
        flow.seed_polish(until)
    elif phase.step == Step.LOSS_BEAM:
        flow.loss_beam(until)
    elif phase.step == Step.STAGE_REFINE:
        flow.stage_refine(until, phase.early)
    elif phase.step == Step.FIFO_AGAIN:
        flow.fifo_again(until)
    else:
        assert phase.step == Step.MILP and phase.backend is not None
        flow.milp(phase.backend, exact_windows=phase.exact_windows)


def solve_report(
    trace: Trace,
    budget_bytes: int,
    options: SolveOptions | None = None,
    resources: SolveResources | None = None,
    start: Schedule | None = None,
) -> SolveReport:
    """solve(), with the phases' raw results kept."""
    options = options or SolveOptions()
    report = _with_gap_note(
        _with_host_note(_solve_report(trace, budget_bytes, options, resources, start), options, trace), trace
    )
    if options.host_budget is not None:  # the replay's pinned pool reads its limit from here
        report.schedule = report.schedule.model_copy(update={"host_budget_bytes": options.host_budget})
    return report


def _solve_report(
    trace: Trace, budget_bytes: int, options: SolveOptions, resources: SolveResources | None, start: Schedule | None
) -> SolveReport:
    now = time.perf_counter()
    # The limit counts from the caller's start where it gives one (the CLI: its process's start).
    started = resources.started_at if resources is not None else None
    t0 = now if started is None else min(started, now)
    allowed = options.allowed_actions(trace)
    # Refuses a combination it cannot plan, up front.
    phases = plan_for(
        options.solver, trace.n, allowed, lagrange_kind(trace, allowed), _relaxed_offload(options, trace, allowed)
    )
    # Without offload, a budget below the best baseline is settled by the exact DP (optimizer/actions.py),
    # whose plan, where one fits, joins the candidates.
    feasibility_deadline = t0 + _FEASIBILITY_SHARE * options.time_limit_s
    try:
        found = check_feasible(trace, budget_bytes, allowed, feasibility_deadline, t0 + options.time_limit_s)
    except InfeasibleBudgetError as e:
        # What a budget needs under a host budget, within the solve's own limit (it bounds the whole call).
        end = t0 + options.time_limit_s
        _host_zero_answer(trace, budget_bytes, options, e, max(feasibility_deadline, end - _ANSWER_RESERVE_S))
        _least_budget_under_host(trace, budget_bytes, options, e, end - _ANSWER_RESERVE_S)
        raise
    if max(stage_memory(trace, [KEEP] * trace.n)) + trace.static.total <= budget_bytes:
        rec = record(
            "keep-all",
            SolverStatus.OPTIMAL,
            0.0,
            time.perf_counter() - t0,
            "keep-all fits the budget: no overhead",
            bound=0.0,
        )
        return SolveReport(make_schedule(trace, [KEEP] * trace.n, budget_bytes, "keep-all", rec), None, None)
    cands = candidates(trace, budget_bytes, allowed, options.host_budget)
    if not cands and found is None and options.host_budget is not None:
        found = _host_feasible_plan(trace, budget_bytes, allowed, options.host_budget, feasibility_deadline)
    flow = Flow(trace, budget_bytes, options, resources or SolveResources(), t0, allowed, found, cands)
    if start is not None:
        phases = _from_start(flow, start, phases)
    if flow.best.sim.overhead_s <= 0.0:
        return _zero_overhead(trace, budget_bytes, flow.best, time.perf_counter() - t0)
    # Every solve's compiled kernels (the heuristic-only one's ratio plan scores with one too): loaded, or compiled
    # first in an environment, in a thread of their own that no time-limit signal reaches (optimizer/jit.py).
    # The MILP needs no compiled kernels: where one follows (asked for by name, or under auto where a cold compile
    # would outlast the limit), a first solve in an environment waits for them only part of its limit, and gives
    # the MILP the rest if they are still compiling then.
    milp_wait = flow.until_from_start(shares.KERNELS_BEFORE_MILP)
    milp_room = flow.deadline - flow.reserve - milp_wait >= shares.MILP_MIN_LEFT_S
    short = options.solver in BACKENDS or options.time_limit_s <= shares.COLD_COMPILE_S
    milps = [ph for ph in phases if ph.step == Step.MILP] if milp_room and short else []
    if not flow.prepare_kernels(milp_wait if milps else None):
        if not phases:
            return _heuristic_only(trace, budget_bytes, flow)
        for phase in milps:
            if flow.left() >= phase.min_left_s:
                _run_phase(flow, phase)
        return flow.report()
    if not phases:
        flow.ratio(flow.until(shares.RATIO_SHARE))
        return _heuristic_only(trace, budget_bytes, flow)
    if options.solver in (SolverName.AUTO, SolverName.DP) and _enumerated(flow):
        return flow.report()
    for phase in phases:
        if (phase.only_if_open and flow.proven()) or flow.left() < phase.min_left_s:
            continue
        _run_phase(flow, phase)
        if flow.best.sim.overhead_s <= 0.0:
            return _zero_overhead(trace, budget_bytes, flow.best, time.perf_counter() - t0)
    return flow.report()


def _enumerated(flow: Flow) -> bool:
    """Where the trace's plans are few and keep and recompute only (optimizer/exhaustive.py): every one priced, and
    the cheapest that fits proven optimal (bound = its overhead). False where they are not few, or the clock stopped
    the enumeration (the phases then run as ever)."""
    from memsched.optimizer import exhaustive  # numba (fastsim) loads here, not on every CLI start

    if not exhaustive.applies(flow.trace, flow.allowed):
        return False
    t0 = time.perf_counter()
    out = exhaustive.enumerate_plans(flow.trace, flow.budget, flow.allowed, flow.until(shares.ENUMERATE_SHARE))
    if not out.finished or out.best is None or not out.best.feasible:
        return False
    flow.add("exhaustive", out.best)
    flow.prove(out.best.overhead_s, "exhaustive")
    flow.notes.append(f"every one of the {out.plans} plans priced in {time.perf_counter() - t0:.2g} s")
    return flow.proven()


def _from_start(flow: Flow, start: Schedule, phases: list[Phase]) -> list[Phase]:
    """An earlier answer joins the candidates (it must be this trace's, and fit this budget and host budget), with
    its bound where it was solved for this budget and host budget (the caller vouches for the rest of the
    options: solve()'s `start` is an earlier answer of the same solve); the plan proves the best candidate first
    (Step.PROVE). A heuristic-only plan stays as it is."""
    check_schedule(start, flow.trace)
    sim = simulate(flow.trace, decisions_from_schedule(start), flow.budget)
    if not sim.feasible or not fits_host(sim, flow.host):
        raise MemschedError(
            f"start: the schedule to start from does not fit this budget ({flow.budget} bytes) or host budget; "
            "give one solved for this budget or a smaller one"
        )
    flow.add("the schedule it started from", sim)
    if start.budget_bytes == flow.budget and start.host_budget_bytes == flow.host:
        flow.prove(start.solver.best_bound_s, "start")  # proved for this same problem before: it holds now
    if not phases:
        return phases
    # Once the best is proven there is nothing to add: even the phases that otherwise always run (the beam) wait.
    return [Phase(Step.PROVE, shares.PROVE_SHARE), *(dataclasses.replace(ph, only_if_open=True) for ph in phases)]


def _host_feasible_plan(
    trace: Trace, budget_bytes: int, allowed: frozenset[Action], host_budget: int, deadline: float
) -> SimResult:
    """A plan within both budgets where no heuristic or baseline plan is: the least-host plan (host.py), or
    InfeasibleHostBudgetError with the smallest host budget that works at this device budget."""
    known = [heuristic(trace, budget_bytes, allowed).sim]
    known += [r.sim for r in evaluate_baselines(trace, budget_bytes) if uses_only(r.sim.decisions, allowed)]
    need = min_host_bytes(trace, budget_bytes, allowed, deadline, known)
    if need.upper <= host_budget and need.sim is not None:
        return need.sim
    raise InfeasibleHostBudgetError(host_budget, budget_bytes, need.upper, need.proven, _need_detail(need))


def _need_detail(need: HostNeed) -> str:
    """How the smallest host budget was established, in words."""
    if need.proven:
        return "the exact DP over every plan proved it"
    return (
        f"the search for it was cut short: the least lies between {need.lower} bytes and that; a longer "
        "--time-limit narrows it"
    )


def _least_host(trace: Trace, budget_bytes: int, allowed: frozenset[Action], deadline: float) -> HostNeed:
    """The least host bytes a plan of `allowed` that fits `budget_bytes` offloads (host.min_host_bytes), with
    offload-all synchronously (it fits any budget from the smallest on) as the plan that bounds it from above."""
    known = [simulate(trace, min_feasible_decisions(trace), budget_bytes, with_events=False)]
    return min_host_bytes(trace, budget_bytes, allowed, deadline, known)


def _host_zero_answer(
    trace: Trace, budget_bytes: int, options: SolveOptions, e: InfeasibleBudgetError, deadline: float
) -> None:
    """A host budget of 0 left offload out and no keep / recompute plan fits: where an offload plan would fit,
    the answer is the host budget it needs (raised here); else the caller re-raises `e`."""
    if options.host_budget != 0:
        return
    base = options.model_copy(update={"host_budget": None}).allowed_actions(trace)
    if Action.OFFLOAD not in base or budget_bytes < min_feasible_budget(trace):
        return
    need = _least_host(trace, budget_bytes, base, max(deadline, time.perf_counter() + _MIN_SEARCH_S))
    raise InfeasibleHostBudgetError(
        0,
        budget_bytes,
        need.upper,
        need.proven,
        f"{_need_detail(need)}; keep and recompute alone need a budget of at least "
        f"{e.min_feasible_bytes} bytes" + ("" if e.proven else f" (or a little less: {e.unproven_why})"),
    )


def _least_budget_under_host(
    trace: Trace, budget_bytes: int, options: SolveOptions, e: InfeasibleBudgetError, end: float
) -> None:
    """Under a host budget above 0, the smallest device budget may lie above offload-all's (`e`'s, which holds
    every offloaded byte on the host): what the host budget refuses to hold, the device must. Found by bisection
    between that one and a budget that needs no host at all (keep and recompute's smallest; keep-all without
    recompute), each budget settled by the least host bytes any plan that fits it offloads (host.min_host_bytes:
    more device memory never needs more host). Raises InfeasibleBudgetError with it, proven where the budget just
    below it was proven not to fit (the caller re-raises `e` where offload-all's holds under the host budget too).
    Before, the error named offload-all's, and a solve at it was refused for the host budget (gpt2-medium on an
    H100 at 20%, --host-budget 1MB: 14.32 GiB named; 14.43 GiB fits, one byte less does not)."""
    host = options.host_budget
    allowed = options.allowed_actions(trace)
    if not host or Action.OFFLOAD not in allowed:
        return
    deadline = max(end, time.perf_counter() + _MIN_SEARCH_S)

    floor = e.min_feasible_bytes  # nothing fits below it, at any host budget
    at_floor = _least_host(trace, floor, allowed, deadline)
    if at_floor.upper <= host:
        return
    # A budget that fits with no host bytes (whether or not it is the least such: the bisection looks below it).
    if Action.RECOMPUTE in allowed:
        hi = smallest_budget(trace, allowed - {Action.OFFLOAD}, deadline, budget_bytes)[0]
    else:
        hi = trace.static.total + keepall_activation_peak(trace)  # keep-all
    # `lo` does not fit under the host budget; `lo_proven`: the DP proved it (its least host bytes' lower bound is
    # above the host budget), and then no smaller budget fits either.
    lo, lo_proven = floor, at_floor.lower > host
    why = "the least host bytes a budget needs were not proven in time"
    while hi - lo > 1:
        if time.perf_counter() >= deadline:
            lo_proven, why = False, "the search for it ran out of time"
            break
        mid = (lo + hi) // 2
        n = _least_host(trace, mid, allowed, deadline)
        if n.upper <= host:
            hi = mid
        else:
            lo, lo_proven = mid, n.lower > host
    raise InfeasibleBudgetError(
        budget_bytes,
        hi,
        f"under the host budget of {format_bytes(host)}: what the host cannot hold stays on the device; raise "
        "--host-budget to need less",
        proven=lo_proven and hi - lo <= 1,
        unproven_why=why,
    )


def _with_gap_note(report: SolveReport, trace: Trace) -> SolveReport:
    """Say why recompute segments are short where the trace marks gaps whose code saves (Trace.segment_last)."""
    marked = sum(layer.code_after_saves for layer in trace.layers)
    if marked:
        rec = report.schedule.solver
        note = (
            f"recompute segments end after the {marked} layer(s) followed by code that saves tensors for backward "
            "(code_after_saves: a norm or residual op between traced layers): the replay re-runs only traced layers"
        )
        report.schedule.solver = rec.model_copy(update={"details": [*rec.details, note]})
    return report


def _with_host_note(report: SolveReport, options: SolveOptions, trace: Trace) -> SolveReport:
    """Say so in the answer when the CPU default, not the user, left offload out."""
    if options.actions is None and options.allowed_actions(trace) != ALL_ACTIONS:
        rec = report.schedule.solver
        sentence = _HOST_NOTE[0].upper() + _HOST_NOTE[1:] + "."
        report.schedule.solver = rec.model_copy(update={"message": f"{rec.message} {sentence}".strip()})
    return report


def solve(
    trace: Trace,
    budget_bytes: int,
    options: SolveOptions | None = None,
    resources: SolveResources | None = None,
    start: Schedule | None = None,
) -> Schedule:
    """Return the best schedule found for the budget; InfeasibleBudgetError if none can fit. `start`: an earlier
    answer of the same solve (trace, budget and options: a sweep's point solved again), a candidate from the
    start with its bound, which the solve first tries to prove (PROVE_SHARE)."""
    return solve_report(trace, budget_bytes, options, resources, start).schedule
