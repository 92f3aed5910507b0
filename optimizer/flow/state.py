"""One solve's state, which every phase reads and adds to (FlowState)."""

from __future__ import annotations

import logging
import math
import time
from enum import StrEnum
from typing import TYPE_CHECKING

from memsched.optimizer.actions import restrict
from memsched.optimizer.baselines import evaluate_baselines
from memsched.optimizer.decisions import uses_only
from memsched.optimizer.flow import shares
from memsched.optimizer.flow.report import Candidate, SolveReport, plain_summary, record
from memsched.optimizer.heuristic import heuristic
from memsched.optimizer.host import fits_host, host_binds, price_scale
from memsched.optimizer.ilp.outcome import Outcome
from memsched.optimizer.jit import KernelsPending, pending
from memsched.optimizer.polish import LocalSearch
from memsched.optimizer.simulate import SimResult, make_schedule
from memsched.options import SolveOptions, SolveResources
from memsched.schema import Action, SolverStatus, Trace

if TYPE_CHECKING:
    import numpy as np

    from memsched.optimizer.dp import BeamRank, DpOutcome, DpProblem
    from memsched.optimizer.dp.lagrange import LagrangeArrays, LinkLagrangian
    from memsched.optimizer.link_plan import LinkShares
    from memsched.optimizer.stage_bound import StageBound

log = logging.getLogger(__name__)


SweepKey = tuple[int, int | None, int | None]
"""An exact DP sweep: byte ranges per relaxed layer, and the coarse ladder's retained-bytes and backlog quanta as
limit >> shift (None: exact bytes)."""


def candidates(
    trace: Trace, budget_bytes: int, allowed: frozenset[Action], host_budget: int | None = None
) -> list[Candidate]:
    """The heuristic's and the baselines' schedules that fit (the device budget and the host budget) and use
    only the `allowed` actions."""
    out = [Candidate("heuristic", heuristic(trace, budget_bytes, allowed, host_budget).sim)]
    out += [Candidate(r.policy, r.sim) for r in evaluate_baselines(trace, budget_bytes) if r.feasible]
    ok = (c for c in out if c.sim.feasible and uses_only(c.sim.decisions, allowed) and fits_host(c.sim, host_budget))
    return sorted(ok, key=lambda c: c.sim.overhead_s)


class LagrangeKind(StrEnum):
    """Which Lagrangian bound a solve runs (optimizer/dp/lagrange.py)."""

    ROWS = "rows"
    """On the memory rows: plans without offload, or copies on the compute thread; its prices also prune the DP."""
    LINK = "link"
    """On the fluid link windows: copies beside compute, on traces of LINK_MIN_LAYERS to LINK_MAX_LAYERS."""


def lagrange_kind(trace: Trace, allowed: frozenset[Action]) -> LagrangeKind | None:
    """The Lagrangian bound worth running on this trace, if any (LAGRANGE_SHARE, LINK_MIN_LAYERS)."""
    if Action.OFFLOAD not in allowed or not trace.device.concurrent_copies:
        return LagrangeKind.ROWS
    if shares.LINK_MIN_LAYERS <= trace.n <= shares.LINK_MAX_LAYERS:
        return LagrangeKind.LINK
    return None


def near_exact_ranges(trace: Trace) -> int | None:
    """The fewest byte ranges of NEAR_EXACT_CELLS at which the relaxed offload options are near exact
    (optimizer/dp/problem.py, near_exact_cells), if any."""
    from memsched.optimizer.dp.problem import near_exact_cells

    return near_exact_cells(trace, [c for c in shares.NEAR_EXACT_CELLS if c > shares.RELAXED_LADDER[0]])


