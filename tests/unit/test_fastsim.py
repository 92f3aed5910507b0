"""The compiled evaluator the local search uses equals the simulator: same overhead (to the float's rounding)
and the same bytes over budget, on random plans of random chains and DAGs, with serial and concurrent copies,
copy latency, and budgets from very tight (much over budget) to loose."""

from __future__ import annotations

import random

import numpy as np
import pytest

from memsched.optimizer.budget import budget_between
from memsched.optimizer.decisions import KEEP, Decision, offload_subset, recompute
from memsched.optimizer.fastsim import KIND_CONTINUE, KIND_KEEP, KIND_OFFLOAD, KIND_START, FastSim
from memsched.optimizer.simulate import default_timing, simulate
from memsched.optimizer.synthetic import make_trace
from memsched.schema import RerunOverhead, Trace


def _random_plan(trace: Trace, rng: random.Random) -> tuple[np.ndarray, np.ndarray, list[Decision]]:
    """A random plan as FastSim's arrays and as the decisions the local search builds for the same genes."""
    kind = np.zeros(trace.n, dtype=np.int64)
    nbytes = np.zeros(trace.n, dtype=np.int64)
    decisions: list[Decision] = []
    start = -1
    for i, layer in enumerate(trace.layers):
        pos = [q for q, b in enumerate(layer.tensors) if b > 0]
        choice = rng.choice(["K", "S", "R", "O"] if pos and i < trace.n - 1 else ["K", "S", "R"])
        if choice == "K":
            decisions.append(KEEP)
            start = -1
        elif choice == "O":
            subset = tuple(sorted(rng.sample(pos, rng.randint(1, len(pos)))))
            d = offload_subset(trace, i, subset)
            kind[i], nbytes[i] = KIND_OFFLOAD, d.offload_bytes
            decisions.append(d)
            start = -1
        else:
            kind[i] = KIND_START if choice == "S" else KIND_CONTINUE
            if choice == "S" or start < 0:
                start = i
            decisions.append(recompute(group=start))
    assert KIND_KEEP == 0
    return kind, nbytes, decisions


@pytest.mark.parametrize("dag", [False, True])
@pytest.mark.parametrize("serial", [False, True])
def test_fastsim_equals_the_simulator(dag: bool, serial: bool) -> None:
    rng = random.Random(7)
    for seed in range(12):
        trace = make_trace(rng.randint(1, 40), seed, dag=dag, copy_latency_s=rng.choice([0.0, 2e-5]))
        trace.device.concurrent_copies = not serial
        if seed % 2:  # measured on the CPU: each recompute segment holds the RNG state it stashes
            trace.device.name = "cpu (synthetic)"
        if seed % 3 == 0:  # a measured peak above the modelled one: unattributed bytes at the loss
            trace.baseline.peak_bytes = trace.static.total + trace.n * 64 * 2**20
            trace.baseline.step_s *= 1.1  # and time outside the layers
        if seed % 4 == 1:  # masks / rotary tables the step makes, read by some layers; bytes saved twice
            for layer in trace.layers:
                layer.side_input_bytes = rng.choice([None, 0, 4096, 2**20])
                layer.shared_input_bytes = rng.choice([None, 0, 2**16])
                layer.changed_buffer_bytes = rng.choice([None, 0, 144, 2**12])
                layer.ctx_held_bytes = rng.choice([None, 0, 2**16])  # kept on a ctx: made again in B_b
            # the recompute machinery's measured time, per segment and per re-run layer
            trace.rerun_overhead = RerunOverhead(per_segment_s=rng.uniform(0, 1e-3), per_layer_s=rng.uniform(0, 5e-4))
        if seed % 3 == 1:  # layers whose own saved tensors hold all or part of their output (ResNet's last ReLU)
            for layer in trace.layers:
                cover = min(layer.output_bytes, layer.saved_bytes)
                layer.output_saved_bytes = rng.choice([None, cover, cover // 2])
                layer.checkpointed_forward_bytes = rng.choice([None, 0, layer.saved_bytes // 2, 2**40])
        if seed % 5 in (1, 2):  # layers that save their inputs as is (a convolution's, a norm's)
            for layer in trace.layers:
                layer.input_saved_bytes = rng.choice([None, min(layer.input_bytes, layer.saved_bytes)])
        if seed % 3 == 1 and seed % 2:  # the model's code holding those outputs past their readers, or to the loss
            for j, layer in enumerate(trace.layers):
                layer.output_held_until = rng.choice([None, min(j + 2, trace.n), trace.n])
        for frac in (0.0, 0.1, 0.4, 1.0):
            budget = budget_between(trace, frac)
            fast = FastSim(trace, budget)
            for _ in range(15):
                kind, nbytes, decisions = _random_plan(trace, rng)
                sim = simulate(trace, default_timing(trace, decisions, budget), budget, with_events=False)
                limit = budget - trace.static.total
                excess = sum(b - limit for b in sim.stage_bytes if b > limit)
                overhead, over = fast(kind, nbytes)
                assert over == excess
                assert overhead == pytest.approx(sim.overhead_s, rel=1e-12, abs=1e-15)
