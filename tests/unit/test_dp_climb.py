"""Climbing thresholds (optimizer/dp/__init__.py, next_threshold): the exact DP's under a host budget
(exact_search's `climb`) and the FIFO sweep's from the fluid bound (Flow.fifo_climb). Every finished sweep
proves its threshold, a climb from a poor incumbent ends at the same fluid optimum as one sweep at it, the steps
are sized by their predicted time, and a FIFO climb raises the bound past the fluid one but never past the exact
optimum."""

from __future__ import annotations

import time
from types import SimpleNamespace

import numpy as np
import pytest

import memsched.optimizer.solve as solve_module
from memsched.optimizer.budget import budget_between
from memsched.optimizer.dp import (
    _CLIMB_FROM_PROVEN_GROWTH,
    _CLIMB_GROWTH,
    _CLIMB_PRIOR_DOUBLING,
    _CLIMB_SAFETY,
    _CLIMB_SLOPE_RANGE,
    _FIRST_THRESHOLD,
    exact_search,
    fifo_search,
    next_threshold,
    predicted_s,
)
from memsched.optimizer.flow import shares
from memsched.optimizer.flow.phases import Flow
from memsched.optimizer.heuristic import heuristic
from memsched.optimizer.solve import solve_report
from memsched.optimizer.synthetic import make_trace
from memsched.options import SolveOptions
from memsched.schema import Trace

FAR = time.perf_counter() + 10**6  # a deadline that never comes


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("poor", [1.02, 1.6, 4.0])
def test_a_climb_ends_at_the_fluid_optimum_whatever_the_incumbent(seed: int, poor: float) -> None:
    trace = make_trace(24 + seed, seed, dag=seed % 2 == 1, copy_latency_s=10e-6)
    budget = budget_between(trace, 0.25 + 0.05 * seed)
    free = exact_search(trace, budget, FAR, incumbent_s=None, gap=0.0)
    assert free.bound_s is not None and free.schedules and free.fluid_optimum
    optimum = free.bound_s
    incumbent = free.schedules[0].overhead_s * poor  # the decoded plan's simulated cost, made worse
    for climb in (False, True):
        out = exact_search(trace, budget, FAR, incumbent_s=incumbent, gap=0.0, climb=climb)
        assert out.fluid_optimum, (climb, out.notes)
        assert out.bound_s == pytest.approx(optimum, rel=1e-9, abs=1e-12)


def _spied_climb(seed: int, monkeypatch: pytest.MonkeyPatch) -> tuple[Trace, int, float, list[float]]:
    """A small trace with a positive fluid optimum: (trace, budget, optimum, the thresholds of every exact sweep
    started from here on, as they start)."""
    import memsched.optimizer.dp as dp_module

    trace = make_trace(24 + seed, seed, dag=seed % 2 == 1, copy_latency_s=10e-6)
    budget = budget_between(trace, 0.1 + 0.03 * seed)
    free = exact_search(trace, budget, FAR, incumbent_s=None, gap=0.0)
    assert free.bound_s is not None and free.fluid_optimum and free.bound_s > 0.0
    thresholds: list[float] = []
    real = dp_module._sweep_with_cap

    def spy(p, out, deadline, threshold, *args, **kwargs):  # type: ignore[no-untyped-def]
        thresholds.append(threshold)
        return real(p, out, deadline, threshold, *args, **kwargs)

    monkeypatch.setattr(dp_module, "_sweep_with_cap", spy)
    return trace, budget, free.bound_s, thresholds


