"""`memsched sweep`: the curve's points are real solves, judged by the simulator; answers exchanged between
budgets stay sound (schedules fit, bounds bound); points go where the curve bends; knees; bad input."""

from __future__ import annotations

import itertools
import json
import re
import time

import pytest

from helpers import tiny_trace
from memsched.cli import main
from memsched.errors import InfeasibleBudgetError, MemschedError
from memsched.io import save_model
from memsched.optimizer.baselines import evaluate_baselines
from memsched.optimizer.budget import keepall_activation_peak, min_feasible_budget
from memsched.optimizer.simulate import make_schedule, simulate
from memsched.optimizer.solve import solve
from memsched.optimizer.sweep_curve import CurvePoint, find_knees, solved_now, sweep
from memsched.optimizer.synthetic import make_trace
from memsched.options import SolveOptions
from memsched.schema import Action, Schedule, SolverRecord, SolverStatus, Trace
from memsched.service.sweep import sweep_trace

OPTS = SolveOptions(time_limit_s=3.0, gap=0.0)


@pytest.fixture(scope="module")
def trace() -> Trace:
    return make_trace(10, 4)


@pytest.fixture(scope="module")
def curve(trace: Trace):
    return sweep_trace(trace, OPTS, points=9)


def test_points_are_solved_schedules_that_fit(trace: Trace, curve) -> None:
    pts = curve.points
    assert len(pts) == 9
    assert [p.budget_bytes for p in pts] == sorted({p.budget_bytes for p in pts})
    assert pts[0].budget_bytes == min_feasible_budget(trace)
    assert pts[-1].budget_bytes == trace.static.total + keepall_activation_peak(trace)
    assert pts[-1].overhead_s == 0 and curve.zero_overhead_bytes is not None
    for p in pts:
        sim = simulate(trace, p.schedule)
        assert sim.feasible and sim.peak_bytes <= p.budget_bytes == p.schedule.budget_bytes
        assert sim.overhead_s == pytest.approx(p.overhead_s, rel=1e-9, abs=1e-12)
        assert p.bound_s is not None and p.bound_s <= p.overhead_s * (1 + 1e-9)
        assert p.schedule.solver.best_bound_s == p.bound_s and p.schedule.solver.status == p.status
    # The curve never rises with the budget: a schedule that fits a budget fits every larger one.
    assert all(a.overhead_s >= b.overhead_s for a, b in itertools.pairwise(pts))


def test_bounds_are_true_bounds(trace: Trace, curve) -> None:
    """Each point's bound (its own, or one raised from a larger budget) is below the exact optimum there."""
    for p in curve.points[:5]:
        exact = solve(trace, p.budget_bytes, SolveOptions(time_limit_s=10, gap=0.0))
        assert exact.solver.status == SolverStatus.OPTIMAL
        assert p.bound_s is not None and p.bound_s <= exact.prediction.overhead_s * (1 + 1e-9) + 1e-12
        assert p.overhead_s <= exact.prediction.overhead_s * (1 + 1e-9) + 1e-12  # gap 0 asked: exact here


def _worse(trace: Trace, budget: int) -> Schedule:
    """A feasible but poor schedule (the costliest baseline that fits), with no bound."""
    fits = [r for r in evaluate_baselines(trace, budget) if r.feasible]
    r = max(fits, key=lambda r: r.sim.overhead_s)
    rec = SolverRecord(backend=r.policy, status=SolverStatus.HEURISTIC, objective_s=r.sim.overhead_s)
    return make_schedule(trace, r.sim.decisions, budget, r.policy, rec)


