"""solve(start=...): a solve that starts from an earlier answer of the same solve (a sweep's open point solved
again) keeps that answer as a candidate with its bound, proves it first with the exact sweeps at its threshold,
and runs the rest of its plan only while the gap is open."""

from __future__ import annotations

import logging
import random

import pytest

from memsched.errors import MemschedError
from memsched.optimizer.budget import budget_between
from memsched.optimizer.decisions import decisions_from_schedule
from memsched.optimizer.simulate import simulate
from memsched.optimizer.solve import solve
from memsched.optimizer.synthetic import make_trace
from memsched.options import SolveOptions
from memsched.schema import Schedule, SolverStatus, Trace

OPTS = SolveOptions(time_limit_s=20.0, gap=0.01)


def _stall_heavy(seed: int) -> tuple[Trace, int]:
    """A random trace whose links are 20x slower than its compute, at a tight budget: stalls shape its plans."""
    rng = random.Random(seed)
    trace = make_trace(7, seed, dag=rng.random() < 0.5, copy_latency_s=2e-5)
    trace.device.h2d_bytes_per_s /= 20
    trace.device.d2h_bytes_per_s /= 20
    return trace, budget_between(trace, 0.3)


def _unproven(sc: Schedule) -> Schedule:
    """The same plan as an answer with nothing proven (a heuristic's)."""
    rec = sc.solver.model_copy(update={"status": SolverStatus.HEURISTIC, "best_bound_s": None, "gap": None})
    return sc.model_copy(update={"solver": rec})


@pytest.mark.parametrize("seed", range(6))
def test_a_solve_from_an_earlier_answer_proves_it_before_any_search(seed: int, caplog) -> None:
    trace, budget = _stall_heavy(seed)
    first = solve(trace, budget, OPTS)
    assert first.solver.status == SolverStatus.OPTIMAL and first.prediction.overhead_s > 0
    caplog.clear()  # only the second solve's records
    with caplog.at_level(logging.INFO, logger="memsched.optimizer.flow"):
        again = solve(trace, budget, OPTS, start=_unproven(first))
    assert again.solver.status == SolverStatus.OPTIMAL
    assert again.prediction.overhead_s <= first.prediction.overhead_s * (1 + 1e-9)
    assert simulate(trace, again).feasible
    # The exact sweeps at the start's threshold run first; once they prove it, no beam or local search runs.
    lines = [r.getMessage() for r in caplog.records]
    assert lines and lines[0].startswith("prove from the start")
    assert not any("beam" in m or "local search" in m for m in lines)


def test_the_start_bound_counts_only_for_its_own_budget() -> None:
    """An earlier answer claims its plan optimal (bound = its overhead). At its own budget the solve takes the
    claim (the caller vouches that it is the same solve); at a larger budget, where the optimum may be lower, the
    claim is no bound, and the solve proves its own."""
    trace, budget = _stall_heavy(1)
    first = solve(trace, budget, OPTS)
    claimed = first.model_copy(
        update={"solver": first.solver.model_copy(update={"best_bound_s": first.prediction.overhead_s})}
    )
    same = solve(trace, budget, SolveOptions(time_limit_s=20.0, gap=0.0), start=claimed)
    assert same.solver.best_bound_s == pytest.approx(first.prediction.overhead_s)
    assert any("from start" in d for d in same.solver.details)
    larger = budget_between(trace, 0.6)
    other = solve(trace, larger, SolveOptions(time_limit_s=20.0, gap=0.0), start=claimed)  # it fits, its bound not
    assert not any("from start" in d for d in other.solver.details)
    assert other.solver.best_bound_s is not None
    assert other.solver.best_bound_s <= other.prediction.overhead_s * (1 + 1e-9) + 1e-12


def test_a_start_that_does_not_fit_is_refused() -> None:
    trace, budget = _stall_heavy(2)
    roomy = solve(trace, budget_between(trace, 0.9), OPTS)
    if simulate(trace, decisions_from_schedule(roomy), budget).feasible:
        pytest.skip("this plan happens to fit the tighter budget too")
    with pytest.raises(MemschedError, match="start: the schedule to start from does not fit"):
        solve(trace, budget, OPTS, start=roomy)