@pytest.mark.parametrize("seed", range(4))
def test_a_climb_from_a_held_bound_starts_above_it_and_ends_at_the_fluid_optimum(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A long trace's climb after the link windows' Lagrangian: the bound held (proven_s) lies above
    # _FIRST_THRESHOLD of the top, so the first sweep starts _CLIMB_FROM_PROVEN of the way from it to the top, not at
    # the top (the sweep that may not finish); without a climb the one sweep is still at the top.
    import memsched.optimizer.dp as dp_module

    trace, budget, optimum, thresholds = _spied_climb(seed, monkeypatch)
    proven, incumbent = 0.9 * optimum, 1.2 * optimum
    out = exact_search(
        trace, budget, FAR, incumbent_s=incumbent, gap=0.0, climb=True, proven_s=proven, climb_from_proven=True
    )
    assert thresholds[0] == pytest.approx(proven + dp_module._CLIMB_FROM_PROVEN * (incumbent - proven))
    assert all(proven < t <= incumbent for t in thresholds) and thresholds == sorted(thresholds)
    assert out.fluid_optimum and out.bound_s == pytest.approx(optimum, rel=1e-9, abs=1e-12)
    for climb in (False, True):  # a plain search, and the host budget's climb, go to the top at once
        thresholds.clear()
        out = exact_search(trace, budget, FAR, incumbent_s=incumbent, gap=0.0, climb=climb, proven_s=proven)
        assert thresholds[0] == incumbent and out.fluid_optimum


def test_a_climb_cut_by_the_clock_keeps_a_true_bound_and_says_why() -> None:
    trace = make_trace(60, 3, dag=False, copy_latency_s=10e-6)  # its sweep with no incumbent: about 2 s
    budget = budget_between(trace, 0.2)
    free = exact_search(trace, budget, FAR, incumbent_s=None, gap=0.0)
    assert free.bound_s is not None and free.fluid_optimum
    for seconds in (0.02, 0.2, 0.6):
        out = exact_search(trace, budget, time.perf_counter() + seconds, free.bound_s * 3.0, 0.0, climb=True)
        assert out.bound_s is not None and out.bound_s <= free.bound_s * (1 + 1e-9)
        if not out.fluid_optimum:
            assert out.timed_out and out.notes, out.notes


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("poor", [1.2, 3.0])  # the first step's threshold below the optimum, and above it
def test_a_climbing_step_started_by_the_deadline_runs_on_to_finish_by_and_no_step_starts_after(
    seed: int, poor: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A long trace's exact DP phase (solve's DP_GRACE_LONG): a step the climb started before the phase's end may
    # run past it, to `finish_by`, since a cut step proves nothing; the climb starts no step after the end. Here
    # the end has passed when the first step starts: with `finish_by` that step finishes (it proves its threshold
    # or finds the fluid optimum) and is the only one; without it, the clock cuts it.
    trace, budget, optimum, thresholds = _spied_climb(seed, monkeypatch)
    incumbent = poor * optimum
    past = time.perf_counter() - 1.0
    graced = exact_search(trace, budget, past, incumbent, 0.0, climb=True, finish_by=FAR)
    assert len(thresholds) == 1
    assert graced.bound_s is not None and graced.bound_s <= optimum * (1 + 1e-9)
    if thresholds[0] >= optimum:
        assert graced.fluid_optimum and graced.bound_s == pytest.approx(optimum, rel=1e-9, abs=1e-12)
    else:  # it found nothing below its threshold, which it proves; the next one was not started
        assert graced.bound_s >= thresholds[0] * (1 - 1e-9) and graced.timed_out, graced.notes
        assert "its next sweep was not predicted to end by its deadline" in graced.message
    thresholds.clear()
    cut = exact_search(trace, budget, past, incumbent, 0.0, climb=True)
    assert len(thresholds) == 1 and cut.timed_out and not cut.fluid_optimum
    assert cut.bound_s is not None and cut.bound_s < thresholds[0]


def test_a_sweep_past_its_deadline_stops_once_its_projection_says_it_cannot_end_by_finish_by() -> None:
    # The grace is for a sweep that can end in it: the 1,000-layer chain's sweep at the keep-all cost cannot end
    # in 1.5 s (it reaches layer ~36 in 5 s), so past its deadline its projection stops it at once, with a true
    # bound, not the clock at finish_by.
    trace = make_trace(1000, 1)
    budget = budget_between(trace, 0.2)
    began = time.perf_counter()
    out = exact_search(trace, budget, began - 1.0, 1.0, 0.0, climb=True, finish_by=began + 1.5)
    assert out.timed_out and not out.schedules
    assert any("at its pace" in note for note in out.notes), out.notes
    assert out.bound_s is not None and 0.0 <= out.bound_s < 1.0


def test_a_sweep_that_cannot_finish_stops_at_its_pace_with_a_true_bound() -> None:
    # Long traces (solve's LONG_PACE): a sweep whose time per layer so far, times the layers left, exceeds
    # `pace` x its time left gives up at once, so that the local search gets the time back. The 1,000-layer chain
    # at 20% with copies beside compute: its sweep at the keep-all cost reaches layer ~36 in 5 s.
    trace = make_trace(1000, 1)
    budget = budget_between(trace, 0.2)
    deadline = time.perf_counter() + 4.0
    out = exact_search(trace, budget, deadline, 1.0, 0.0, climb=True, pace=3.0)
    left = deadline - time.perf_counter()
    assert out.timed_out and not out.fluid_optimum
    assert left > 2.0, "it stopped at its pace, well before its deadline"
    assert any("at its pace" in note for note in out.notes), out.notes
    greedy = heuristic(trace, budget).sim.overhead_s
    assert out.bound_s is not None and 0.0 < out.bound_s <= greedy  # the frontier's bound: a true one
    # A sweep that keeps up finishes as without the rule: the same optimum on a short trace.
    short = make_trace(30, 2, copy_latency_s=10e-6)
    b = budget_between(short, 0.3)
    assert exact_search(short, b, FAR, None, 0.0, pace=3.0).bound_s == exact_search(short, b, FAR, None, 0.0).bound_s


def test_pace_compares_the_linear_projection_with_the_time_left() -> None:
    from memsched.optimizer.dp.sweep import SweepConfig, _behind

    # 1 s to boundary 10 of 100 projects 9 s more: with 4 s left, behind at a margin of 2, not at 3.
    assert _behind(SweepConfig(deadline=5.0, pace=2.0), 0.0, 1.0, 10, 100)
    assert not _behind(SweepConfig(deadline=5.0, pace=3.0), 0.0, 1.0, 10, 100)
    # An earlier sweep spent 80% of its time before boundary 10: 0.25 s more, not behind even with 1 s left.
    front = np.concatenate([np.linspace(0.0, 0.8, 11), np.linspace(0.8, 1.0, 91)[1:]])
    assert not _behind(SweepConfig(deadline=2.0, pace=1.0, pace_profile=front), 0.0, 1.0, 10, 100)
    assert _behind(SweepConfig(deadline=2.0, pace=1.0), 0.0, 1.0, 10, 100)


def test_a_finished_sweep_records_the_shape_of_its_time() -> None:
    from memsched.optimizer.dp import build_problem
    from memsched.optimizer.dp.sweep import SweepConfig, run_sweep

    trace = make_trace(40, 5, copy_latency_s=10e-6)
    res = run_sweep(build_problem(trace, budget_between(trace, 0.3)), SweepConfig(deadline=FAR))
    assert res.finished and res.profile is not None and len(res.profile) == trace.n + 1
    assert res.profile[0] == 0.0 and res.profile[-1] == 1.0 and bool(np.all(np.diff(res.profile) >= 0.0))


def test_first_step_uses_the_prior_and_the_growth_allowed() -> None:
    top = 1.0
    step = next_threshold([(_FIRST_THRESHOLD, 1.0)], top, left_s=100.0)
    # predicted time GROWTH x the last: log2(GROWTH) doublings of the prior above the last threshold
    doublings = {2.0: 1, 4.0: 2, 8.0: 3}[_CLIMB_GROWTH]
    assert step == pytest.approx(_FIRST_THRESHOLD + doublings * _CLIMB_PRIOR_DOUBLING * top)


def test_two_timed_sweeps_set_the_slope() -> None:
    # time x4 over 0.1 of the top: a doubling per 0.05; GROWTH 4 allows two more doublings
    step = next_threshold([(0.6, 0.5), (0.7, 2.0)], 1.0, left_s=100.0)
    assert step == pytest.approx(0.7 + 0.05 * 2)
    # slow growth: the top is predicted within GROWTH x the last sweep, so it goes there at once
    assert next_threshold([(0.6, 1.0), (0.7, 1.1)], 1.0, left_s=100.0) == 1.0


def test_with_a_top_share_the_top_comes_as_soon_as_it_is_predicted_to_fit() -> None:
    # A doubling per 0.05 of the span from (0.6, 0.5 s), (0.7, 2 s): the top (1.0) is predicted at 2 x 2^6 = 128 s,
    # 64x the last sweep, so the growth cap sizes a step below it; with a top share, 128 s fitting in that share of
    # the time left sends the climb to the top at once, and not where it does not fit.
    timed = [(0.6, 0.5), (0.7, 2.0)]
    assert predicted_s(timed, 1.0, 1.0) == pytest.approx(128.0)
    assert predicted_s(timed, 0.8, 1.0) == pytest.approx(8.0)
    assert next_threshold(timed, 1.0, left_s=200.0) == pytest.approx(0.8)  # GROWTH 4: two doublings
    assert next_threshold(timed, 1.0, left_s=200.0, top_share=0.7) == 1.0  # 128 <= 140
    assert next_threshold(timed, 1.0, left_s=150.0, top_share=0.7) == pytest.approx(0.8)  # 128 > 105


def test_a_smaller_growth_takes_smaller_steps_below_the_top() -> None:
    # A doubling per 0.05 of the span from (0.6, 0.5 s), (0.7, 2 s): growth 4 allows two doublings (0.8), growth 2
    # one (0.75), the long traces' climbs' (_CLIMB_FROM_PROVEN_GROWTH); a top predicted within it is still taken.
    timed = [(0.6, 0.5), (0.7, 2.0)]
    assert _CLIMB_FROM_PROVEN_GROWTH == 2.0
    assert next_threshold(timed, 1.0, left_s=200.0, growth=4.0) == pytest.approx(0.8)
    assert next_threshold(timed, 1.0, left_s=200.0, growth=_CLIMB_FROM_PROVEN_GROWTH) == pytest.approx(0.75)
    assert next_threshold(timed, 0.74, left_s=200.0, growth=_CLIMB_FROM_PROVEN_GROWTH) == 0.74  # 1.74x the last


def test_a_prior_scaled_to_the_top_takes_larger_first_steps_over_a_narrow_span() -> None:
    # A climb from a held bound: its span (0.9 -> 1.0) is a tenth of the top. Of the span, the prior doubles the time
    # per 0.006; of the top, per 0.06, clamped to half the span (0.05). Growth 2: one doubling either way.
    timed = [(0.915, 1.0)]
    lo, hi = _CLIMB_SLOPE_RANGE
    of_span = next_threshold(timed, 1.0, left_s=100.0, span=0.1, growth=2.0)
    of_top = next_threshold(timed, 1.0, left_s=100.0, span=0.1, growth=2.0, prior_scale=1.0)
    assert of_span == pytest.approx(0.915 + _CLIMB_PRIOR_DOUBLING * 0.1)
    assert of_top == pytest.approx(0.915 + min(_CLIMB_PRIOR_DOUBLING * 1.0, hi * 0.1))
    assert predicted_s(timed, 0.965, 0.1, prior_scale=1.0) == pytest.approx(2.0)
    # Two timed sweeps set the slope themselves: the prior's scale no longer matters.
    two = [(0.905, 0.5), (0.915, 1.0)]
    assert next_threshold(two, 1.0, 100.0, 0.1, growth=2.0, prior_scale=1.0) == pytest.approx(
        next_threshold(two, 1.0, 100.0, 0.1, growth=2.0)
    )
    assert lo * 0.1 <= 0.01 <= hi * 0.1  # that slope (a doubling per 0.01) is within the clamp


def _climb_case() -> tuple[Trace, int, float]:
    """A 30-layer chain with copy latency, its budget and its fluid optimum (> 0)."""
    trace = make_trace(30, 2, copy_latency_s=10e-6)
    budget = budget_between(trace, 0.12)
    free = exact_search(trace, budget, FAR, incumbent_s=None, gap=0.0)
    assert free.bound_s is not None and free.fluid_optimum and free.bound_s > 0.0
    return trace, budget, free.bound_s


def _spy_next_threshold(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, object]]:
    """The keyword arguments of every call exact_search makes to next_threshold from now on."""
    import memsched.optimizer.dp as dp_module

    calls: list[dict[str, object]] = []
    real = dp_module.next_threshold

    def spy(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(dp_module, "next_threshold", spy)
    return calls


@pytest.mark.parametrize("from_proven", [True, False])
@pytest.mark.parametrize(("proven_of", "incumbent_of"), [(0.9, 1.2), (0.6, 1.4)])
def test_a_climb_from_a_held_bound_steps_by_its_own_growth_and_prior(
    monkeypatch: pytest.MonkeyPatch, from_proven: bool, proven_of: float, incumbent_of: float
) -> None:
    # Long traces' climbs (climb_from_proven) size their steps by _CLIMB_FROM_PROVEN_GROWTH, the host budget's by
    # _CLIMB_GROWTH. Where the bound held lies above _FIRST_THRESHOLD of the top (0.9 against 0.84 of the optimum),
    # a long trace's climb covers the narrow span above it and scales its prior doubling to the top (prior_scale);
    # the other climbs keep the span's. Every one ends at the fluid optimum.
    trace, budget, optimum = _climb_case()
    calls = _spy_next_threshold(monkeypatch)
    proven, incumbent = proven_of * optimum, incumbent_of * optimum
    out = exact_search(trace, budget, FAR, incumbent, 0.0, climb=True, proven_s=proven, climb_from_proven=from_proven)
    assert out.fluid_optimum and out.bound_s == pytest.approx(optimum, rel=1e-9, abs=1e-12)
    narrow = from_proven and proven >= _FIRST_THRESHOLD * incumbent
    # The first sweep finds nothing below it (0.915 / 0.98 of the optimum), so the climb steps; without the narrow
    # span and from a bound above 0.7 of the top, the only sweep is at the top.
    assert bool(calls) == (narrow or proven_of < _FIRST_THRESHOLD * incumbent_of)
    growth = _CLIMB_FROM_PROVEN_GROWTH if from_proven else _CLIMB_GROWTH
    assert all(c["growth"] == growth for c in calls), calls
    assert all(c.get("prior_scale") == (incumbent if narrow else None) for c in calls), calls


def test_steps_shrink_to_the_time_left_and_stop_when_none_fits() -> None:
    ample = next_threshold([(0.7, 1.0)], 1.0, left_s=100.0)
    short = next_threshold([(0.7, 1.0)], 1.0, left_s=2.0)
    assert ample is not None and short is not None
    # 0.7 x 2 s = 1.4 s: log2(1.4) doublings of the prior
    assert 0.7 < short < ample
    # under the last sweep's time left, and the top predicted far beyond it: stop
    assert next_threshold([(0.7, 1.0)], 1.0, left_s=1.0 / _CLIMB_SAFETY * 0.9) is None
    # ... unless the top is predicted within the margin of error of the time left
    assert next_threshold([(0.6, 1.0), (0.7, 1.05)], 1.0, left_s=1.2) == 1.0


@pytest.mark.parametrize(("n", "seed"), [(20, 3), (30, 2)])
def test_a_fifo_climb_raises_the_bound_past_the_fluid_one_and_never_past_the_optimum(
    monkeypatch: pytest.MonkeyPatch, n: int, seed: int
) -> None:
    # The FIFO probe stops at its smallest label cap, so after the fluid sweep the FIFO sweep climbs
    # (Flow.fifo_climb) from the fluid bound.
    monkeypatch.setattr(shares, "FIFO_LABELS_PER_S", 1)
    trace = make_trace(n, seed, dag=seed % 2 == 1, copy_latency_s=10e-6)
    budget = budget_between(trace, 0.15)
    sc = solve_report(trace, budget, SolveOptions(time_limit_s=6, gap=0.0, solver="dp")).schedule
    bound = sc.solver.best_bound_s
    assert bound is not None
    # The climb's note where the gap stays open; where a step finds the optimum, the answer is proven by it.
    said = " ".join(sc.solver.details)
    assert "climbing from the fluid bound" in said or "from dp-fifo" in said, sc.solver.details
    fluid = exact_search(trace, budget, FAR, incumbent_s=None, gap=0.0)
    assert fluid.bound_s is not None and fluid.fluid_optimum
    assert bound > fluid.bound_s
    # The FIFO sweep to the end, pruned only at the answer: exact for the simulator's timing.
    exact = fifo_search(trace, budget, FAR, sc.solver.objective_s * (1 + 1e-9), 0.0, max_labels=50_000_000)
    assert exact.bound_s is not None and not exact.cap_hit and not exact.timed_out
    assert bound <= exact.bound_s * (1 + 1e-9) + 1e-12


def _stand_in_flow(monkeypatch: pytest.MonkeyPatch) -> Flow:
    """A Flow on a 12-layer chain whose proven bound is 0.1 and whose best plan costs 1.0 (a stand-in): a FIFO
    climb from it runs up to 0.99 (gap 1%)."""
    trace = make_trace(12, 1)
    flow = Flow(
        trace,
        budget_between(trace, 0.3),
        SolveOptions(time_limit_s=100.0),
        solve_module.SolveResources(),
        time.perf_counter(),
        SolveOptions().allowed_actions(trace),
    )
    flow.bound = 0.1
    incumbent = SimpleNamespace(name="stand-in", sim=SimpleNamespace(overhead_s=1.0))
    monkeypatch.setattr(Flow, "best", property(lambda _: incumbent))
    return flow


def test_the_fifo_climb_goes_to_the_top_once_it_is_predicted_to_fit_and_gives_it_a_margin(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Stand-in FIFO sweeps that always finish, on a clock of their own: the first two steps take 0.15 / 0.21 s, a
    # slope that predicts the top (0.99) at about 1.6 s, more than 4x the last step but within
    # FIFO_CLIMB_TOP_SHARE of the 2.64 s left. So the third sweep is the top's (without the top share: a step
    # below it), and it may run past the share of any other step (0.7 x the time left), to
    # FIFO_CLIMB_TOP_MARGIN x its prediction.
    from memsched.optimizer import dp as dp_module
    from memsched.optimizer.dp import DpOutcome

    clock = [1000.0]  # the seconds the stand-ins take, and nothing else
    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])
    sleeps = [0.15, 0.21]
    tried: list[tuple[float, float]] = []  # (threshold, seconds its deadline gave it)

    def stand_in(*args: object, **kwargs: object) -> DpOutcome:
        deadline, threshold = float(args[2]), float(args[3])  # type: ignore[arg-type]
        tried.append((threshold, deadline - clock[0]))
        clock[0] += sleeps[len(tried) - 1] if len(tried) <= len(sleeps) else 0.5
        return DpOutcome(bound_s=threshold, wall_s=0.01)

    asked: list[tuple[list[tuple[float, float]], float, float, float]] = []  # (timed, top, left_s, span)
    real_next = dp_module.next_threshold

    def spy(
        timed: list[tuple[float, float]], top: float, left_s: float, span: float, top_share: float | None = None
    ) -> object:
        asked.append((list(timed), top, left_s, span))
        return real_next(timed, top, left_s, span, top_share)

    monkeypatch.setattr(dp_module, "fifo_search", stand_in)
    monkeypatch.setattr(dp_module, "next_threshold", spy)
    flow = _stand_in_flow(monkeypatch)
    flow.fifo_climb(clock[0] + 3.0)

    assert [t for t, _ in tried][2:] == [pytest.approx(0.99)]  # the top third, and nothing after it
    assert flow.bound == pytest.approx(0.99)
    timed, top, left_s, span = asked[1]
    assert len(timed) == 2
    predicted = predicted_s(timed, top, span)
    assert _CLIMB_GROWTH * timed[-1][1] < predicted <= shares.FIFO_CLIMB_TOP_SHARE * left_s
    below = real_next(timed, top, left_s, span)
    assert below is not None and below < top  # the growth cap alone would have stepped below the top
    given = tried[2][1]
    assert given > shares.FIFO_CLIMB_STEP_SHARE * left_s
    assert given == pytest.approx(min(left_s, shares.FIFO_CLIMB_TOP_MARGIN * predicted))