def test_exchange_reuses_smaller_budgets_schedule_and_larger_budgets_bound(trace: Trace) -> None:
    lo = min_feasible_budget(trace)
    hi = trace.static.total + keepall_activation_peak(trace)
    mid = (lo + hi) // 2
    real = {b: solve(trace, b, OPTS) for b in (lo, hi)}

    # The middle budget gets a poor heuristic answer; its neighbours the real solves.
    c = sweep(trace, solved_now(lambda b: real[b] if b in real else _worse(trace, b)), 3, lo, hi, gap=0.0)
    assert [p.budget_bytes for p in c.points] == [lo, mid, hi]
    low, middle, _ = c.points
    if low.overhead_s < _worse(trace, mid).prediction.overhead_s:
        assert middle.reused_from == lo and middle.overhead_s == low.overhead_s
        assert middle.schedule.budget_bytes == mid and simulate(trace, middle.schedule).feasible
        assert any("sweep: the schedule solved at budget" in d for d in middle.schedule.solver.details)
    # No bound was proven at the middle budget; keep-all's (0) holds there, and it is reported as such.
    assert middle.bound_s == 0.0 and middle.status in (SolverStatus.FEASIBLE, SolverStatus.OPTIMAL)


def _no_bound(sc: Schedule) -> Schedule:
    """The same schedule as an answer with no bound (a heuristic's): its point stays open."""
    rec = sc.solver.model_copy(update={"status": SolverStatus.HEURISTIC, "best_bound_s": None, "gap": None})
    return sc.model_copy(update={"solver": rec})


def test_open_points_are_solved_again_with_the_time_the_sweep_has_left(trace: Trace) -> None:
    """A point its first solve leaves open (a poor heuristic answer, no bound) is solved again, alone, with what is
    left of the sweep's budget (3 points x 10 s, one at a time): the second answer is kept, the point is proven,
    and both the point and the curve say so."""
    lo, hi = min_feasible_budget(trace), trace.static.total + keepall_activation_peak(trace)
    mid = (lo + hi) // 2
    real = {b: solve(trace, b, OPTS) for b in (lo, mid, hi)}
    assert all(sc.solver.status == SolverStatus.OPTIMAL for sc in real.values())
    again: list[tuple[int, float]] = []

    def resolve(budget: int, seconds: float, start: Schedule):
        assert start.budget_bytes == budget and start.solver.status != SolverStatus.OPTIMAL  # its answer so far
        again.append((budget, seconds))
        return solved_now(lambda b: real[b])(budget)

    first = solved_now(lambda b: real[b] if b != mid else _worse(trace, b))
    c = sweep(trace, first, 3, lo, hi, gap=0.01, refine=resolve, point_limit_s=10.0)
    assert [b for b, _ in again] == [mid] and 20.0 <= again[0][1] <= 30.0
    middle = c.points[1]
    assert middle.overhead_s == pytest.approx(real[mid].prediction.overhead_s, rel=1e-12)
    assert middle.status == SolverStatus.OPTIMAL and middle.reused_from is None
    assert any(d.startswith("sweep: solved again with") for d in middle.schedule.solver.details)
    assert any("solved again with the time the sweep had left" in n and "1 of 1" in n for n in c.notes)
    # What the second solve took, beside the limit it had (it ends at once here: its answer is ready).
    assert any(re.search(r"\(\S+ s of a (2\d|30) s limit\)", n) for n in c.notes), c.notes
    assert simulate(trace, middle.schedule).feasible


def test_a_second_solve_keeps_the_better_schedule_and_the_larger_bound(trace: Trace) -> None:
    """The first solve found the optimum but proved nothing; the second found a worse plan and proved the optimum's
    bound: the point keeps the first's schedule with the second's bound."""
    lo, hi = min_feasible_budget(trace), trace.static.total + keepall_activation_peak(trace)
    mid = (lo + hi) // 2
    real = {b: solve(trace, b, OPTS) for b in (lo, mid, hi)}
    poor = _worse(trace, mid)
    assert poor.prediction.overhead_s > real[mid].prediction.overhead_s
    proven = poor.model_copy(
        update={"solver": poor.solver.model_copy(update={"best_bound_s": real[mid].solver.best_bound_s})}
    )
    first = solved_now(lambda b: real[b] if b != mid else _no_bound(real[mid]))
    c = sweep(
        trace,
        first,
        3,
        lo,
        hi,
        gap=0.01,
        refine=lambda b, s, start: solved_now(lambda x: proven)(b),
        point_limit_s=10.0,
    )
    middle = c.points[1]
    assert middle.overhead_s == real[mid].prediction.overhead_s
    assert middle.bound_s == pytest.approx(real[mid].solver.best_bound_s) and middle.status == SolverStatus.OPTIMAL


