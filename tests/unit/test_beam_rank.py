"""How the fluid beam ranks the labels it keeps (optimizer/dp/sweep.py, BeamRank): by the proving sweeps' lower
bound on what is to come (BOUND), or with the backlogs charged as if they drained now (DRAINED). Both are searches:
their plans are decoded and simulated, so each answer is a real plan; the solve's beam phase runs both where
labels carry backlogs."""

from __future__ import annotations

import random
import time

import pytest
from test_dp import _random_trace, exact_optimum

from memsched.optimizer.budget import budget_between, keepall_activation_peak
from memsched.optimizer.dp import BeamRank, beam_search, build_problem
from memsched.optimizer.dp.sweep import SweepConfig, run_sweep
from memsched.optimizer.synthetic import make_trace

FAR = time.perf_counter() + 10**6  # a deadline that never comes


def test_the_bound_ranking_keeps_the_plans_that_overlap_their_copies() -> None:
    # The synthetic 200-layer chain at 20% of its keep-all activations: charging every backlog as a stall steers
    # the 24-label beam to recompute early and pay for it later (0.21 s); ranked by the bound to come, which lets
    # later compute drain the copies, its plan costs 0.040 s (the solve's answer at 10 s: 0.0284 s).
    trace = make_trace(200, 1)
    budget = trace.static.total + round(keepall_activation_peak(trace) * 0.2)
    p = build_problem(trace, budget)
    drained = beam_search(trace, budget, FAR, width=24, problem=p, rank=BeamRank.DRAINED)
    bound = beam_search(trace, budget, FAR, width=24, problem=p, rank=BeamRank.BOUND)
    assert drained.schedules and bound.schedules
    assert bound.schedules[0].overhead_s < 0.5 * drained.schedules[0].overhead_s
    assert all(sim.feasible for sim in bound.schedules)


@pytest.mark.parametrize("seed", range(8))
def test_on_serial_copies_the_two_rankings_are_one(seed: int) -> None:
    # Copies on the compute thread leave no backlog, so both scores are the cost plus the future-cost table.
    rng = random.Random(seed)
    trace = _random_trace(rng.randint(4, 9), seed, rng.random() < 0.5, serial=True, latency=False)
    budget = budget_between(trace, rng.uniform(0.0, 0.8))
    p = build_problem(trace, budget)
    plans = [
        [sim.decisions for sim in beam_search(trace, budget, FAR, width=4, problem=p, rank=rank).schedules]
        for rank in BeamRank
    ]
    assert plans[0] == plans[1]


@pytest.mark.parametrize("seed", range(12))
def test_a_bound_ranked_beam_never_beats_the_optimum_and_wide_enough_finds_the_fluid_one(seed: int) -> None:
    rng = random.Random(seed)
    latency = rng.random() < 0.5
    trace = _random_trace(rng.randint(3, 7), seed, rng.random() < 0.5, serial=False, latency=latency)
    budget = budget_between(trace, rng.uniform(0.0, 0.8))
    p = build_problem(trace, budget)
    fluid = run_sweep(p, SweepConfig(deadline=FAR))  # no beam, no threshold: the fluid optimum
    assert fluid.finished and fluid.finals
    best = exact_optimum(trace, budget)
    for width in (2, 10**6):
        out = beam_search(trace, budget, FAR, width=width, problem=p, rank=BeamRank.BOUND)
        assert out.schedules, "a beam keeps a label in every retained-bytes run: some plan finishes"
        assert out.schedules[0].overhead_s >= best - 1e-9
    if not latency:  # (with latency the beam drains at the link's own bandwidth: dp.beam_search)
        assert out.swept_s == pytest.approx(fluid.finals[0][0], abs=1e-12)
