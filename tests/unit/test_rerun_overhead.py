"""The recompute machinery's own time (Trace.rerun_overhead): torch.utils.checkpoint's frame, its unpack hooks and
the replay's bookkeeping cost each segment and each re-run layer beyond the layers' measured times. On a CPU ResNet of
0.3 ms blocks a checkpoint-all plan predicted at +28% measured +87%: 0.48 ms a segment and 0.40 ms a re-run layer
that nothing priced, so plans of many short segments looked cheap (docs/cost-model.md, 'What a re-run costs').

Every pricer charges it by one rule (Trace.segment_rerun_s): the simulator and its compiled twin, the fluid sweep
(exact on serial copies), the FIFO sweep and the MILP agree with brute force over every plan, and the bounds stay
below it."""

from __future__ import annotations

import random

import pytest

from helpers.pricing import (
    FAR,
    KEEP_RECOMPUTE,
    PRICER_CHECKS,
    assert_a_term_is_priced,
    assert_brute_force_dp_and_milp_agree,
    best_overhead,
    cpu_trace,
    keep_recompute_plans,
    spread_budgets,
)
from memsched.optimizer.actions import dp_verdict
from memsched.optimizer.decisions import KEEP, Decision, recompute
from memsched.optimizer.simulate import simulate
from memsched.optimizer.stage_bound import stage_bound
from memsched.optimizer.synthetic import make_trace
from memsched.schema import Trace


def _with_overhead(trace: Trace, per_segment_s: float, per_layer_s: float) -> Trace:
    doc = trace.model_dump()
    doc["rerun_overhead"] = {"per_segment_s": per_segment_s, "per_layer_s": per_layer_s}
    return Trace.model_validate(doc)


def _overhead_trace(n: int, seed: int, serial: bool) -> Trace:
    """make_trace's layers with a machinery cost of the order of a layer's forward, so that it decides plans."""
    rng = random.Random(seed)
    trace = make_trace(n, seed, dag=seed % 3 == 0, copy_latency_s=0.0 if serial else 20e-6)
    trace.device.concurrent_copies = not serial
    mean_f = sum(x.forward_s for x in trace.layers) / n
    return _with_overhead(trace, rng.uniform(0.2, 1.5) * mean_f, rng.choice([0.0, rng.uniform(0.1, 0.6) * mean_f]))


def test_a_segment_pays_the_machinery_once_and_each_of_its_layers_its_share() -> None:
    base = cpu_trace(5, 3)
    trace = _with_overhead(base, 0.25, 0.125)
    # Segments [1, 2] and [4]: two segments, three re-run layers.
    plan = [KEEP, recompute(1), recompute(1), KEEP, recompute(4)]
    assert trace.segment_rerun_s(1, 2) == pytest.approx(base.segment_rerun_s(1, 2) + 0.25 + 2 * 0.125)
    budget = 10**12
    got, bare = simulate(trace, plan, budget), simulate(base, plan, budget)
    assert got.recompute_s == pytest.approx(bare.recompute_s + 2 * 0.25 + 3 * 0.125)
    assert got.overhead_s == pytest.approx(bare.overhead_s + 2 * 0.25 + 3 * 0.125)
    # Keep-all runs no re-run: the same step with or without it.
    assert simulate(trace, [KEEP] * 5, budget).step_s == simulate(base, [KEEP] * 5, budget).step_s


def test_traces_without_it_hash_and_price_as_before() -> None:
    base = cpu_trace(4, 1)
    assert base.rerun_overhead is None
    assert Trace.model_validate({**base.model_dump(), "rerun_overhead": None}).content_hash() == base.content_hash()
    zero = _with_overhead(base, 0.0, 0.0)
    assert zero.content_hash() != base.content_hash()  # a measured 0 is a measurement
    assert zero.segment_rerun_s(0, 3) == base.segment_rerun_s(0, 3)


@pytest.mark.parametrize("field", ["per_segment_s", "per_layer_s"])
def test_a_negative_or_infinite_cost_is_refused(field: str) -> None:
    doc = cpu_trace(3, 0).model_dump()
    for bad in (-1e-3, float("inf")):
        doc["rerun_overhead"] = {field: bad}
        with pytest.raises(ValueError, match=field):
            Trace.model_validate(doc)


def _argmin(trace: Trace, budget: int, plans: list[list[Decision]]) -> tuple[float, int] | None:
    sims = [simulate(trace, plan, budget, with_events=False) for plan in plans]
    return min(((s.overhead_s, i) for i, s in enumerate(sims) if s.feasible), default=None)


@pytest.mark.parametrize("seed", [40, 42, 44, 46])
def test_it_moves_the_optimum(seed: int) -> None:
    """On CPU-sized traces the machinery decides: brute force with it picks another plan than without it at some
    budget, and the DP finds the plan brute force picks."""
    base = cpu_trace(5, seed)
    mean_f = sum(x.forward_s for x in base.layers) / base.n
    trace = _with_overhead(base, 2.0 * mean_f, 0.0)
    plans = keep_recompute_plans(trace.n)
    # Budgets at the plans' own peaks, where each fits exactly: where the optimum changes hands.
    peaks = sorted({simulate(base, plan, None, with_events=False).peak_bytes for plan in plans})
    moved = []
    for budget in peaks[:: max(1, len(peaks) // 8)]:
        best, bare = _argmin(trace, budget, plans), _argmin(base, budget, plans)
        if best is None:
            continue
        assert bare is not None
        verdict = dp_verdict(trace, budget, KEEP_RECOMPUTE, FAR)
        assert verdict.sim is not None and verdict.sim.overhead_s == pytest.approx(best[0], rel=1e-9)
        bare_priced_now = simulate(trace, plans[bare[1]], budget, with_events=False).overhead_s
        moved.append(bare_priced_now > best[0] * (1 + 1e-9))
    assert any(moved)


@pytest.mark.parametrize("check", PRICER_CHECKS)
@pytest.mark.parametrize("seed", range(5))
def test_both_sweeps_and_the_milp_price_it_as_brute_force(check: str, seed: int) -> None:
    assert_a_term_is_priced(check, _overhead_trace, seed)


@pytest.mark.parametrize("seed", range(3))
def test_brute_force_dp_and_milp_agree_on_cpu_sized_traces(seed: int) -> None:
    base = cpu_trace(4, 60 + seed)
    assert_brute_force_dp_and_milp_agree(_with_overhead(base, 0.4, 0.15 * (seed % 2)))


def test_the_stage_bound_stays_below_the_best_plan() -> None:
    """It prices a recomputed layer at the least it costs in any segment (whole inside one, to the early stop with
    the segment's share as its last), so it stays a bound; and it proves something on these traces."""
    proved = []
    for seed in range(500, 506):
        trace = _overhead_trace(4, seed, serial=False)
        for budget in spread_budgets(trace):
            best = best_overhead(trace, budget)
            if best is None:
                continue
            bound = stage_bound(trace, budget).bound_s
            assert bound <= best * (1 + 1e-9) + 1e-12
            proved.append(bound > 0)
    assert sum(proved) >= 3
