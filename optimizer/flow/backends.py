"""The MILP backends (optimizer/ilp/) as the solve runs them: one entry per solver name."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from memsched.optimizer.decisions import Decision
from memsched.optimizer.ilp.limits import MIN_SEARCH_S, NO_TIME, limit_within, predicted_build_s, worth_handing_over
from memsched.optimizer.ilp.model import MilpModel, build_model, default_max_segment, default_window
from memsched.optimizer.ilp.outcome import Outcome
from memsched.optimizer.ilp.warm import representable
from memsched.optimizer.simulate import simulate
from memsched.options import SolveOptions, SolveResources, SolverName
from memsched.schema import Trace

if TYPE_CHECKING:
    pass

log = logging.getLogger(__name__)


AUTO_BACKEND = SolverName.CBC  # measured fastest on our 2-core machine (bench/results/solver_bench.md)


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


def _model_is_exact(m: MilpModel, offload: bool) -> bool:
    """Whether the MILP's windows cover every schedule of its trace (then its bound is a true bound)."""
    n = m.trace.n
    timing_free = m.window >= n - 1 or not m.trace.device.concurrent_copies or not offload
    return timing_free and m.max_segment >= n


def _solve_pulp_backend(name: str) -> Callable[..., Outcome]:
    def run(
        m: MilpModel, limit_s: float, gap: float, warm: list[Decision] | None, threads: int | None, deadline: float
    ) -> Outcome:
        from memsched.optimizer.ilp.pulp_backend import solve_pulp

        return solve_pulp(m, name, limit_s, gap, warm, threads, deadline)

    return run


def _solve_cpsat(
    m: MilpModel, limit_s: float, gap: float, warm: list[Decision] | None, threads: int | None, deadline: float
) -> Outcome:
    from memsched.optimizer.ilp.cpsat_backend import solve_cpsat

    return solve_cpsat(m, limit_s, gap, warm, threads, deadline)


def _export_pulp(m: MilpModel, path: Path) -> None:
    from memsched.optimizer.ilp.pulp_backend import export_pulp

    export_pulp(m, path)


def _export_cpsat(m: MilpModel, path: Path) -> None:
    from memsched.optimizer.ilp.cpsat_backend import export_cpsat

    export_cpsat(m, path)


@dataclass(frozen=True)
class Backend:
    """A MILP backend: how it solves a built model and how it writes the model out."""

    solve: Callable[[MilpModel, float, float, list[Decision] | None, int | None, float], Outcome]
    """(model, time limit s, gap, warm start, threads, deadline) -> outcome, its solver ending by the deadline
    (perf_counter) whatever its set-up took; imports its library on first use."""
    export: Callable[[MilpModel, Path], None]
    """Writes the model for reproduction (LP/MPS, or the CP-SAT proto)."""
    objective_is_simulated: bool
    """Whether its objective equals the simulator's overhead to rounding (CP-SAT scales times to integers)."""
    setup_per_build: float
    """Its set-up before its solver's clock starts (the hand-over of a built model and its warm start) takes up
    to this many times as long as building the model (ilp.limits.worth_handing_over). Measured on 40- to
    100-layer synthetic chains and DAGs with exact windows, 2026-11-30: CBC 2.1-3.7x (PuLP's problem, then its
    MPS file: 4.1 s after a 1.1 s build on the 100-layer DAG), HiGHS 0.4-0.9x (one row-wise matrix), CP-SAT
    1.6-4.2x (its proto and presolve)."""


BACKENDS: dict[SolverName, Backend] = {
    SolverName.CBC: Backend(_solve_pulp_backend("cbc"), _export_pulp, objective_is_simulated=True, setup_per_build=4.0),
    SolverName.HIGHS: Backend(
        _solve_pulp_backend("highs"), _export_pulp, objective_is_simulated=True, setup_per_build=1.2
    ),
    SolverName.CPSAT: Backend(_solve_cpsat, _export_cpsat, objective_is_simulated=False, setup_per_build=4.5),
}
"""Every MILP backend, by the solver name that asks for it."""


def run_backend(
    trace: Trace,
    budget_bytes: int,
    options: SolveOptions,
    backend: SolverName,
    starts: list[list[Decision]],
    deadline: float,
    resources: SolveResources,
    offload: bool = True,
) -> tuple[Outcome, bool]:
    """One MILP run (windows from `options`; `offload=False`: the recompute-only model) that ends by `deadline`
    (perf_counter), model building included; returns its outcome and whether its model is exact (windows
    cover everything)."""
    entry = BACKENDS[backend]
    n = trace.n
    window = default_window(n) if options.window is None else options.window
    max_segment = default_max_segment(n) if options.max_segment is None else options.max_segment
    predicted_s = predicted_build_s(n, window, max_segment)
    left = deadline - time.perf_counter()
    if resources.export_model is None and not worth_handing_over(
        predicted_s, left - predicted_s, entry.setup_per_build
    ):
        # Its build alone would take the time its hand-over needs (a 100-layer DAG with exact windows: built in
        # 0.9-1.1 s, then not handed over with 3.3 s left): the time goes to the phases after it.
        said = (
            f"{backend}: not built: its model takes about {predicted_s:.2g} s to build and "
            f"{entry.setup_per_build:g}x that to hand over, and {max(left, 0.0):.2g} s were left"
        )
        log.info(said)
        return Outcome(str(backend), None, None, None, None, 0.0, said), False
    began = time.perf_counter()
    m = build_model(
        trace, budget_bytes, options.window, options.max_segment, offload=offload, host_budget=options.host_budget
    )
    warm = _best_start(m, starts)
    built_s = time.perf_counter() - began
    if resources.export_model is not None:
        entry.export(m, resources.export_model)
    if not worth_handing_over(built_s, deadline - time.perf_counter(), entry.setup_per_build):
        # Handing it over would pass the deadline before the solver starts (a 100-layer DAG at 40%, 10 s: built
        # in 0.9 s with 3.3 s left, its hand-over into CBC took 3.5 s, the last 1.9 s of it writing the MPS file).
        wall = time.perf_counter() - began
        log.info("%s: not handed over: its model took %.2f s to build, %.2f s left", backend, built_s, left - wall)
        return Outcome(str(backend), None, None, None, None, wall, f"{backend}: {NO_TIME}"), _model_is_exact(m, offload)
    # The backend cuts its solver's limit again once its own set-up is done (ilp.limits.solver_limit).
    time_limit_s = max(MIN_SEARCH_S, limit_within(deadline - time.perf_counter()))
    outcome = entry.solve(m, time_limit_s, options.gap, warm, resources.threads, deadline)
    return outcome, _model_is_exact(m, offload)
