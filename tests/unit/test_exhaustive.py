"""Every keep / recompute plan of a short trace, priced (optimizer/exhaustive.py): the plan count, the optimum
against a brute force through `simulate` itself, and the solve's proof (bound = answer) under every memory rule,
side inputs among them (the DP leaves those out: the case that left a 4-layer trace at a 23.6% gap)."""

from __future__ import annotations

import random

import pytest

from helpers.pricing import best_overhead, keep_recompute_plans
from memsched.errors import InfeasibleBudgetError
from memsched.optimizer import exhaustive
from memsched.optimizer.actions import recompute_baselines
from memsched.optimizer.budget import budget_between, keepall_activation_peak
from memsched.optimizer.solve import solve
from memsched.optimizer.synthetic import make_trace
from memsched.options import SolveOptions
from memsched.schema import Action, SolverStatus, Trace

KEEP_RECOMPUTE = frozenset({Action.KEEP, Action.RECOMPUTE})


def _with_rules(trace: Trace, rng: random.Random) -> Trace:
    """Side inputs, saved-twice storages, changed buffers, saved inputs and outputs, code that saves between two
    layers, and the CPU's stashed RNG state, at random."""
    if rng.random() < 0.5:
        trace.device.name = "cpu (synthetic)"  # each recompute segment holds the RNG state it stashes
    for layer in trace.layers:
        layer.side_input_bytes = rng.choice([None, 4096, 2**20])
        layer.shared_input_bytes = rng.choice([None, 2**16])
        layer.changed_buffer_bytes = rng.choice([None, 144])
        layer.input_saved_bytes = rng.choice([None, min(layer.input_bytes, layer.saved_bytes)])
        layer.output_saved_bytes = rng.choice([None, min(layer.output_bytes, layer.saved_bytes)])
    for layer in trace.layers[:-1]:
        layer.code_after_saves = rng.random() < 0.2
    return trace


def _brute_force(trace: Trace, budget: int) -> float | None:
    """The least overhead of any keep / recompute plan that fits, each simulated by `simulate` itself."""
    return best_overhead(trace, budget, keep_recompute_plans(trace.n))


@pytest.mark.parametrize("allowed", [KEEP_RECOMPUTE, frozenset({Action.RECOMPUTE}), frozenset({Action.KEEP})])
def test_the_count_is_the_plans_enumerated(allowed: frozenset[Action]) -> None:
    rng = random.Random(3)
    for seed in range(6):
        trace = _with_rules(make_trace(rng.randint(1, 9), seed, dag=seed % 2 == 0), rng)
        kinds = sum(1 for _ in exhaustive._kinds(trace, allowed))
        assert exhaustive.plan_count(trace, allowed) == kinds
    # Without breaks: the Fibonacci numbers F(2n + 1) with keep and recompute.
    counts = [exhaustive.plan_count(make_trace(n, 1), KEEP_RECOMPUTE) for n in range(1, 8)]
    assert counts == [2, 5, 13, 34, 89, 233, 610]
    assert not exhaustive.applies(make_trace(12, 1), KEEP_RECOMPUTE)  # 75,025 plans
    assert not exhaustive.applies(make_trace(4, 1), frozenset(Action))  # offload: timing, no proof


@pytest.mark.parametrize("seed", range(10))
def test_the_enumeration_is_the_brute_force_optimum_and_the_solve_proves_it_exactly(seed: int) -> None:
    rng = random.Random(seed)
    trace = _with_rules(make_trace(rng.randint(3, 7), seed, dag=seed % 2 == 0), rng)
    # From below the best recompute baseline's peak (where only the DP settles a budget) to keep-all's.
    low = recompute_baselines(trace, KEEP_RECOMPUTE)[0].peak_bytes
    high = trace.static.total + keepall_activation_peak(trace)
    for frac in (-0.1, 0.0, 0.1, 0.3, 0.6):
        budget = low + int(frac * (high - low))
        best = _brute_force(trace, budget)
        out = exhaustive.enumerate_plans(trace, budget, KEEP_RECOMPUTE, float("inf"))
        assert out.finished and out.plans == exhaustive.plan_count(trace, KEEP_RECOMPUTE)
        if best is None:
            assert out.best is None
            with pytest.raises(InfeasibleBudgetError):
                solve(trace, budget, SolveOptions(actions=[Action.KEEP, Action.RECOMPUTE], time_limit_s=5.0))
            continue
        assert out.best is not None and out.best.feasible
        assert out.best.overhead_s == pytest.approx(best, rel=1e-12, abs=1e-15)
        res = solve(trace, budget, SolveOptions(actions=[Action.KEEP, Action.RECOMPUTE], time_limit_s=5.0))
        assert res.prediction.overhead_s == pytest.approx(best, rel=1e-12, abs=1e-15)
        if best > 0.0:
            assert res.solver.status == SolverStatus.OPTIMAL
            assert res.solver.best_bound_s == pytest.approx(best, rel=1e-12, abs=1e-15), res.solver.details
            assert any("from exhaustive" in d for d in res.solver.details), res.solver.details


def test_a_solve_with_offload_is_not_enumerated() -> None:
    trace = make_trace(4, 2)
    res = solve(trace, budget_between(trace, 0.3), SolveOptions(time_limit_s=5.0))
    assert not any("exhaustive" in d for d in res.solver.details), res.solver.details
