"""A recompute segment [a..b] re-runs for forward_s of a..b-1 plus recompute_s of b (Layer.rerun_s):
torch.utils.checkpoint's early stop re-runs the last layer only up to its last op that saves a tensor
(issue 25, the time half; docs/cost-model.md, 'What a re-run costs'). The simulator, the compiled simulator,
the DP (sweep and FIFO kernels, future bound) and the MILP price it identically, and brute force agrees."""

from __future__ import annotations

import random

import pytest
from pydantic import ValidationError
from test_fastsim import _random_plan

from helpers import tiny_trace
from helpers.pricing import (
    FAR,
    KEEP_RECOMPUTE,
    assert_brute_force_dp_and_milp_agree,
    assert_fifo_sweep_equals_the_milp,
    cpu_trace,
    keep_recompute_plans,
    milp_optimum,
)
from memsched.optimizer.actions import dp_verdict
from memsched.optimizer.budget import budget_between
from memsched.optimizer.decisions import KEEP, recompute
from memsched.optimizer.dp import exact_search
from memsched.optimizer.fastsim import FastSim
from memsched.optimizer.simulate import default_timing, simulate
from memsched.optimizer.synthetic import make_trace
from memsched.schema import Action, Layer, Trace


def _with_tails(trace: Trace, seed: int) -> Trace:
    """Set recompute_s below forward_s on about two layers in three (the early stop), None elsewhere."""
    rng = random.Random(seed)
    for layer in trace.layers:
        if rng.random() < 2 / 3:
            layer.recompute_s = layer.forward_s * rng.uniform(0.2, 0.95)
    return trace


def test_none_means_forward_and_keeps_every_hash() -> None:
    tr = tiny_trace([1.0, 2.0, 3.0], [1.0, 1.0, 1.0], [10, 10, 10])
    before = tr.content_hash()
    assert [x.rerun_s for x in tr.layers] == [1.0, 2.0, 3.0]
    assert tr.segment_rerun_s(0, 2) == 6.0
    tr.layers[2].recompute_s = 1.5
    assert tr.segment_rerun_s(0, 2) == 4.5 and tr.segment_rerun_s(2, 2) == 1.5
    assert tr.content_hash() != before  # a measured re-run is part of what the trace says
    tr.layers[2].recompute_s = None
    assert tr.content_hash() == before  # at its default the field does not enter the hash
    again = Trace.model_validate_json(tr.model_dump_json())
    assert again.content_hash() == before


def test_a_rerun_longer_than_the_forward_is_refused() -> None:
    with pytest.raises(ValidationError, match="recompute_s = 2 s exceeds forward_s = 1 s"):
        Layer(name="x", forward_s=1.0, backward_s=1.0, saved_bytes=0, recompute_s=2.0)


def test_the_simulator_charges_the_last_layer_its_rerun() -> None:
    tr = tiny_trace([1.0, 2.0, 3.0], [1.0, 1.0, 1.0], [10, 10, 10])
    tr.layers[1].recompute_s = 0.5
    tr.layers[0].recompute_s = 0.25  # inside the segment: re-runs whole
    sim = simulate(tr, [recompute(group=0), recompute(group=0), KEEP])
    assert sim.recompute_s == pytest.approx(1.0 + 0.5)
    reruns = [(e.layer, e.end - e.start) for e in sim.events if e.kind == "recompute"]
    assert reruns == [(0, 1.0), (1, 0.5)]


def test_a_cheaper_tail_changes_the_optimum_as_brute_force_says() -> None:
    # Recomputing layer 0 or layer 1 frees the bytes the budget lacks; layer 1's forward is cheaper, but
    # layer 0 re-runs only 0.5 s of its 1.2 s up to the early stop.
    tr = tiny_trace([1.2, 0.8, 1.0, 0.1, 0.1], [1.0] * 5, [1000, 1000, 1000, 10, 10])
    budget = 2020
    plans = keep_recompute_plans(5)
    for rec, best_plan, best_s in ((None, 1, 0.8), (0.5, 0, 0.5)):
        tr.layers[0].recompute_s = rec
        sims = [simulate(tr, ds, budget, with_events=False) for ds in plans]
        assert min(s.overhead_s for s in sims if s.feasible) == pytest.approx(best_s)
        verdict = dp_verdict(tr, budget, KEEP_RECOMPUTE, FAR)
        assert verdict.sim is not None and verdict.sim.overhead_s == pytest.approx(best_s)
        actions = [d.action for d in verdict.sim.decisions]
        assert actions[best_plan] == Action.RECOMPUTE and actions.count(Action.RECOMPUTE) == 1
        assert milp_optimum(tr, budget) == pytest.approx(best_s, rel=1e-6)
        out = exact_search(tr, budget, FAR, incumbent_s=None, gap=0.0)
        assert out.schedules and out.schedules[0].overhead_s == pytest.approx(best_s)


@pytest.mark.parametrize("seed", range(6))
def test_brute_force_dp_and_milp_agree_with_tails(seed: int) -> None:
    n = 3 + seed % 3
    tr = _with_tails(cpu_trace(n, seed), seed)
    assert_brute_force_dp_and_milp_agree(tr)


@pytest.mark.parametrize("seed", range(12))
def test_fifo_sweep_equals_the_milp_with_tails(seed: int) -> None:
    # Concurrent copies: the FIFO sweep is exact for the simulator's timing.
    rng = random.Random(seed)
    tr = _with_tails(
        make_trace(
            rng.randint(2, 7), seed, dag=rng.random() < 0.5, copy_latency_s=20e-6 if rng.random() < 0.5 else 0.0
        ),
        seed,
    )
    budget = budget_between(tr, rng.uniform(0.0, 0.9))
    opt = assert_fifo_sweep_equals_the_milp(tr, budget)
    # The fluid sweep's bound stays below the optimum (its future bound uses the tails' rates).
    fluid = exact_search(tr, budget, FAR, incumbent_s=None, gap=0.0)
    assert fluid.bound_s is not None and fluid.bound_s <= opt * (1 + 1e-9) + 1e-12


@pytest.mark.parametrize("serial", [False, True])
def test_fastsim_equals_the_simulator_with_tails(serial: bool) -> None:
    rng = random.Random(11)
    for seed in range(10):
        tr = _with_tails(make_trace(rng.randint(1, 30), seed, dag=seed % 2 == 1), seed)
        tr.device.concurrent_copies = not serial
        for frac in (0.0, 0.3, 1.0):
            budget = budget_between(tr, frac)
            fast = FastSim(tr, budget)
            for _ in range(10):
                kind, nbytes, decisions = _random_plan(tr, rng)
                overhead, excess = fast(kind, nbytes)
                sim = simulate(tr, default_timing(tr, decisions, budget), budget, with_events=False)
                assert overhead == pytest.approx(sim.overhead_s, rel=1e-12, abs=1e-15)
                limit = budget - tr.static.total
                assert excess == sum(b - limit for b in sim.stage_bytes if b > limit)
