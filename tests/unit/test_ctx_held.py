"""Tensors a layer's forward keeps on a custom autograd Function's ctx (Layer.ctx_held_bytes) are priced where a
recompute makes them again: a segment [a, b]'s re-run holds its layers' ctx bytes in B_b beside the forward's, which
are still held (simulate.rerun_fork_bytes; docs/cost-model.md, 'Tensors kept on a ctx'). Before, nothing priced
them: a 6-block model keeping 1 MiB a block on its ctx measured 16.65 MB at a recompute plan predicted at 14.55 MB,
over its 14.68 MB budget.

Every pricer holds the same bytes: the simulator and its compiled twin, the fluid sweep (exact on serial copies),
the FIFO sweep and the MILP agree with brute force over every plan."""

from __future__ import annotations

import random

import pytest

from helpers.pricing import (
    PRICER_CHECKS,
    assert_a_term_is_priced,
    assert_brute_force_dp_and_milp_agree,
    best_overhead,
    cpu_trace,
    spread_budgets,
)
from memsched.optimizer.decisions import KEEP, recompute
from memsched.optimizer.simulate import stage_memory
from memsched.optimizer.synthetic import make_trace
from memsched.schema import Trace


def _ctx_trace(n: int, seed: int, serial: bool) -> Trace:
    """make_trace's layers, most keeping 5-60% of their saved bytes again on a ctx, so that they decide plans."""
    rng = random.Random(seed)
    doc = make_trace(n, seed, dag=seed % 3 == 0, copy_latency_s=0.0 if serial else 20e-6).model_dump()
    doc["device"]["concurrent_copies"] = not serial
    if seed % 2:
        doc["device"]["name"] = "cpu (synthetic)"  # each segment also stashes and forks the CPU's RNG state
    for layer in doc["layers"]:
        if rng.random() < 0.8:
            layer["ctx_held_bytes"] = int(max(layer["saved_bytes"], 2**20) * rng.uniform(0.05, 0.6))
    return Trace.model_validate(doc)


def test_a_segment_holds_its_layers_ctx_bytes_again_in_its_last_layers_backward() -> None:
    trace = _ctx_trace(4, 1, serial=True)
    doc = trace.model_dump()
    for layer, extra in zip(doc["layers"], (1000, 2000, 4000, 8000), strict=True):
        layer["ctx_held_bytes"] = extra
    with_ctx = Trace.model_validate(doc)
    bare = Trace.model_validate({**doc, "layers": [{**x, "ctx_held_bytes": None} for x in doc["layers"]]})
    plan = [KEEP, recompute(1), recompute(1), KEEP]  # the segment [1, 2]
    got, base = stage_memory(with_ctx, plan), stage_memory(bare, plan)
    last = 2 * trace.n - 1
    # Only B_2 (global stage last - 2), the segment's re-run, holds more: layers 1 and 2's ctx bytes.
    assert [g - b for g, b in zip(got, base, strict=True)] == [0] * (last - 2) + [2000 + 4000] + [0] * 2
    assert stage_memory(with_ctx, [KEEP] * 4) == stage_memory(bare, [KEEP] * 4)  # keep-all: the fit's


@pytest.mark.parametrize("check", PRICER_CHECKS)
@pytest.mark.parametrize("seed", range(5))
def test_both_sweeps_and_the_milp_price_them_as_brute_force(check: str, seed: int) -> None:
    assert_a_term_is_priced(check, _ctx_trace, seed)


@pytest.mark.parametrize("seed", range(4))
def test_the_milp_prices_them_as_the_dp_and_brute_force(seed: int) -> None:
    doc = cpu_trace(3 + seed % 3, seed).model_dump()
    rng = random.Random(seed)
    for layer in doc["layers"]:
        layer["ctx_held_bytes"] = rng.randint(200, 3000)
    assert_brute_force_dp_and_milp_agree(Trace.model_validate(doc))


def test_they_decide_the_optimum_the_pricers_are_checked_at() -> None:
    """Not a check that cannot fail: on these traces the ctx bytes change the best plan's overhead at some budget,
    so the agreements above are about plans they decide."""
    changed = 0
    for seed in range(6):
        trace = _ctx_trace(3 + seed % 3, seed, serial=True)
        doc = trace.model_dump()
        bare = Trace.model_validate({**doc, "layers": [{**x, "ctx_held_bytes": None} for x in doc["layers"]]})
        changed += sum(best_overhead(trace, b) != best_overhead(bare, b) for b in spread_budgets(trace))
    assert changed > 0
