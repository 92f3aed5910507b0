"""What a backend hands back: the decisions it found, what it proved, and how long it took."""

from __future__ import annotations

from dataclasses import dataclass

from memsched.optimizer.decisions import Decision
from memsched.schema import SolverStatus


@dataclass
class Outcome:
    """One backend run."""

    backend: str
    """'cbc', 'highs' or 'cpsat'."""
    status: SolverStatus | None
    """What the run established: OPTIMAL (within the gap), FEASIBLE (an incumbent, the limit stopped the search),
    INFEASIBLE (the model has no solution), or None (the limit stopped it before any incumbent)."""
    decisions: list[Decision] | None
    """The incumbent's decisions (timing set), None without an incumbent."""
    objective_s: float | None
    """The solver's objective for the incumbent, seconds of overhead (before any re-simulation)."""
    bound_s: float | None
    """Best proven lower bound on the overhead, seconds (None if the backend proved none)."""
    wall_s: float
    """Wall-clock seconds spent in the backend (model transfer + search)."""
    message: str = ""
    """Backend details worth reporting (raw status, limit hit)."""
