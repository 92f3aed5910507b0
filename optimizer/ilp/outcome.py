"""What a backend hands back: the decisions it found, what it proved, and how long it took."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from memsched.optimizer.plan import Decision


class Found(StrEnum):
    """Backend-independent solve status (solve.py maps it onto SolverStatus)."""

    OPTIMAL = "optimal"
    """Proven optimal within the requested relative gap."""
    FEASIBLE = "feasible"
    """An incumbent exists, the limit stopped the search before the gap closed."""
    NO_SOLUTION = "no_solution"
    """The limit stopped the search before any incumbent was found."""
    INFEASIBLE = "infeasible"
    """The solver proved the model infeasible."""


@dataclass
class Outcome:
    """One backend run."""

    backend: str
    """'cbc', 'highs' or 'cpsat'."""
    found: Found
    """What the run established."""
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
