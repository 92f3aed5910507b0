from __future__ import annotations

import math

import pytest

from helpers import tiny_trace
from memsched.errors import InfeasibleBudgetError
from memsched.optimizer.baselines import BASELINES, best_baseline, evaluate_baselines, sqrt_segments
from memsched.optimizer.budget import check_budget_feasible, min_feasible_budget
from memsched.optimizer.simulate import simulate
from memsched.schema import Action


def chain(n=9):
    return tiny_trace([1.0] * n, [2.0] * n, [100] * n, output=[10] * n, inputs=[0] + [10] * (n - 1), static=50)


def test_every_baseline_simulates():
    tr = chain()
    results = {r.policy: r for r in evaluate_baselines(tr, 10**9)}
    assert set(results) == set(BASELINES)
    assert results["keep-all"].sim.overhead_s == 0
    assert results["checkpoint-all"].sim.recompute_s == pytest.approx(9.0)
    # sqrt(9) = 3 segments of 3; the last is not checkpointed: 6 layers recomputed.
    assert results["sqrt-segments"].sim.recompute_s == pytest.approx(6.0)
    assert results["offload-all-sync"].sim.stall_s > results["offload-all-overlapped"].sim.stall_s


def test_sqrt_segments_groups():
    d = sqrt_segments(chain(9))
    assert [x.action for x in d] == [Action.RECOMPUTE] * 6 + [Action.KEEP] * 3
    assert [x.group for x in d[:6]] == [0, 0, 0, 3, 3, 3]


def test_min_feasible_budget_is_exact_and_reported():
    tr = chain()
    m = min_feasible_budget(tr)
    # Nothing can do better than each layer's own stages plus transients: F_i 100 + 10, B_i 100 + 20.
    assert m == 50 + 120
    check_budget_feasible(tr, m)
    with pytest.raises(InfeasibleBudgetError) as e:
        best_baseline(tr, m - 1)
    assert e.value.min_feasible_bytes == m
    assert simulate(tr, BASELINES["offload-all-sync"](tr), m).feasible


def test_best_baseline_is_cheapest_feasible():
    tr = chain()
    budget = min_feasible_budget(tr) + 500
    s = best_baseline(tr, budget)
    feasible = [r for r in evaluate_baselines(tr, budget) if r.feasible]
    assert s.prediction.overhead_s == min(r.sim.overhead_s for r in feasible)
    assert s.prediction.peak_bytes <= budget
    assert not math.isnan(s.prediction.overhead_pct)
