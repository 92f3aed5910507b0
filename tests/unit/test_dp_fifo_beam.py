"""The FIFO beam (optimizer/dp/fifo.py, `beam`; dp.fifo_beam_search): the FIFO sweep keeping a few labels per
boundary. It is a search for plans, not a proof: it claims no bound, its plans simulate to exactly the cost it
computed (its waits are the simulator's), a beam wide enough to keep every label finds the exact optimum, and
solve() returns nothing worse than what its FIFO beams found."""

from __future__ import annotations

import random
import time

import numpy as np
import pytest
from test_dp import _random_trace, exact_optimum

from memsched.optimizer.budget import budget_between
from memsched.optimizer.dp import DpOutcome, build_problem, fifo_beam_search
from memsched.optimizer.dp.decode import decode
from memsched.optimizer.dp.fifo import fifo_sweep
from memsched.optimizer.flow.phases import Flow
from memsched.optimizer.simulate import simulate
from memsched.optimizer.solve import solve_report
from memsched.options import SolveOptions, SolveResources
from memsched.schema import Trace

FAR = time.perf_counter() + 10**6  # a deadline that never comes


def _case(seed: int, n: tuple[int, int] = (3, 8)) -> tuple[Trace, int]:
    rng = random.Random(seed)
    trace = _random_trace(rng.randint(*n), seed, rng.random() < 0.5, serial=False, latency=rng.random() < 0.5)
    return trace, budget_between(trace, rng.uniform(0.0, 0.8))


@pytest.mark.parametrize("seed", range(16))
def test_a_beam_wide_enough_finds_the_exact_optimum(seed: int) -> None:
    trace, budget = _case(seed)
    p = build_problem(trace, budget)
    res = fifo_sweep(p, FAR, np.inf, beam=10**6)
    assert res.finished and res.finals
    assert res.bound_s is None  # a beam never claims a bound, even where it kept every label
    assert res.finals[0][0] == pytest.approx(exact_optimum(trace, budget), rel=1e-5, abs=1e-12)


@pytest.mark.parametrize("seed", range(16, 40))
@pytest.mark.parametrize("width", [1, 3, 12])
def test_narrow_beams_plans_simulate_to_their_cost_and_never_beat_the_optimum(seed: int, width: int) -> None:
    trace, budget = _case(seed)
    p = build_problem(trace, budget)
    res = fifo_sweep(p, FAR, np.inf, beam=width)
    assert res.bound_s is None
    assert res.finished
    opt = exact_optimum(trace, budget)
    for cost, label in res.finals:
        sim = simulate(trace, decode(trace, p, res, label), budget)
        assert sim.feasible
        assert sim.overhead_s == pytest.approx(cost, rel=1e-9, abs=1e-12)
        assert cost >= opt * (1 - 1e-5) - 1e-12
    if res.finals:
        # At most `width` labels were kept at any boundary.
        assert all(len(parent) <= width for parent, _, _ in res.stored[:-1])


def test_fifo_beam_search_decodes_feasible_plans_below_its_threshold() -> None:
    trace, budget = _case(7, (6, 8))
    opt = exact_optimum(trace, budget)
    out = fifo_beam_search(trace, budget, FAR, width=8)
    assert out.bound_s is None and out.schedules
    assert all(s.feasible for s in out.schedules)
    best = out.schedules[0].overhead_s
    assert best >= opt * (1 - 1e-5) - 1e-12
    # A threshold at the best plan's cost drops it and everything dearer.
    pruned = fifo_beam_search(trace, budget, FAR, width=8, threshold=best)
    assert all(s.overhead_s < best for s in pruned.schedules)


def test_an_expired_deadline_stops_the_beam_with_no_plan() -> None:
    trace, budget = _case(3, (6, 8))
    out = fifo_beam_search(trace, budget, time.perf_counter() - 1.0, width=8)
    assert out.timed_out and not out.schedules and out.bound_s is None


def _record_fifo_beams(monkeypatch: pytest.MonkeyPatch) -> list[DpOutcome]:
    seen: list[DpOutcome] = []
    real = Flow._fifo_beam

    def spy(flow: Flow, until: float, width: int) -> bool:
        from memsched.optimizer import dp

        orig = dp.fifo_beam_search

        def recording(*args: object, **kwargs: object) -> DpOutcome:
            out = orig(*args, **kwargs)  # type: ignore[arg-type]
            seen.append(out)
            return out

        monkeypatch.setattr(dp, "fifo_beam_search", recording)
        try:
            return real(flow, until, width)
        finally:
            monkeypatch.setattr(dp, "fifo_beam_search", orig)

    monkeypatch.setattr(Flow, "_fifo_beam", spy)
    return seen


@pytest.mark.parametrize("seed", [40, 42, 44, 45, 47, 49])  # seeds where no plan is free (41: keep-all fits)
def test_solve_answers_no_worse_than_its_fifo_beams(monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    trace, budget = _case(seed, (10, 16))
    seen = _record_fifo_beams(monkeypatch)
    report = solve_report(trace, budget, SolveOptions(time_limit_s=2.0))
    assert seen, "copies beside compute and offload allowed: the FIFO beam runs"
    found = [s.overhead_s for out in seen for s in out.schedules]
    if found:
        assert report.schedule.prediction.overhead_s <= min(found) + 1e-12


def test_no_fifo_beam_on_serial_copies_or_under_a_binding_host_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(5)
    serial = _random_trace(10, 5, False, serial=True, latency=False)
    seen = _record_fifo_beams(monkeypatch)
    solve_report(serial, budget_between(serial, rng.uniform(0.1, 0.5)), SolveOptions(time_limit_s=1.0))
    assert not seen, "on the compute thread the fluid beam prices copies exactly"
    trace, budget = _case(41, (10, 16))
    flow_host = Flow(
        trace,
        budget,
        SolveOptions(time_limit_s=1.0, host_budget=1),
        SolveResources(),
        time.perf_counter(),
        SolveOptions().allowed_actions(trace),
    )
    assert flow_host.host_binds and not flow_host.fifo_beam_ok()
