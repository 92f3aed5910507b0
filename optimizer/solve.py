"""The optimizer's front door: trace + budget + options -> Schedule.

Until the ILP backends land this returns the best feasible baseline; the interface is final.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from memsched.optimizer.baselines import best_baseline
from memsched.optimizer.budget import check_budget_feasible
from memsched.schema import Schedule, Trace

SOLVERS = ("auto", "cbc", "highs", "cpsat", "heuristic")


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


def solve(trace: Trace, budget_bytes: int, options: SolveOptions | None = None) -> Schedule:
    """Return the best schedule found for the budget; InfeasibleBudgetError if none can fit."""
    options = options or SolveOptions()
    check_budget_feasible(trace, budget_bytes)
    return best_baseline(trace, budget_bytes)