def test_a_second_solve_that_fails_leaves_the_first_answer(trace: Trace) -> None:
    """A point's second solve that raises (here: the solver refuses the start) loses nothing: the point keeps its
    first answer and the curve says what failed."""
    lo, hi = min_feasible_budget(trace), trace.static.total + keepall_activation_peak(trace)
    mid = (lo + hi) // 2
    real = {b: solve(trace, b, OPTS) for b in (lo, hi)}
    poor = _worse(trace, mid)

    def refused(budget: int) -> Schedule:
        raise MemschedError("start: refused")

    def refuse(budget: int, seconds: float, start: Schedule):
        return solved_now(refused)(budget)

    first = solved_now(lambda b: real[b] if b != mid else poor)
    c = sweep(trace, first, 3, lo, hi, gap=0.01, refine=refuse, point_limit_s=10.0)
    middle = c.points[1]
    assert middle.overhead_s <= poor.prediction.overhead_s and simulate(trace, middle.schedule).feasible
    assert any("again failed (start: refused); its first answer stands" in n for n in c.notes)


def test_no_second_solve_without_twice_a_points_time(trace: Trace) -> None:
    """Two points on two workers: the sweep's budget is one point's limit, so an open point has no more time
    than its first solve had and is left as it is (a solve from scratch with the same time ends where it did)."""
    lo, hi = min_feasible_budget(trace), trace.static.total + keepall_activation_peak(trace)
    again: list[int] = []

    def resolve(budget: int, seconds: float, start: Schedule):
        again.append(budget)
        return solved_now(lambda b: solve(trace, b, OPTS))(budget)

    c = sweep(
        trace,
        solved_now(lambda b: _worse(trace, b)),
        2,
        lo,
        hi,
        gap=0.0,
        parallel=2,
        refine=resolve,
        point_limit_s=10.0,
    )
    assert again == [] and any(p.status != SolverStatus.OPTIMAL for p in c.points)
    assert not any("solved again" in n for n in c.notes)


def test_a_point_solved_again_in_a_worker_gets_the_time_limit_it_is_given() -> None:
    """The pool's worker holds the sweep's options (30 s here); a point solved again runs with the limit the sweep
    gives it instead, and the solve ends within it."""
    from memsched.service.sweep import _init_worker, _solve_in_worker, _unwrap

    tr = make_trace(60, 3)
    floor = min_feasible_budget(tr)
    budget = floor + (tr.static.total + keepall_activation_peak(tr) - floor) // 5  # not proven at gap 0 in 30 s
    _init_worker(tr.model_dump_json(), SolveOptions(time_limit_s=30.0, gap=0.0))
    sc = _unwrap(budget, _solve_in_worker(budget, 0.5))
    assert sc.budget_bytes == budget and sc.solver.wall_s <= 0.5 * 1.1 + 0.5
    assert simulate(tr, sc).feasible


def test_points_go_where_the_curve_bends(trace: Trace, curve) -> None:
    """Refinement never splits an interval whose ends cost the same (monotone: all between does too), so
    zero-overhead points are the first one and the starting grid's (start, middle, end)."""
    pts = curve.points
    lo, hi = pts[0].budget_bytes, pts[-1].budget_bytes
    grid = {lo, lo + round((hi - lo) / 2), hi}
    zeros = [p.budget_bytes for p in pts if p.overhead_s == 0]
    assert set(zeros[1:]) <= grid
    # The costly part, below the first zero, holds most of the points.
    assert sum(1 for p in pts if p.overhead_s > 0) >= len(pts) - 3


