"""A forward-only workspace per layer (issue 25): Layer.forward_workspace_bytes is what F_i needs beyond the
layer model, at most workspace_bytes (the larger of the forward's and the backward's need, still charged at
B_i). None means workspace_bytes. The simulator, the compiled simulator, the DP and the MILP price it
identically, and brute force agrees."""

from __future__ import annotations

import random

import pytest
from pydantic import ValidationError
from test_fastsim import _random_plan

from helpers import tiny_trace
from helpers.pricing import (
    assert_brute_force_dp_and_milp_agree,
    assert_fifo_sweep_equals_the_milp,
    cpu_trace,
)
from memsched.optimizer.budget import budget_between
from memsched.optimizer.decisions import KEEP, recompute
from memsched.optimizer.fastsim import FastSim
from memsched.optimizer.simulate import default_timing, forward_transient, simulate
from memsched.optimizer.synthetic import make_trace
from memsched.schema import Layer, Trace


def _with_forward_workspace(trace: Trace, seed: int) -> Trace:
    """Set forward_workspace_bytes in 0..workspace_bytes on about two layers in three, None elsewhere."""
    rng = random.Random(seed)
    for layer in trace.layers:
        if rng.random() < 2 / 3:
            layer.forward_workspace_bytes = rng.randint(0, layer.workspace_bytes)
    return trace


def _three() -> Trace:
    return tiny_trace(
        [1.0, 1.0, 1.0], [1.0, 1.0, 1.0], [10, 20, 30], output=[1, 2, 3], inputs=[0, 1, 2], workspace=[100, 200, 300]
    )


def test_none_means_workspace_and_keeps_every_hash() -> None:
    tr = _three()
    before = tr.content_hash()
    assert [x.forward_workspace for x in tr.layers] == [100, 200, 300]
    tr.layers[0].forward_workspace_bytes = 40
    assert tr.layers[0].forward_workspace == 40 and forward_transient(tr, 0) == 41
    assert tr.content_hash() != before
    tr.layers[0].forward_workspace_bytes = None
    assert tr.content_hash() == before
    assert Trace.model_validate_json(tr.model_dump_json()).content_hash() == before


def test_a_forward_workspace_above_the_workspace_is_refused() -> None:
    with pytest.raises(ValidationError, match="forward_workspace_bytes = 5 is outside 0..workspace_bytes = 4"):
        Layer(name="x", forward_s=1.0, backward_s=1.0, saved_bytes=0, workspace_bytes=4, forward_workspace_bytes=5)
    with pytest.raises(ValidationError):
        Layer(name="x", forward_s=1.0, backward_s=1.0, saved_bytes=0, workspace_bytes=4, forward_workspace_bytes=-1)


def test_it_lowers_forward_stages_only() -> None:
    tr = _three()
    plans = ([KEEP, KEEP, KEEP], [recompute(group=0), recompute(group=0), KEEP])
    before = [simulate(tr, ds).stage_bytes for ds in plans]
    # Stages F0 F1 F2 B2 B1 B0; keep-all: the saved bytes so far + the transient.
    assert before[0] == [10 + 100 + 1, 30 + 200 + 2, 60 + 300 + 3, 60 + 300 + 3 + 2, 30 + 200 + 2 + 1, 10 + 100 + 1]
    tr.layers[0].forward_workspace_bytes = 40
    tr.layers[2].forward_workspace_bytes = 0
    after = [simulate(tr, ds).stage_bytes for ds in plans]
    assert after[0] == [10 + 40 + 1, 30 + 200 + 2, 60 + 0 + 3, 60 + 300 + 3 + 2, 30 + 200 + 2 + 1, 10 + 100 + 1]
    for b, a in zip(before, after, strict=True):
        assert [x - y for x, y in zip(b, a, strict=True)] == [60, 0, 300, 0, 0, 0]


@pytest.mark.parametrize("serial", [False, True])
def test_fastsim_equals_the_simulator_with_forward_workspace(serial: bool) -> None:
    rng = random.Random(25)
    for seed in range(10):
        tr = _with_forward_workspace(make_trace(rng.randint(1, 30), seed, dag=seed % 2 == 1), seed)
        tr.device.concurrent_copies = not serial
        if seed % 3 == 0:  # unattributed bytes at the loss point
            tr.baseline.peak_bytes = tr.static.total + tr.n * 64 * 2**20
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


@pytest.mark.parametrize("seed", range(6))
def test_brute_force_dp_and_milp_agree_with_forward_workspace(seed: int) -> None:
    n = 3 + seed % 3
    tr = _with_forward_workspace(cpu_trace(n, seed), seed)
    assert any(x.forward_workspace < x.workspace_bytes for x in tr.layers)
    assert_brute_force_dp_and_milp_agree(tr)


@pytest.mark.parametrize("seed", range(8))
def test_fifo_sweep_equals_the_milp_with_forward_workspace(seed: int) -> None:
    rng = random.Random(seed)
    tr = _with_forward_workspace(
        make_trace(
            rng.randint(2, 7), seed, dag=rng.random() < 0.5, copy_latency_s=20e-6 if rng.random() < 0.5 else 0.0
        ),
        seed,
    )
    budget = budget_between(tr, rng.uniform(0.0, 0.9))
    assert_fifo_sweep_equals_the_milp(tr, budget)