class FlowState:
    """One solve's state: the candidates found so far, the best true bound, and what each phase said; the
    phases themselves are AnswerPhases' (answers.py) and BoundPhases' (bounds.py)."""

    def __init__(
        self,
        trace: Trace,
        budget_bytes: int,
        options: SolveOptions,
        resources: SolveResources,
        t0: float,
        allowed: frozenset[Action],
        found: SimResult | None = None,
        cands: list[Candidate] | None = None,
    ) -> None:
        self.trace, self.budget, self.options, self.resources, self.t0 = trace, budget_bytes, options, resources, t0
        self.allowed = allowed
        """The actions plans may use (SolveOptions.allowed_actions)."""
        self.deadline = t0 + options.time_limit_s
        self.reserve = shares.RESERVE_S + shares.RESERVE_PER_LAYER_S * trace.n
        self.host = options.host_budget
        """The host budget (SolveOptions.host_budget): every candidate fits it (`add`)."""
        self.cands = candidates(trace, budget_bytes, allowed, self.host) if cands is None else cands
        if found is not None:  # the DP's plan from the feasibility check (keep / recompute plans), or the host one
            self.add("dp", found)
        assert self.cands, "a feasible budget admits the heuristic's schedule, a baseline or the DP's"
        self.bound = 0.0
        """Best lower bound on every schedule's overhead proved so far (0 always holds)."""
        self.bound_source = "none"
        self.notes: list[str] = []
        self.outcome: Outcome | None = None
        self.ilp_sim: SimResult | None = None
        self.dp: DpOutcome | None = None
        self.fifo_timed_out = False
        """The FIFO probe stopped at its time share (fifo_again then climbs from the proven bound)."""
        self.fifo_capped = False
        """The FIFO probe stopped at its label cap (fifo_again then climbs from the proven bound)."""
        self.fifo_stopped_at: tuple[int, int] | None = None
        """(byte ranges per relaxed layer, boundary) where the last FIFO sweep that stopped short (its clock or its
        label cap) stopped (`fifo_climb` reads it)."""
        self.stalls_decide = False
        """Every fluid beam's best plan was mispriced by more than STALLS_DECIDE: stalls decide the plans, and the
        FIFO sweep, not the fluid model, holds the bound (set by `beam` where the FIFO beam applies)."""
        self.some_mispriced = False
        """Some fluid beam's best plan was mispriced by more than MISPRICED: stalls decide some plans (set by
        `beam` where the FIFO beam applies; `fifo_early` and `link_work_early` read it)."""
        self.priced_exactly = False
        """Every fluid beam's best plan cost in the simulator what the sweep said (within PRICED_EXACTLY): the
        fluid model prices the plans that matter, and the FIFO probe is skipped (set by `beam`)."""
        self.fifo_note: str | None = None
        """Where the last FIFO sweep stopped, said in the answer only if the gap stays open."""
        self.fluid_cells: int | None = None
        """Byte ranges per relaxed layer of the finest exact DP sweep that finished (its bound is the fluid
        optimum of that relaxation; bound_problem); None: none finished."""
        self.link_work_cells: set[tuple[int, bool]] = set()
        """(byte ranges per relaxed layer, bytes in flight) of the link-work sweeps that finished (`link_work_dp`):
        another of the same, pruned by a better incumbent, proves no more."""
        self.in_flight_wanted: set[int] = set()
        """Byte ranges per relaxed layer whose plain link-work sweep finished with its best plan mispriced (or none
        that fits): there its optimum stalls on bytes in flight, which the sweep with them prices (`link_work_dp`)."""
        self.finished_sweeps: dict[SweepKey, float] = {}
        """The exact DP's sweeps that finished (none cut by the clock or the label cap), with the bound each
        proved. Another run of one at a lower incumbent proves no more (a finished sweep's bound is the smaller of
        its fluid optimum and its threshold), so a later exact DP phase skips it (`exact_dp`, `_coarse_dp`). Not
        kept where the host budget binds: there the sweeps climb, and the priced sweeps after them start from the
        last one's outcome."""
        self.dp_seed: SimResult | None = None
        """The exact DP's decoded optimum where it is not the best plan (its copies' default timing made it
        dearer): the next local search starts from it first (`polish`)."""
        self.kernels_s = 0.0
        """Seconds spent loading (or, the first time, compiling) the compiled kernels."""
        self.kernels_pending: KernelsPending | None = None
        """The kernels were still loading or compiling when the solve stopped waiting (`prepare_kernels`): the answer
        is a greedy plan, or the MILP's."""
        self.host_binds = host_binds(trace, self.host, allowed)
        """Whether the host budget excludes some plan (else nothing below looks at it)."""
        self.price_scale = price_scale(trace)
        """The first Lagrangian price of the host budget, seconds per byte."""
        self._search: LocalSearch | None = None
        """The last local search (`_polish_from`), and the candidate it stands at (its best plan as returned)."""
        self._search_at: SimResult | None = None
        self._rival: LocalSearch | None = None
        """A second local search, from the late beam's plan (`late_beam`), that the last one races (`_race`)."""
        self._restarts = 0
        """Local searches started again after one stopped by itself (`_polish_from`): each one's seed."""
        self.improved_at = time.perf_counter()
        """When the best plan last improved (perf_counter)."""
        self._share_note = ""
        """The note that the Lagrangian bound stopped at its time share (`lagrange`), if it did."""
        self.link_shares: list[LinkShares] = []
        """Each layer's share of the link windows' Lagrangian's steps in each action, over several windows of its
        ascent (`LinkLagrangian.windows`), where it ran: the link plan rounds them (`link_plan`)."""
        self._link: LinkLagrangian | None = None
        """The link windows' Lagrangian where its share stopped it before it converged: the solve's last local
        search shares its time with it (`_polish_and_bound`)."""
        self.widest_beam = 0
        """Labels per boundary of the widest fluid beam round of `beam` that finished, either series (0: none);
        `late_beam`'s probe runs this wide."""
        self.beam_rank: BeamRank | None = None
        """The fluid beams' ranking whose series found the best plan in `beam` (None: `beam` did not run);
        `late_beam` ranks as it does."""
        self.relaxed_beam_left: int | None = None
        """Labels per boundary of the relaxed FIFO beam's round that `beam`'s share cut or left out (None: none was);
        `late_fifo_beam` runs it, and the wider rounds after it, where the gap is still open."""
        self.stage_pass: tuple[StageBound, float] | None = None
        """The stage bound's first pass and its seconds (None: it did not run); `stage_refine` runs finer ones."""
        self.stage_refined = False
        """Whether `stage_refine` ran a pass (it runs in one of its two slots)."""
        self.relaxed_beam_s: list[float] = []
        """Seconds of each relaxed FIFO beam round of `beam` that finished, narrowest first."""
        self.fifo_beam_found_s = math.inf
        """The best plan's overhead of the last FIFO beam (`_fifo_beam`; inf: none below its threshold)."""
        self._problem: DpProblem | None = None
        self._bound_problems: dict[int, DpProblem] = {}
        self._rows_prices: tuple[LagrangeArrays, np.ndarray] | None = None
        """The memory rows' Lagrangian arrays and best prices (first reader's rule), where it ran: the mixed rule's
        ascent after the exact DP starts there (`lagrange_mixed`)."""
        self.setup_s = time.perf_counter() - t0
        """Seconds from the solve's start (the CLI: its process's start) to here: the interpreter and imports, reading
        the trace, the feasibility check and the first plans (said where they pass the limit: `plain_summary`)."""

    def problem(self) -> DpProblem:
        """The DP's arrays of this trace and budget, built once per solve (its future-cost table is the costly
        part on long traces)."""
        if self._problem is None:
            from memsched.optimizer.dp import build_problem  # numba loads here, not on every CLI start

            self._problem = restrict(build_problem(self.trace, self.budget, self.deadline), self.allowed)
        return self._problem

    def bound_problem(self, cells: int) -> DpProblem:
        """The problem the proving sweeps run on: problem(), with the offload choices of layers that have too
        many saved tensors to enumerate relaxed into `cells` byte ranges, so that their bounds hold (the beam
        keeps real subsets: its plans are what it finds). problem() itself where every layer's subsets are
        enumerated."""
        if cells not in self._bound_problems:
            from memsched.optimizer.dp import relaxed_problem

            self._bound_problems[cells] = relaxed_problem(self.problem(), self.trace, cells)
        return self._bound_problems[cells]

    @property
    def best(self) -> Candidate:
        return self.cands[0]

    def left(self) -> float:
        return self.deadline - self.reserve - time.perf_counter()

    def until(self, share: float) -> float:
        """A phase deadline: `share` of the limit from now, never past the overall deadline."""
        return self.until_at(time.perf_counter() + share * self.options.time_limit_s)

    def until_at(self, when: float) -> float:
        """A phase deadline at `when` (perf_counter), never past the overall deadline."""
        return min(when, self.deadline - self.reserve)

    def until_from_start(self, share: float) -> float:
        """A phase deadline: `share` of the limit from the solve's start, never past the overall deadline."""
        return self.until_at(self.t0 + share * self.options.time_limit_s)

    def add(self, name: str, sim: SimResult) -> None:
        # Every search is built to keep to the allowed actions; one that did not is a bug, and its plan is not the
        # user's (a FIFO sweep once emitted recompute segments under --actions keep,offload).
        if not uses_only(sim.decisions, self.allowed):
            log.warning("%s: a plan with actions outside %s dropped (a bug; please report it)", name, self.allowed)
            return
        # A plan over the host budget is never a candidate (the DP's relaxation and its priced sweeps decode them).
        if sim.feasible and fits_host(sim, self.host):
            if not self.cands or sim.overhead_s < self.best.sim.overhead_s:
                self.improved_at = time.perf_counter()
            self.cands.append(Candidate(name, sim))
            self.cands.sort(key=lambda c: c.sim.overhead_s)

    def prove(self, value: float | None, source: str) -> None:
        if value is not None and value > self.bound:
            self.bound, self.bound_source = value, source

    def _proven_below(self) -> float | None:
        """The overhead at or below which a plan is proven within the requested gap by the bound found so far (the
        local search's target; None where no bound or gap makes one)."""
        return self.bound / (1.0 - self.options.gap) if self.bound > 0.0 and self.options.gap < 1.0 else None

    def fluid_optimum_known(self) -> bool:
        """Whether an exact DP sweep found the fluid relaxation's optimum: no fluid sweep can prove more."""
        return self.dp is not None and self.dp.fluid_optimum

    def proven(self) -> bool:
        obj = self.best.sim.overhead_s
        # 1e-6 relative: backends round (CP-SAT scales times to integer nanoseconds).
        return obj <= 0.0 or (obj - self.bound) <= (self.options.gap + 1e-6) * obj + 1e-12

    # ---------------------------------------------------------------- phases
    def prepare_kernels(self, until: float | None = None) -> bool:
        """The compiled kernels (DP, local search), before the phases that share the clock: loading them takes
        0.2-1.3 s, but the first run in an environment compiles them (20-45 s), so the solve waits for them until
        its deadline at most, and where `until` is given, only until then if they are being compiled (a kernel
        missed numba's cache) and not loaded. False: they were still compiling, and only the greedy plans found
        before, and a MILP phase (it needs no kernels), can give the answer."""
        from memsched.optimizer.jit import kernels_by

        t0 = time.perf_counter()
        ready = kernels_by(self.deadline - self.reserve, until)
        took = self.kernels_s = time.perf_counter() - t0
        self.kernels_pending = None if ready else pending() or KernelsPending.COMPILING
        if self.kernels_pending == KernelsPending.LOADING:
            self.notes.append(
                f"the optimizer's compiled kernels were still loading from numba's cache after {took:.2g} s: no "
                "search or bound that runs on them ran (a load takes about a second, once per process)"
            )
        elif self.kernels_pending is not None:
            self.notes.append(
                f"the optimizer's compiled kernels were still compiling after {took:.2g} s: no search or bound that "
                "runs on them ran (the first solve in an environment compiles them, once; `make install` does it "
                "ahead)"
            )
        elif took > 0.25 * self.options.time_limit_s:
            self.notes.append(
                f"{took:.2g} s of the limit went to loading the optimizer's compiled kernels (once per "
                "process; the first use in an environment also compiles them)"
            )
        return ready

    # ---------------------------------------------------------------- the answer
    def report(self) -> SolveReport:
        best = self.best
        obj = best.sim.overhead_s
        wall = time.perf_counter() - self.t0
        status = SolverStatus.OPTIMAL if self.proven() else SolverStatus.FEASIBLE
        # The plain sentence for the user; the phases' own words go to `details`.
        details = [f"best schedule from {best.name}"]
        if self.bound_source != "none":
            details.append(f"lower bound {self.bound:.6g} s from {self.bound_source}")
        if self.host_binds:
            note = f"host budget {self.host} bytes: plans over it discarded"
            if self.bound_source in ("dp", "dp-fifo", "dp-link-work", "dp-in-flight"):
                note += "; the bound leaves it out (a relaxation: still a true bound)"
            elif self.bound_source != "none":
                note += "; the bound accounts for it"
            details.append(note)
        notes = [*self.notes, self.fifo_note] if self.fifo_note and status != SolverStatus.OPTIMAL else self.notes
        details += notes
        gap = (obj - min(self.bound, obj)) / obj if obj > 0 else 0.0
        msg = plain_summary(
            status,
            obj,
            self.bound,
            self.bound_source,
            gap,
            self.options.gap,
            self.options.time_limit_s,
            wall,
            self.kernels_s,
            self.setup_s,
            self.kernels_pending,
        )
        rec = record(best.name, status, obj, wall, msg, bound=self.bound, details=details)
        schedule = make_schedule(self.trace, best.sim.decisions, self.budget, best.name, rec)
        return SolveReport(schedule, self.outcome, self.ilp_sim, self.dp)
