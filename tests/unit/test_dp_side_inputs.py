"""The exact DP prices the side inputs a recompute segment's checkpoint keeps (Layer.side_input_bytes: masks,
rotary tables) as the simulator does: from the loss point through the backward of the segment's first layer
(simulate.side_input_hold). Before, the DP left them out; on a 16-layer Llama traced on the CPU (17,408 bytes
read by every layer) its cheapest plans went over three budgets of the sweep by them, and those points ended at
3%, 7.9% and 50% gaps; a 4-layer nn.TransformerEncoder at 23.6%.

Checked against brute force over every plan of keep, recompute and offload (any tensor subset) on serial copies,
where the fluid sweep is exact: with the same side inputs on every layer that reads any (a decoder's), its optimum
is the best plan's and its decoded plan fits; with different ones it charges the least, so it stays a bound."""

from __future__ import annotations

import random

import pytest

from helpers.pricing import assert_fluid_sweep_is_the_best_plan
from memsched.optimizer.synthetic import make_trace
from memsched.schema import Trace


def _side_trace(n: int, seed: int, same: bool) -> Trace:
    """make_trace's layers on serial copies, some reading side inputs of 5-40% of a layer's saved bytes: the same
    bytes for all (`same`), or each its own."""
    rng = random.Random(seed)
    doc = make_trace(n, seed, dag=seed % 3 == 0, copy_latency_s=0.0).model_dump()
    doc["device"]["concurrent_copies"] = False
    if seed % 2:
        doc["device"]["name"] = "cpu (synthetic)"  # each segment also stashes the CPU's RNG state
    typical = sum(x["saved_bytes"] for x in doc["layers"]) // n
    shared = int(typical * rng.uniform(0.05, 0.4))
    for layer in doc["layers"]:
        if rng.random() < 0.8:
            layer["side_input_bytes"] = shared if same else int(typical * rng.uniform(0.05, 0.4))
        if seed % 4 == 1:  # BatchNorm-like snapshots beside them
            layer["changed_buffer_bytes"] = int(layer["saved_bytes"] * rng.uniform(0.02, 0.25))
    return Trace.model_validate(doc)


@pytest.mark.parametrize("same", [True, False])
@pytest.mark.parametrize("seed", range(12))
def test_the_fluid_sweep_prices_side_inputs_as_the_simulator(seed: int, same: bool) -> None:
    # Different side inputs per layer: the sweep charges the least of them, a bound; the same: exact.
    assert_fluid_sweep_is_the_best_plan(_side_trace(3 + seed % 3, seed, same), exact=same)
