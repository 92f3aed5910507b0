"""The greedy heuristic: feasible for every feasible budget, valid schedules, and it beats doing nothing."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memsched.optimizer.budget import budget_between, min_feasible_budget
from memsched.optimizer.decisions import offload_all
from memsched.optimizer.heuristic import fix_prefetch_order, heuristic
from memsched.optimizer.simulate import simulate
from memsched.optimizer.synthetic import make_trace


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 60), seed=st.integers(0, 10**6), dag=st.booleans(), frac=st.floats(0.0, 1.0))
def test_feasible_whenever_the_budget_is(n: int, seed: int, dag: bool, frac: float) -> None:
    trace = make_trace(n, seed, dag=dag)
    budget = budget_between(trace, frac)
    result = heuristic(trace, budget)
    again = simulate(trace, result.decisions, budget, with_events=False)  # timing is fully set
    assert again.feasible and again.peak_bytes <= budget
    assert again.overhead_s == pytest.approx(result.sim.overhead_s)


def test_large_trace_at_the_minimum_budget() -> None:
    trace = make_trace(2000, 5, dag=True)
    budget = min_feasible_budget(trace)
    assert heuristic(trace, budget).sim.feasible


def test_fix_prefetch_order_only_lowers() -> None:
    sizes = [[1], [2], [3], [4]]
    trace = make_trace(4, 1)
    trace = trace.model_copy(
        update={
            "layers": [
                layer.model_copy(update={"saved_bytes": sum(t), "saved_tensor_bytes": t})
                for layer, t in zip(trace.layers, sizes)
            ]
        }
    )
    decisions = [offload_all(trace, i, done_by=i, prefetch_at=3) for i in range(4)]
    decisions[2] = offload_all(trace, 2, done_by=2, prefetch_at=2)
    fixed = fix_prefetch_order(decisions)
    assert [d.prefetch_at for d in fixed] == [2, 2, 2, 3]