def _fake(points: list[tuple[int, float]], template: Schedule) -> list[CurvePoint]:
    out = []
    for b, ov in points:
        pred = template.prediction.model_copy(update={"overhead_s": ov})
        sc = template.model_copy(update={"prediction": pred, "budget_bytes": b})
        out.append(CurvePoint(budget_bytes=b, schedule=sc, bound_s=ov, status=SolverStatus.OPTIMAL))
    return out


def test_knees(trace: Trace) -> None:
    template = solve(trace, trace.static.total + keepall_activation_peak(trace), OPTS)
    # Steep down to 40, then nearly flat: the corner is the knee.
    corner = _fake([(0, 10.0), (10, 5.0), (20, 1.0), (40, 0.8), (60, 0.6), (80, 0.4), (100, 0.0)], template)
    knees = find_knees(corner)
    assert knees[0].budget_bytes == 20
    assert knees[0].slope_below_s_per_byte == pytest.approx(0.4) and knees[0].slope_above_s_per_byte < 0.02
    # A straight line has no knee.
    assert find_knees(_fake([(x, 10.0 - x / 10) for x in range(0, 101, 10)], template)) == []


def test_bad_ranges(trace: Trace) -> None:
    floor = min_feasible_budget(trace)
    with pytest.raises(MemschedError, match="not below the end"):
        sweep_trace(trace, OPTS, points=3, lo=floor + 10, hi=floor + 10)
    with pytest.raises(InfeasibleBudgetError) as e:
        sweep_trace(trace, OPTS, points=3, lo=1, hi=floor - 1)
    assert e.value.min_feasible_bytes == floor
    with pytest.raises(MemschedError, match="points"):
        sweep_trace(trace, OPTS, points=1)
    # A start below the smallest feasible budget is raised to it, and the answer says so.
    c = sweep_trace(trace, OPTS, points=3, lo=1)
    assert c.points[0].budget_bytes == floor and any("start raised" in n for n in c.notes)


def test_a_range_below_a_keep_recompute_trace_names_the_solves_smallest_budget() -> None:
    """Where the actions leave offload out, the smallest feasible budget lies above offload's: a range wholly below
    it names the one a solve gives (the REST sweep quoted offload's for a CPU trace)."""
    trace = make_trace(6, 3)
    keep_recompute = OPTS.model_copy(update={"actions": [Action.KEEP, Action.RECOMPUTE]})
    with pytest.raises(InfeasibleBudgetError) as solved:
        solve(trace, min_feasible_budget(trace) - 1, keep_recompute)
    assert solved.value.min_feasible_bytes > min_feasible_budget(trace)
    with pytest.raises(InfeasibleBudgetError) as swept:
        sweep_trace(trace, keep_recompute, points=3, lo=1, hi=min_feasible_budget(trace) - 1)
    assert swept.value.min_feasible_bytes == solved.value.min_feasible_bytes


def test_the_wall_time_counts_from_the_callers_start(trace: Trace) -> None:
    """`wall_s` is what the caller waited: from its start (the CLI's process start), the kernels' load and the
    range included (a 2-point CLI sweep of 1 s points printed 1.8 s and took 3.4 s)."""
    began = time.perf_counter()
    c = sweep_trace(trace, OPTS, points=2, started_at=began - 5.0)
    assert 5.0 + (time.perf_counter() - began) + 0.001 >= c.wall_s >= 5.0  # wall_s is rounded to ms


def test_workers_give_the_same_curve(trace: Trace) -> None:
    """Two solver processes solve two budgets at a time; each point is what one solve in this process gives."""
    par = sweep_trace(trace, OPTS, points=5, workers=2)
    assert par.workers == 2 and len(par.points) == 5
    for p in par.points:
        alone = solve(trace, p.budget_bytes, OPTS)
        assert p.overhead_s == pytest.approx(alone.prediction.overhead_s, rel=1e-9, abs=1e-12)


