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


def test_a_model_that_cannot_be_handed_over_in_time_is_not_handed_over(monkeypatch: pytest.MonkeyPatch) -> None:
    # The hand-over takes up to the backend's setup_per_build times the build: where that would pass the deadline,
    # the backend is not called and the outcome says why (a 100-layer DAG at 40%, 10 s: built with 3.3 s left,
    # its hand-over into CBC took 3.5 s).
    import time

    from memsched.optimizer.flow import backends
    from memsched.optimizer.ilp.limits import worth_handing_over
    from memsched.options import SolveOptions, SolveResources, SolverName

    called: list[str] = []
    entry = backends.BACKENDS[SolverName.CBC]
    monkeypatch.setitem(
        backends.BACKENDS,
        SolverName.CBC,
        backends.Backend(lambda *a: called.append("solve"), entry.export, True, entry.setup_per_build),
    )
    trace = make_trace(6, 1)
    budget = min_feasible_budget(trace) * 2
    real_build = backends.build_model

    def build(*a: object, **k: object) -> object:
        called.append("build")
        time.sleep(0.5)  # a slow build: its hand-over would take 4 x 0.5 s
        return real_build(*a, **k)  # type: ignore[arg-type]

    monkeypatch.setattr(backends, "build_model", build)
    out, _ = backends.run_backend(
        trace, budget, SolveOptions(), SolverName.CBC, [], time.perf_counter() + 0.01, SolveResources()
    )
    # Its predicted build alone leaves no time: not even built.
    assert not called and out.decisions is None and "cbc: not built" in out.message
    # Predicted to build in no time, it is built, and then found too late to hand over.
    monkeypatch.setattr(backends, "predicted_build_s", lambda *a: 0.0)
    out, _ = backends.run_backend(
        trace, budget, SolveOptions(), SolverName.CBC, [], time.perf_counter() + 1.0, SolveResources()
    )
    assert called == ["build"] and out.decisions is None and "no time left" in out.message
    assert worth_handing_over(0.1, 0.1 * 4.0 + 1.0, 4.0)
    assert not worth_handing_over(1.0, 4.0 * 1.0 + 0.1, 4.0)
    assert worth_handing_over(1.0, 4.0 * 1.0 + 0.1, 1.2)


def test_cbc_files_whose_writing_would_pass_the_deadline_are_not_written(monkeypatch: pytest.MonkeyPatch) -> None:
    # Writing CBC's MPS file takes up to MPS_PER_PROBLEM times PuLP's problem: where that leaves CBC no search,
    # neither the files nor CBC run (a 100-layer DAG: PuLP's problem 1.4 s, then its MPS 1.9 s past the deadline).
    import time

    from memsched.optimizer.ilp import limits, pulp_backend

    real = pulp_backend.to_pulp

    def slow_to_pulp(m: object) -> object:
        time.sleep(0.5)
        return real(m)  # type: ignore[arg-type]

    ran: list[float] = []
    monkeypatch.setattr(pulp_backend, "to_pulp", slow_to_pulp)
    monkeypatch.setattr(pulp_backend, "run_cbc", lambda prob, limit, *a: ran.append(limit))
    # After the problem (0.5 s), 1.2 s are left: enough to search, not after 2 x 0.5 s of writing.
    assert limits.solver_limit(60.0, time.perf_counter() + 1.2) is not None
    assert limits.solver_limit(60.0, time.perf_counter() + 1.2 - limits.MPS_PER_PROBLEM * 0.5) is None
    t0 = time.perf_counter()
    out = solve_pulp(_model(), "cbc", 60.0, 0.01, None, None, t0 + 1.7)
    assert not ran and out.decisions is None and "no time left" in out.message
    assert time.perf_counter() - t0 < 1.7
