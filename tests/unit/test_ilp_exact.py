"""(a) exact optima on hand-built tiny traces, worked out by hand; (b) brute force over all whole-layer
assignments (hypothesis); (d) CBC, HiGHS and CP-SAT agree."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import tiny_trace
from memsched.optimizer.budget import budget_between
from memsched.optimizer.decisions import KEEP, offload_all, recompute
from memsched.optimizer.simulate import simulate
from memsched.optimizer.solve import solve_report
from memsched.optimizer.synthetic import make_trace
from memsched.options import SolveOptions
from memsched.schema import Action, SolverStatus, Trace

MB = 10**6
MS = 1e-3


def chain(saved: list[list[int]], bandwidth: float) -> Trace:
    """Layers of 5 ms forward and 10 ms backward, no transients, no copy latency, no static bytes and no time
    outside the layers."""
    return tiny_trace([5 * MS] * len(saved), [10 * MS] * len(saved), saved, bandwidth=bandwidth)


def exact(trace: Trace, budget: int, solver: str = "cbc"):
    report = solve_report(trace, budget, SolveOptions(solver=solver, gap=0.0, time_limit_s=30))
    sim = simulate(trace, report.schedule)
    assert sim.feasible
    return report, sim


def test_hidden_offload_is_free() -> None:
    # Layers save [4 MB], [], [2 MB]; keep-all peaks at 6 MB during F2/B2; budget 5 MB, so layer 0 must be
    # gone at F2 and B2. Copies run at 1 GB/s: 4 MB takes 4 ms. D2H 5..9 ms ends before F1 ends (10 ms),
    # so done-by 1 costs nothing; in backward B2 runs 15..25, the prefetch issued at B1 (25) ends at 29,
    # before B0 starts (35). Optimum: offload layer 0, overhead 0 (recompute would cost 5 ms).
    t = chain([[4 * MB], [], [2 * MB]], bandwidth=1e9)
    report, sim = exact(t, 5 * MB)
    assert sim.overhead_s == pytest.approx(0.0, abs=1e-12)
    assert report.schedule.actions[0].action == Action.OFFLOAD
    assert report.schedule.solver.status == SolverStatus.OPTIMAL


def test_slow_copy_loses_to_recompute() -> None:
    # Same layers, copies at 0.2 GB/s: 4 MB takes 20 ms. Offload: D2H 5..25 ms but it must be done by the
    # end of F1 (10 ms): a 15 ms stall; the prefetch issued at B1 (40 ms) ends at 60 while B0 could start at
    # 50: 10 ms more. Recompute: re-run F0 (5 ms) before B0, memory 4 MB at F0 and B0 only, within 5 MB.
    # Optimum: recompute layer 0, overhead 5 ms.
    t = chain([[4 * MB], [], [2 * MB]], bandwidth=0.2e9)
    report, sim = exact(t, 5 * MB)
    assert sim.overhead_s == pytest.approx(5 * MS, rel=1e-9)
    assert report.schedule.actions[0].action == Action.RECOMPUTE
    assert report.outcome is not None and report.outcome.objective_s == pytest.approx(5 * MS, rel=1e-6)


def test_partial_offload_moves_only_what_is_needed() -> None:
    # Layer 0 saves two tensors, 3 MB and 1 MB; budget 5 MB needs just 1 MB gone at F2/B2. At 0.2 GB/s the
    # 1 MB tensor copies in 5 ms: D2H 5..10 ms, done by the end of F1 (10 ms), no stall; prefetch issued
    # at B1 (25 ms) ends at 30, before B0 (35 ms). Whole-layer offload stalls (20 ms copies), recompute
    # costs 5 ms. Optimum: offload tensor 1 only, overhead 0.
    t = chain([[3 * MB, 1 * MB], [], [2 * MB]], bandwidth=0.2e9)
    report, sim = exact(t, 5 * MB)
    assert sim.overhead_s == pytest.approx(0.0, abs=1e-12)
    off = report.schedule.actions[0].offload
    assert off is not None and off.tensors == [1]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(2, 7),
    seed=st.integers(0, 10**6),
    dag=st.booleans(),
    frac=st.floats(0.0, 0.95),
    serial=st.booleans(),
)
def test_ilp_beats_every_whole_layer_assignment(n: int, seed: int, dag: bool, frac: float, serial: bool) -> None:
    trace = make_trace(n, seed, dag=dag)
    # serial: copies on the compute thread (a CPU trace), so every offload is synchronous.
    trace.device.concurrent_copies = not serial
    budget = budget_between(trace, frac)
    report = solve_report(trace, budget, SolveOptions(solver="cbc", gap=0.0, time_limit_s=60))
    sim = simulate(trace, report.schedule)
    assert sim.feasible and sim.peak_bytes <= budget
    if report.outcome is not None:  # None: keep-all fits
        assert report.outcome.objective_s == pytest.approx(sim.overhead_s, rel=1e-6, abs=1e-9)
        assert report.schedule.solver.status == SolverStatus.OPTIMAL
    for combo in itertools.product(range(3), repeat=n):
        dec = [KEEP if c == 0 else recompute() if c == 1 else offload_all(trace, i) for i, c in enumerate(combo)]
        other = simulate(trace, dec, budget, with_events=False)
        if other.feasible:
            assert sim.overhead_s <= other.overhead_s + 1e-12, combo


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_backends_agree(seed: int) -> None:
    trace = make_trace(6 + seed, seed, dag=seed % 2 == 0)
    budget = budget_between(trace, 0.3)
    values = {}
    for solver in ("cbc", "highs", "cpsat"):
        report = solve_report(trace, budget, SolveOptions(solver=solver, gap=0.0, time_limit_s=60))
        assert report.schedule.solver.status == SolverStatus.OPTIMAL, (solver, report.schedule.solver)
        values[solver] = simulate(trace, report.schedule).overhead_s
    # CP-SAT rounds times to 1 ns, so it may pick a schedule a few ns worse in truth.
    assert values["highs"] == pytest.approx(values["cbc"], rel=1e-6, abs=1e-9)
    assert values["cpsat"] == pytest.approx(values["cbc"], rel=1e-5, abs=1e-8)


@pytest.mark.parametrize(("seed", "dag"), [(1, False), (2, True), (3, False)])
def test_channel_cuts_keep_the_optimum(seed: int, dag: bool) -> None:
    """The cumulative copy-channel cuts (optional, off by default) are valid: with them the exact
    optimum of the full model is unchanged, on every backend path that builds rows (CBC here)."""
    from memsched.optimizer.ilp.model import build_model
    from memsched.optimizer.ilp.pulp_backend import solve_pulp

    trace = make_trace(6 + seed, seed, dag=dag)
    budget = budget_between(trace, 0.3)
    objs = []
    for cuts in (False, True):
        m = build_model(trace, budget, channel_cuts=cuts)
        out = solve_pulp(m, "cbc", 60, 0.0, None)
        assert out.objective_s is not None and out.decisions is not None
        assert simulate(trace, out.decisions, budget).overhead_s == pytest.approx(out.objective_s, rel=1e-6, abs=1e-9)
        objs.append(out.objective_s)
    assert objs[1] == pytest.approx(objs[0], rel=1e-6, abs=1e-9)
