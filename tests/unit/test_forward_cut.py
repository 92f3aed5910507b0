"""A recomputed layer's forward runs under the checkpoint, which saves nothing for the backward, so its stage F_i
holds less than a kept layer's: its cut, fitted to the tracer's checkpoint-all step (simulate.forward_cuts, from
Layer.checkpointed_forward_bytes). Before this rule every pricer charged F_i the layer's
whole saved bytes: ResNet-50's sqrt-segments plan measured 18.4 MiB (7% of its activations above static) below
the prediction at F0, the BatchNorm CNN's plans 3.97 MiB (5-6% of the whole step). The simulator, fastsim, both
DP sweeps, the future bound and the MILP (rows and knapsack cuts) price it alike, and the smallest feasible
budget stays exact."""

from __future__ import annotations

import random

import pytest

from helpers import tiny_trace
from helpers.pricing import (
    assert_brute_force_dp_and_milp_agree,
    assert_fifo_sweep_equals_the_milp,
    cpu_trace,
    keep_recompute_plans,
)
from memsched.optimizer.baselines import checkpoint_all
from memsched.optimizer.budget import budget_between, min_feasible_budget
from memsched.optimizer.decisions import KEEP, recompute
from memsched.optimizer.simulate import forward_cuts, forward_stage_memory, simulate
from memsched.optimizer.synthetic import make_trace
from memsched.schema import Trace


def _set_cuts(tr: Trace, cuts: list[int | None]) -> Trace:
    """Measurements (Layer.checkpointed_forward_bytes) that fit to these cuts (None: not measured)."""
    uncut = forward_stage_memory(tr, checkpoint_all(tr), cuts=[0] * tr.n)
    for layer, cut, charged in zip(tr.layers, cuts, uncut, strict=True):
        layer.checkpointed_forward_bytes = None if cut is None else charged - cut
    assert forward_cuts(tr) == [c or 0 for c in cuts]
    return tr


def _with_cuts(tr: Trace, seed: int) -> Trace:
    rng = random.Random(seed)
    return _set_cuts(tr, [rng.choice([None, x.saved_bytes // 3, x.saved_bytes]) for x in tr.layers])


def test_only_a_recomputed_layers_forward_stage_holds_less() -> None:
    tr = tiny_trace([1, 1, 1], [1, 1, 1], [1000, 800, 600], output=[300, 200, 100], inputs=[0, 300, 200])
    plans = ([KEEP, recompute(group=1), KEEP], [KEEP, KEEP, KEEP])
    before = [simulate(tr, p).stage_bytes for p in plans]
    _set_cuts(tr, [None, 500, None])
    after = [simulate(tr, p).stage_bytes for p in plans]
    # Stages F0 F1 F2 B2 B1 B0: the recomputed layer 1's F1 only; keep-all not at all.
    assert [a - b for a, b in zip(before[0], after[0], strict=True)] == [0, 500, 0, 0, 0, 0]
    assert before[1] == after[1]


def test_the_cut_is_what_checkpoint_all_measured_below_the_charge_clamped_to_the_saved_bytes() -> None:
    tr = tiny_trace([1, 1], [1, 1], [1000, 800], output=[300, 200], inputs=[0, 300])
    uncut = forward_stage_memory(tr, checkpoint_all(tr), cuts=[0, 0])
    tr.layers[0].checkpointed_forward_bytes = uncut[0] - 400  # 400 B below what the model charges
    tr.layers[1].checkpointed_forward_bytes = uncut[1] + 50  # above it: no cut (the charge stands)
    assert forward_cuts(tr) == [400, 0]
    tr.layers[0].checkpointed_forward_bytes = 0  # far below: at most the saved bytes
    assert forward_cuts(tr) == [1000, 0]
    # checkpoint-all's forward stages then come out as measured, within the clamp
    tr.layers[0].checkpointed_forward_bytes = uncut[0] - 400
    assert forward_stage_memory(tr, checkpoint_all(tr))[0] == tr.layers[0].checkpointed_forward_bytes


@pytest.mark.parametrize("seed", range(6))
def test_dp_and_milp_price_the_cut_like_the_simulator(seed: int) -> None:
    assert_brute_force_dp_and_milp_agree(_with_cuts(cpu_trace(3 + seed % 3, seed), seed))


@pytest.mark.parametrize("seed", range(6))
def test_fifo_sweep_equals_the_milp_with_cuts(seed: int) -> None:
    rng = random.Random(seed)
    tr = _with_cuts(make_trace(rng.randint(2, 7), seed, dag=rng.random() < 0.5, copy_latency_s=0.0), seed)
    for frac in (0.05, 0.2, 0.4):
        assert_fifo_sweep_equals_the_milp(tr, budget_between(tr, frac))


@pytest.mark.parametrize("seed", range(8))
def test_the_smallest_feasible_budget_stays_below_every_plan(seed: int) -> None:
    tr = _with_cuts(cpu_trace(4, 20 + seed), seed)
    floor = min_feasible_budget(tr)
    assert all(simulate(tr, ds, with_events=False).peak_bytes >= floor for ds in keep_recompute_plans(tr.n))