def run(argv, capsys):
    with pytest.raises(SystemExit) as e:
        main([str(a) for a in argv])
    cap = capsys.readouterr()
    return e.value.code, cap.out, cap.err


def test_cli(tmp_path, capsys) -> None:
    tr = tiny_trace([0.01, 0.02, 0.03, 0.02], [0.02, 0.04, 0.06, 0.04], [1000, 2000, 3000, 2000], static=500)
    path = tmp_path / "t.json"
    save_model(tr, path)
    args = ["sweep", path, "-n", 4, "--time-limit", 2, "--workers", 1, "--actions", "keep,offload,recompute"]
    code, out, err = run([*args, "-o", tmp_path / "c.json", "--png", tmp_path / "c.png", "--json"], capsys)
    assert code == 0, err
    doc = json.loads(out)
    assert len(doc["points"]) == 4 and "schedule" not in doc["points"][0]
    saved = json.loads((tmp_path / "c.json").read_text())
    assert Schedule.model_validate(saved["points"][0]["schedule"]).budget_bytes == saved["points"][0]["budget_bytes"]
    assert (tmp_path / "c.png").read_bytes()[:4] == b"\x89PNG"
    code, out, _ = run(args, capsys)
    assert code == 0 and "step time against budget" in out
    code, _, err = run([*args, "--from", "5000", "--to", "4000"], capsys)
    assert code == 2 and "not below the end" in err


@pytest.mark.parametrize("workers", [1, 2])
def test_without_offload_the_start_is_where_keep_and_recompute_fit(trace: Trace, workers: int) -> None:
    """Offload-all's minimum is below what keep and recompute can reach: the solver names the smallest budget
    that fits them, the sweep starts there and says so (with two workers, grid budgets below it are dropped)."""
    opts = SolveOptions(time_limit_s=3.0, gap=0.0, actions=[Action.KEEP, Action.RECOMPUTE])
    c = sweep_trace(trace, opts, points=4, workers=workers)
    assert len(c.points) == 4
    first = c.points[0]
    assert first.budget_bytes > min_feasible_budget(trace) and any("start raised to" in n for n in c.notes)
    assert simulate(trace, first.schedule).feasible and first.schedule.action_counts()["offload"] == 0
    with pytest.raises(InfeasibleBudgetError):
        solve(trace, first.budget_bytes - 1, opts)  # the start is the smallest budget that fits


def test_a_first_point_the_dp_cannot_settle_starts_the_sweep_where_a_plan_is_known_to_fit(trace: Trace) -> None:
    """A budget the exact DP could neither fit nor rule out in a point's time (UnsettledBudgetError, which names the
    best baseline's peak) no longer ends the sweep: it starts at that budget and says why. Below it the solves
    here raise as check_feasible does when its DP runs out of time; above it they are the real solver's."""
    from memsched.errors import UnsettledBudgetError

    known = keepall_activation_peak(trace) + trace.static.total - 1000  # a budget a plan fits: near keep-all

    def solve_or_unsettled(budget: int) -> Schedule:
        if budget < known:
            raise UnsettledBudgetError(f"budget: no plan under {budget} bytes was found or ruled out", known)
        return solve(trace, budget, OPTS)

    c = sweep(trace, solved_now(solve_or_unsettled), 3)
    assert c.lo_bytes == known and all(p.budget_bytes >= known for p in c.points)
    assert any(n.startswith(f"start raised to {known} bytes") and "time limit" in n for n in c.notes), c.notes
    # A point that cannot be settled at the range's end is still an error.
    with pytest.raises(UnsettledBudgetError):
        sweep(trace, solved_now(solve_or_unsettled), 3, hi=known - 1)


def test_an_unsettled_budget_crosses_a_process_boundary() -> None:
    import pickle

    from memsched.errors import UnsettledBudgetError

    e = pickle.loads(pickle.dumps(UnsettledBudgetError("budget: not settled", 123)))
    assert isinstance(e, UnsettledBudgetError) and e.fits_bytes == 123 and str(e) == "budget: not settled"