def test_a_fifo_climb_step_the_clock_cuts_falls_back_below_it(monkeypatch: pytest.MonkeyPatch) -> None:
    # The FIFO sweeps' stand-in: each finishes (proving its threshold) below 0.5 and is cut by its deadline at or
    # above it. The climb starts 0.15 of the way from the proven 0.1 to the top 0.99 and steps up as
    # next_threshold sizes it; after each cut step it falls back to a third of the way from the last proven
    # threshold, until FIFO_CLIMB_RETRIES fallbacks are spent (here 0.2335, 0.3403, 0.4471, 0.5539 cut, 0.4827,
    # 0.5183 cut, 0.4946, 0.5064 cut). It never proves a threshold the sweep could not finish, and the fallbacks
    # prove more than the last step before the first cut.
    from memsched.optimizer import dp as dp_module
    from memsched.optimizer.dp import DpOutcome

    tried: list[float] = []

    def stand_in(*args: object, **kwargs: object) -> DpOutcome:
        threshold = float(args[3])  # type: ignore[arg-type]
        tried.append(threshold)
        if threshold < 0.5:
            return DpOutcome(bound_s=threshold, wall_s=0.01)
        return DpOutcome(bound_s=0.0, timed_out=True, wall_s=0.01)

    monkeypatch.setattr(dp_module, "fifo_search", stand_in)
    flow = _stand_in_flow(monkeypatch)
    flow.fifo_climb(time.perf_counter() + 50.0)
    assert tried[0] == pytest.approx(0.1 + shares.FIFO_CLIMB_FIRST * (0.99 - 0.1))
    cut = [t for t in tried if t >= 0.5]
    assert 1 <= len(cut) <= shares.FIFO_CLIMB_RETRIES + 1
    # After each cut step the next one lies below it, a third of the way from the last proven threshold.
    for i, t in enumerate(tried[:-1]):
        if t >= 0.5:
            proven = max([x for x in tried[:i] if x < 0.5], default=0.1)
            assert tried[i + 1] == pytest.approx(proven + (t - proven) / 3.0)
    assert flow.bound == max(t for t in tried if t < 0.5)
    first_cut = next(i for i, t in enumerate(tried) if t >= 0.5)
    assert flow.bound > tried[first_cut - 1]


