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


@pytest.mark.parametrize("backend", ["cbc", "highs", "cpsat"])
def test_the_solver_limit_is_read_after_the_model_is_built(backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Building a model takes seconds on a few hundred layers: the solver gets what the deadline leaves after that,
    # and none at all where nothing is left.
    import time

    from memsched.optimizer.ilp import cpsat_backend, limits, pulp_backend

    seen: list[float] = []
    real = limits.solver_limit

    def spy(time_limit_s: float, deadline: float | None) -> float | None:
        time.sleep(0.3)  # the model's build, as it ends
        out = real(time_limit_s, deadline)
        seen.append(-1.0 if out is None else out)
        return out

    monkeypatch.setattr(pulp_backend, "solver_limit", spy)
    monkeypatch.setattr(cpsat_backend, "solver_limit", spy)
    solve = cpsat_backend.solve_cpsat if backend == "cpsat" else lambda *a: solve_pulp(a[0], backend, *a[1:])
    deadline = time.perf_counter() + 1.5
    out = solve(_model(), 60.0, 0.01, None, None, deadline)
    assert 0.0 < seen[-1] <= limits.limit_within(1.5 - 0.3)
    assert out.backend == backend
    t0 = time.perf_counter()
    out = solve(_model(), 60.0, 0.01, None, None, time.perf_counter() + 0.2)
    assert seen[-1] == -1.0 and out.decisions is None and "no time left" in out.message
    assert time.perf_counter() - t0 < 1.0
    assert limits.solver_limit(5.0, None) == 5.0


def test_a_model_built_too_late_to_hand_over_is_not_handed_over(monkeypatch: pytest.MonkeyPatch) -> None:
    # The hand-over takes up to SETUP_PER_BUILD times the build: where that would pass the deadline, the backend is
    # not called and the outcome says why (a 100-layer chain at 30%, 10 s: built with 0.35 s left, its hand-over
    # ran 1.1 s past the deadline).
    import time

    from memsched.optimizer.flow import backends
    from memsched.optimizer.ilp.limits import SETUP_PER_BUILD, worth_handing_over
    from memsched.options import SolveOptions, SolveResources, SolverName

    called: list[str] = []
    entry = backends.BACKENDS[SolverName.CBC]
    monkeypatch.setitem(
        backends.BACKENDS, SolverName.CBC, backends.Backend(lambda *a: called.append("solve"), entry.export, True)
    )
    trace = make_trace(6, 1)
    budget = min_feasible_budget(trace) * 2
    out, _ = backends.run_backend(
        trace, budget, SolveOptions(), SolverName.CBC, [], time.perf_counter() + 0.01, SolveResources()
    )
    assert not called and out.decisions is None and "no time left" in out.message
    assert worth_handing_over(0.1, 0.1 * SETUP_PER_BUILD + 1.0)
    assert not worth_handing_over(1.0, SETUP_PER_BUILD * 1.0 + 0.1)
