"""Plans restricted to some actions (SolveOptions.actions): brute force agrees with the solver's optimum and with
the smallest budget it reports; the CPU default plans keep and recompute only, and says so."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers.pricing import best_timing_overhead
from memsched.errors import InfeasibleBudgetError, MemschedError
from memsched.optimizer.budget import budget_between
from memsched.optimizer.decisions import KEEP, Decision, offload_all, recompute
from memsched.optimizer.simulate import SimResult, simulate
from memsched.optimizer.solve import solve
from memsched.optimizer.synthetic import make_trace
from memsched.options import SolveOptions
from memsched.schema import Action, SolverStatus, Trace

KEEP_RECOMPUTE = SolveOptions(actions=[Action.KEEP, Action.RECOMPUTE], gap=0.0, time_limit_s=30)


def recompute_only_plans(trace: Trace) -> list[SimResult]:
    """Every keep / recompute plan (each layer: keep, start a segment, or continue the one before), simulated."""
    out = []
    for combo in itertools.product(range(3), repeat=trace.n):
        if combo[0] == 2 or any(c == 2 and combo[i - 1] == 0 for i, c in enumerate(combo) if i):
            continue  # 'continue' needs a segment to continue
        dec: list[Decision] = []
        start = -1
        for i, c in enumerate(combo):
            if c == 0:
                dec.append(KEEP)
                continue
            start = i if c == 1 else start
            dec.append(recompute(group=start))
        out.append(simulate(trace, dec, with_events=False))
    return out


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(2, 6), seed=st.integers(0, 10**6), dag=st.booleans(), frac=st.floats(0.0, 1.0))
def test_keep_recompute_optimum_and_smallest_budget_match_brute_force(
    n: int, seed: int, dag: bool, frac: float
) -> None:
    trace = make_trace(n, seed, dag=dag)
    plans = recompute_only_plans(trace)
    smallest = min(p.peak_bytes for p in plans)
    keepall = plans[0].peak_bytes  # all zeros: keep-all
    # Below the smallest peak of any keep / recompute plan: infeasible, and the minimum is exactly that peak.
    with pytest.raises(InfeasibleBudgetError) as e:
        solve(trace, smallest - 1, KEEP_RECOMPUTE)
    assert e.value.min_feasible_bytes == smallest and e.value.proven
    budget = smallest + int((keepall - smallest) * frac)
    schedule = solve(trace, budget, KEEP_RECOMPUTE)
    sim = simulate(trace, schedule)
    assert sim.feasible and all(a.action != Action.OFFLOAD for a in schedule.actions)
    best = min(p.step_s for p in plans if p.peak_bytes <= budget) - trace.baseline.step_s
    assert sim.overhead_s == pytest.approx(max(best, 0.0), rel=1e-9, abs=1e-12)
    assert schedule.solver.status == SolverStatus.OPTIMAL


def test_a_cpu_trace_plans_keep_and_recompute_by_default_and_says_so() -> None:
    trace = make_trace(10, 4)
    trace.device.name = "cpu (x86_64, 2 cores, 1 torch thread)"
    plans = recompute_only_plans(trace)
    budget = min(p.peak_bytes for p in plans)
    schedule = solve(trace, budget, SolveOptions(time_limit_s=10))
    assert {a.action for a in schedule.actions} <= {Action.KEEP, Action.RECOMPUTE}
    assert (
        "measured on the CPU" in schedule.solver.message
        and "--actions keep,offload,recompute" in schedule.solver.message
    )
    # Asked for explicitly, offload is planned there too (an emulation of the GPU path), and nothing is said.
    allowed = SolveOptions(time_limit_s=10, actions=["keep", "offload", "recompute"])
    emulated = solve(trace, budget, allowed)
    assert "measured on the CPU" not in emulated.solver.message
    assert emulated.prediction.overhead_s <= schedule.prediction.overhead_s + 1e-12


def test_keep_offload_plans_never_recompute_and_a_milp_cannot_plan_them() -> None:
    trace = make_trace(10, 5)
    no_recompute = SolveOptions(time_limit_s=5, actions=["keep", "offload"])
    for budget in (trace.static.total + 1, None):
        if budget is None:
            from memsched.optimizer.budget import budget_between

            budget = budget_between(trace, 0.1)
            schedule = solve(trace, budget, no_recompute)
            assert all(a.action != Action.RECOMPUTE for a in schedule.actions)
            assert simulate(trace, schedule).feasible
        else:
            with pytest.raises(InfeasibleBudgetError):
                solve(trace, budget, no_recompute)
    with pytest.raises(MemschedError, match="use --solver auto or dp"):
        solve(trace, budget, no_recompute.model_copy(update={"solver": "cbc"}))


def test_actions_are_validated_and_keep_old_cache_keys() -> None:
    with pytest.raises(MemschedError, match="must include keep"):
        SolveOptions.from_user(actions=["recompute"])
    with pytest.raises(MemschedError, match="actions"):
        SolveOptions.from_user(actions=["keep", "swap"])
    a = SolveOptions(actions=["recompute", "keep", "keep"])
    assert a.actions == [Action.KEEP, Action.RECOMPUTE] and a == SolveOptions(actions=["keep", "recompute"])
    # Jobs stored before the option existed keep their cache keys: unset, it is not hashed.
    assert "actions" not in SolveOptions().job_fields()
    assert a.job_fields()["actions"] == ["keep", "recompute"]


def keep_offload_optimum(trace: Trace, budget: int) -> float | None:
    """The least overhead of any keep / offload plan of a trace whose layers save one tensor each, over every
    done-by and prefetch-at of every offloaded layer (brute force); None where none fits."""
    found = [
        best_timing_overhead(trace, [offload_all(trace, i) if o else KEEP for i, o in enumerate(offloaded)], budget)
        for offloaded in itertools.product((False, True), repeat=trace.n)
    ]
    return min((x for x in found if x is not None), default=None)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(2, 4),
    seed=st.integers(0, 10**6),
    latency=st.sampled_from([10e-6, 0.5e-3, 2e-3]),
    frac=st.floats(0.0, 0.9),
)
def test_keep_offload_with_stalls_matches_brute_force(n: int, seed: int, latency: float, frac: float) -> None:
    """With copies beside compute and stalls that decide (a slow link, long latency), a plan of keep and offload
    never recomputes, its bound holds and, proven, it is the optimum. (The FIFO searches once emitted recompute
    segments under --actions keep,offload, so they did not run there and left 30% gaps on 3-layer traces.)"""
    trace = make_trace(n, seed, max_tensors=1, bandwidth=2e9, copy_latency_s=latency)
    budget = budget_between(trace, frac)
    best = keep_offload_optimum(trace, budget)
    options = SolveOptions(actions=["keep", "offload"], gap=0.0, time_limit_s=10)
    if best is None:
        with pytest.raises(InfeasibleBudgetError):
            solve(trace, budget, options)
        return
    schedule = solve(trace, budget, options)
    assert all(a.action != Action.RECOMPUTE for a in schedule.actions)
    sim = simulate(trace, schedule)
    assert sim.feasible and sim.overhead_s >= best * (1 - 1e-9) - 1e-12
    assert schedule.solver.best_bound_s is not None and schedule.solver.best_bound_s <= best * (1 + 1e-9) + 1e-12
    assert schedule.solver.status == SolverStatus.OPTIMAL
    assert sim.overhead_s <= best * (1 + 1e-9) + 1e-12