@pytest.mark.parametrize(
    ("stopped_by", "before", "stops", "cuts"),
    [
        ("cap", 4, (4,), 1),
        ("cap", 4, (6, 6), 2),
        ("cap", None, (4, 4), 2),
        ("cap", 11, (11,), 1),
        ("clock", 4, (1,), 1),
        ("clock", 4, (5, 5), 2),
        ("clock", None, (1, 1), 2),
        ("clock", 11, (11, 11, 11), 1 + shares.FIFO_CLIMB_RETRIES),
    ],
)
def test_a_fifo_climb_step_that_stops_no_further_than_the_sweep_before_it_does_not_fall_back(
    monkeypatch: pytest.MonkeyPatch, stopped_by: str, before: int | None, stops: tuple[int, ...], cuts: int
) -> None:
    # Stand-in FIFO sweeps: below 0.5 each finishes (proving its threshold), at or above it each stops (at its label
    # cap or by the clock) at the next layer of `stops`, of 12. A step that stops no further on than the FIFO sweep
    # before it on the same byte ranges (the probe at layer `before`, then each step) ends the climb where its cap
    # stopped it, or the clock before half the layers (FIFO_FALLBACK_MIN_REACH): there the labels pile up before any
    # threshold prunes them. One that got further on, or that the clock stopped past half the layers, falls back as
    # before (there a lower threshold is what lets a sweep finish).
    from memsched.optimizer import dp as dp_module
    from memsched.optimizer.dp import DpOutcome

    tried: list[float] = []
    stopped = iter(stops)

    def stand_in(*args: object, **kwargs: object) -> DpOutcome:
        threshold = float(args[3])  # type: ignore[arg-type]
        tried.append(threshold)
        if threshold < 0.5:
            return DpOutcome(bound_s=threshold, wall_s=0.01)
        cap = stopped_by == "cap"
        return DpOutcome(bound_s=0.0, cap_hit=cap, timed_out=not cap, stopped_at=next(stopped), wall_s=0.01)

    monkeypatch.setattr(dp_module, "fifo_search", stand_in)
    flow = _stand_in_flow(monkeypatch)
    cells = shares.RELAXED_LADDER[0]
    flow.fifo_stopped_at = None if before is None else (cells, before)
    flow.fifo_climb(time.perf_counter() + 50.0, cells)
    assert len([t for t in tried if t >= 0.5]) == cuts
    assert flow.fifo_stopped_at == (cells, stops[-1])
    assert flow.bound == max(t for t in tried if t < 0.5)


def test_a_fifo_climb_ends_where_a_step_finds_the_sweeps_optimum_below_its_threshold(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The FIFO sweeps' stand-in: each finishes and finds the optimum 0.3 below any threshold above it, with no
    # plan that decodes into a real one that fits (relaxed ranges): a higher threshold finds the same optimum, so
    # the climb proves 0.3 and stops at the first such step.
    from memsched.optimizer import dp as dp_module
    from memsched.optimizer.dp import DpOutcome

    tried: list[float] = []

    def stand_in(*args: object, **kwargs: object) -> DpOutcome:
        threshold = float(args[3])  # type: ignore[arg-type]
        tried.append(threshold)
        return DpOutcome(bound_s=min(threshold, 0.3), wall_s=0.01)

    monkeypatch.setattr(dp_module, "fifo_search", stand_in)
    flow = _stand_in_flow(monkeypatch)
    flow.fifo_climb(time.perf_counter() + 50.0)
    assert len(tried) >= 2 and tried[-1] > 0.3 and all(t <= 0.3 for t in tried[:-1])
    assert flow.bound == pytest.approx(0.3)
