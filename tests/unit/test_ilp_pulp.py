"""The PuLP layer: no deprecated PuLP calls, and PuLP's own errors surface as SolverError."""

from __future__ import annotations

import math
import warnings

import pytest

from memsched.errors import SolverError
from memsched.optimizer.budget import keepall_activation_peak, min_feasible_budget
from memsched.optimizer.ilp.model import build_model
from memsched.optimizer.ilp.pulp_backend import export_pulp, solve_pulp, to_pulp
from memsched.optimizer.synthetic import make_trace


def _model():  # type: ignore[no-untyped-def]
    trace = make_trace(6, 1)
    lo = min_feasible_budget(trace)
    return build_model(trace, lo + (trace.static.total + keepall_activation_peak(trace) - lo) // 3)


def test_building_the_pulp_problem_warns_nothing() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        to_pulp(_model())


@pytest.mark.parametrize("backend", ["cbc", "highs"])
def test_non_finite_coefficient_is_a_solver_error_naming_the_row(backend: str) -> None:
    m = _model()
    row = next(r for r in m.rows if r.name.startswith("fwd_compute_"))
    row.const = math.nan
    with pytest.raises(SolverError, match=row.name):
        solve_pulp(m, backend, 5, 0.01, None)


def test_pulp_error_becomes_solver_error(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    import pulp

    def boom(*_a: object, **_k: object) -> None:
        raise pulp.PulpError("synthetic failure")

    monkeypatch.setattr(pulp.LpProblem, "writeMPS", boom)
    with pytest.raises(SolverError, match="synthetic failure"):
        solve_pulp(_model(), "cbc", 5, 0.01, None)
    with pytest.raises(SolverError, match="synthetic failure"):
        export_pulp(_model(), tmp_path / "m.mps")
