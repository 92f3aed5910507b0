"""Tier 2, the FIFO sweep (optimizer/dp/fifo.py): exact for the simulator's timing, so its optimum equals the
exact optimum (the MILP with W = L = n at gap 0) and its decoded plan simulates to the cost it computed; its
bound holds with merged queues, under pruning and when stopped early; solve() proves stall-heavy real
profiles with it."""

from __future__ import annotations

import random
import time
from dataclasses import replace

import numpy as np
import pytest
from test_dp import _random_trace, exact_optimum

from memsched.optimizer.budget import budget_between, keepall_activation_peak, min_feasible_budget
from memsched.optimizer.dp import build_problem, exact_search, fifo_search
from memsched.optimizer.dp.decode import decode
from memsched.optimizer.dp.fifo import fifo_sweep
from memsched.optimizer.dp.problem import DpProblem
from memsched.optimizer.dp.sweep import SweepResult
from memsched.optimizer.flow.phases import Flow
from memsched.optimizer.simulate import simulate
from memsched.optimizer.solve import solve_report
from memsched.optimizer.synthetic import make_trace
from memsched.options import SolveOptions
from memsched.schema import SolverStatus, Trace

FAR = time.perf_counter() + 10**6  # a deadline that never comes


def _case(seed: int) -> tuple[Trace, int]:
    rng = random.Random(seed)
    trace = _random_trace(rng.randint(2, 8), seed, rng.random() < 0.5, serial=False, latency=rng.random() < 0.5)
    return trace, budget_between(trace, rng.uniform(0.0, 0.9))


def _below(bound: float, opt: float) -> bool:
    return bound <= opt * (1 + 1e-9) + 1e-12


@pytest.mark.parametrize("seed", range(40))
def test_fifo_sweep_finds_the_exact_optimum_and_its_plan_simulates_to_it(seed: int) -> None:
    trace, budget = _case(seed)
    p = build_problem(trace, budget)
    res = fifo_sweep(p, FAR, np.inf)
    opt = exact_optimum(trace, budget)
    assert res.finished and res.finals and res.bound_s is not None
    assert _below(res.bound_s, opt)
    # Equal, not just below: CBC's gap-0 optimum is exact to its tolerances (about 1e-6 relative).
    assert res.bound_s == pytest.approx(opt, rel=1e-5, abs=1e-12)
    # The cheapest plan, decoded into actions and timed by default_timing, costs what the sweep computed:
    # the sweep's waits and the simulator's are the same rules.
    sim = simulate(trace, decode(trace, p, res, res.finals[0][1]), budget)
    assert sim.feasible
    assert sim.overhead_s == pytest.approx(res.finals[0][0], rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("seed", range(40, 52))
def test_merged_queues_still_bound_the_optimum(seed: int) -> None:
    # Two copies per queue: longer queues merge their oldest copies (optimistic), so the bound must hold.
    trace, budget = _case(seed)
    res = fifo_sweep(build_problem(trace, budget), FAR, np.inf, queue=2)
    assert res.finished and res.bound_s is not None
    assert _below(res.bound_s, exact_optimum(trace, budget))


@pytest.mark.parametrize("seed", range(52, 64))
def test_pruned_and_stopped_sweeps_give_true_bounds(seed: int) -> None:
    trace, budget = _case(seed)
    opt = exact_optimum(trace, budget)
    p = build_problem(trace, budget)
    if opt > 0:
        # A threshold below the optimum: nothing survives, and the threshold itself is the bound.
        low = fifo_sweep(p, FAR, opt * 0.8)
        assert low.finished and not low.finals and low.bound_s == pytest.approx(opt * 0.8)
        # Just above: the optimum is found.
        high = fifo_sweep(p, FAR, opt * 1.001 + 1e-9)
        assert high.finals and high.finals[0][0] == pytest.approx(opt, rel=1e-5, abs=1e-12)
    # A label cap that stops the sweep part way: the frontier's bound still holds.
    capped = fifo_sweep(p, FAR, np.inf, max_labels=6)
    assert capped.bound_s is not None and _below(capped.bound_s, opt)
    if not capped.finished:
        assert capped.cap_hit


@pytest.mark.parametrize("slow", [0.1, 0.02])
@pytest.mark.parametrize("seed", range(64, 76))
def test_pruning_by_the_copies_waits_keeps_the_optimum_where_links_are_slow(seed: int, slow: float) -> None:
    """Every child, keep, offload or segment, is pruned by the larger of the future-cost table and the waits its
    queued copies force at the end of each pass: with links slowed 10-50x (copies outlast the compute left), a
    sweep pruned just above the unpruned optimum still finds it."""
    _pruned_just_above_the_optimum(seed, slow)


def _pruned_just_above_the_optimum(seed: int, slow: float) -> tuple[DpProblem, float, SweepResult] | None:
    """_case(seed) with both links slowed by `slow`: its problem, the unpruned sweep's optimum, and a sweep pruned
    just above it, which must find it (None where the optimum is 0)."""
    trace, budget = _case(seed)
    trace.device.d2h_bytes_per_s *= slow
    trace.device.h2d_bytes_per_s *= slow
    p = build_problem(trace, budget)
    plain = fifo_sweep(p, FAR, np.inf)
    assert plain.finished and plain.finals
    opt = plain.finals[0][0]
    if opt <= 0.0:
        return None
    high = fifo_sweep(p, FAR, opt * (1 + 1e-6) + 1e-12)
    assert high.finals and high.finals[0][0] == pytest.approx(opt, rel=1e-9, abs=1e-12)
    return p, opt, high


def test_fifo_search_reports_a_stop_and_a_bound() -> None:
    trace, budget = _case(7)
    out = fifo_search(trace, budget, time.perf_counter() - 1.0, incumbent_s=1.0, gap=0.0)
    assert out.timed_out and "stopped" in out.message
    assert out.bound_s is not None and _below(out.bound_s, exact_optimum(trace, budget))


@pytest.mark.parametrize("pct", [75, 50, 25])
def test_solve_proves_resnet18_where_the_fluid_bound_is_loose(pct: int) -> None:
    """PipeDream ResNet-18 (batch 256): the optimum stalls, so the fluid bound stays 17-24% below it; the FIFO
    sweep proves the answer within 1% in a few seconds."""
    trace, budget = _resnet18_at(pct)
    fluid = build_problem(trace, budget)
    rec = solve_report(trace, budget, SolveOptions(time_limit_s=10)).schedule.solver
    assert rec.status == SolverStatus.OPTIMAL, rec.message
    assert rec.best_bound_s is not None and rec.objective_s - rec.best_bound_s <= 0.01 * rec.objective_s + 1e-12
    assert "dp-fifo" in " ".join(rec.details)
    assert fluid.future[0, 0] <= rec.best_bound_s


def _resnet18_at(pct: int) -> tuple[Trace, int]:
    """PipeDream ResNet-18 (batch 256) and the budget at `pct`% of keep-all's activations."""
    from helpers import require_pipedream
    from memsched.service.importers import import_pipedream

    trace = import_pipedream(require_pipedream() / "resnet18.graph.txt", 256)
    return trace, max(
        trace.static.total + round(keepall_activation_peak(trace) * pct / 100), min_feasible_budget(trace)
    )


def _without_the_widest_beam_rounds(monkeypatch: pytest.MonkeyPatch) -> list[float | None]:
    """The fluid beams' mispricing as if only their two narrowest rounds had run (a busy host, a short limit); the
    list gets every round's real value."""
    from memsched.optimizer.flow import answers

    seen: list[float | None] = []
    real = answers._mispricing

    def narrow_rounds_only(out: object) -> float | None:
        seen.append(real(out))  # type: ignore[arg-type]
        return seen[-1] if len(seen) <= 2 else None

    monkeypatch.setattr(answers, "_mispricing", narrow_rounds_only)
    return seen


def test_fifo_probe_runs_where_the_fluid_optimum_leaves_the_gap_open(monkeypatch: pytest.MonkeyPatch) -> None:
    """The beams' verdict that plans are priced exactly rests on the rounds that ran. On PipeDream ResNet-18 at 75%
    the widest round's plans cost 7.8x their fluid price; where that round does not run (a 2 s limit, or 10 s on
    a busy CI host) the narrow rounds' plans, priced exactly, skipped the FIFO probe, and the solve ended 23.6%
    short of a proof that one 0.01 s FIFO sweep gives. Here the widest round is left out on purpose."""
    seen = _without_the_widest_beam_rounds(monkeypatch)
    trace, budget = _resnet18_at(75)
    rec = solve_report(trace, budget, SolveOptions(time_limit_s=30)).schedule.solver
    assert seen and all(r is None or r <= 1.0 + 5e-3 for r in seen[:2])  # the verdict the probe read: exact
    assert rec.status == SolverStatus.OPTIMAL, rec.message
    assert "dp-fifo" in " ".join(rec.details)


def _pending(times: list[float], sizes: list[int], moment: float) -> int:
    return sum(b for t, b in zip(times, sizes, strict=True) if t > moment)


def test_queue_delay_is_the_least_that_passes_the_pointwise_comparison() -> None:
    """_delay(A, B) is the least delay of A's clock after which A's queue, seen from its clock, holds no more
    bytes than B's at every moment from B's clock on and frees its stream no later: checked against a dense scan
    of moments and delays on 300 random pairs."""
    for seed in range(300):
        _check_queue_pair(random.Random(seed))


def _check_queue_pair(rng: random.Random) -> None:
    from memsched.optimizer.dp.fifo_kernels import QUEUE, _delay

    def queue() -> tuple[np.ndarray, np.ndarray, int]:
        n = rng.randint(0, 4)
        times = sorted(rng.choice([0.5, 1.0, 1.5, 2.0, 2.5, 3.0]) for _ in range(n))
        t, b = np.zeros(QUEUE), np.zeros(QUEUE, np.int64)
        t[:n] = times
        b[:n] = [rng.choice([1, 2, 3]) for _ in range(n)]
        return t, b, n

    (at, ab, an), (bt, bb, bn) = queue(), queue()
    a_clock, b_clock = rng.choice([0.0, 0.75, 1.0, 2.0]), rng.choice([0.0, 0.75, 1.0, 2.0])
    moments = [b_clock + 0.125 * i for i in range(60)]  # every event time below lies on this grid
    b_tail = bt[bn - 1] if bn else -np.inf

    def no_worse(delay: float) -> bool:
        moved = at + (b_clock - a_clock - delay)  # A's times in B's frame, its clock at b_clock
        return (moved[an - 1] if an else -np.inf) <= max(b_tail, b_clock) and all(
            _pending(list(moved[:an]), list(ab[:an]), m) <= _pending(list(bt[:bn]), list(bb[:bn]), m) for m in moments
        )

    least = _delay(at, ab, an, a_clock, bt, bb, bn, b_clock)
    assert least >= 0.0 and no_worse(least)
    for k in range(32):
        delay = 0.125 * k
        assert no_worse(delay) == (delay >= least), (delay, least)


def _labels(cf: list[float], cr: list[float], dq: list[list[tuple[float, int]]]) -> tuple[np.ndarray, ...]:
    """Arrays for dominance_fifo: one held set, the given costs and D2H queues (absolute completion times), no
    H2D copies."""
    from memsched.optimizer.dp.fifo_kernels import QUEUE

    m = len(cf)
    dq_t, dq_b = np.zeros((m, QUEUE)), np.zeros((m, QUEUE), np.int64)
    for i, q in enumerate(dq):
        for e, (t, b) in enumerate(q):
            dq_t[i, e], dq_b[i, e] = t, b
    dq_n = np.array([len(q) for q in dq], np.int64)
    zeros_t, zeros_b = np.zeros((m, QUEUE)), np.zeros((m, QUEUE), np.int64)
    return (
        np.zeros(m, np.int64),
        np.array(cf),
        np.array(cr),
        0.0,
        0.0,
        dq_t,
        dq_b,
        dq_n,
        zeros_t,
        zeros_b,
        np.zeros(m, np.int64),
        np.zeros(m, np.int64),  # retained bytes (the same: sorted)
        0,  # no saved-twice bytes at this boundary
        0,  # and no flagged labels
        1 << 62,  # no work budget
    )


def test_a_label_that_stalled_its_queue_away_dominates_one_that_recomputes_more() -> None:
    """Label 0 stalled 1 s in the forward (its copy, 4 bytes, done at 1.0 on its clock 1.0) and recomputed
    nothing; label 1 did not stall (clock 0) but recomputed 2 s, its copy still pending until 1.0. The future is
    the same from any start time, so label 0, cheaper in all with nothing pending, is no worse in any
    continuation: label 1 goes, although its forward clock is earlier."""
    from memsched.optimizer.dp.fifo_kernels import dominance_fifo

    keep, _, _ = dominance_fifo(*_labels([1.0, 0.0], [0.0, 2.0], [[(1.0, 4)], [(1.0, 4)]]))
    assert keep.tolist() == [True, False]
    # Seen from its own clock its queue is the same as label 1's (1 s left of a 4-byte copy): label 1 goes.
    keep, _, _ = dominance_fifo(*_labels([1.0, 0.0], [0.0, 2.0], [[(2.0, 4)], [(1.0, 4)]]))
    assert keep.tolist() == [True, False]


def test_a_cheaper_label_with_a_later_copy_dominates_when_waiting_for_it_costs_less_than_its_margin() -> None:
    """Label 0 costs 1 s with 2 s of its copy left; label 1 costs 2 s with 1 s left of the same copy. Waiting 1 s
    turns label 0 into label 1 (a wait it may always take: nothing in a pass ends later for an earlier start), so
    label 0 pays at most 1 + 1 = 2 s in any continuation of label 1: label 1 goes. With 2.5 s left, the wait costs
    1.5 s and label 0 may pay up to 2.5 s against label 1's 2: both stay."""
    from memsched.optimizer.dp.fifo_kernels import dominance_fifo

    keep, _, _ = dominance_fifo(*_labels([1.0, 0.0], [0.0, 2.0], [[(3.0, 4)], [(1.0, 4)]]))
    assert keep.tolist() == [True, False]
    keep, _, _ = dominance_fifo(*_labels([1.0, 0.0], [0.0, 2.0], [[(3.5, 4)], [(1.0, 4)]]))
    assert keep.tolist() == [True, True]
    # Cheaper in all with a copy pending 1.5 s past its clock, where the other has none: waiting for it costs
    # 1.5 s, more than the 1 s it saved: both stay. Done by 1.0, the wait costs 1 s and label 1 goes.
    keep, _, _ = dominance_fifo(*_labels([0.0, 1.0], [2.0, 2.0], [[(1.5, 4)], []]))
    assert keep.tolist() == [True, True]
    keep, _, _ = dominance_fifo(*_labels([0.0, 1.0], [2.0, 2.0], [[(1.0, 4)], []]))
    assert keep.tolist() == [True, False]
    # A copy pending 2 s past label 0's clock against none: it must wait 2 s to hold nothing, more than the 1.5 s
    # it saved: both stay.
    keep, _, _ = dominance_fifo(*_labels([0.0, 1.5], [0.0, 0.0], [[(2.0, 3)], []]))
    assert keep.tolist() == [True, True]


@pytest.mark.parametrize("seed", [*range(120), 1433])
def test_the_dominance_filter_keeps_the_optimum_of_an_exhaustive_sweep(seed: int) -> None:
    """With no dominance filter the FIFO sweep enumerates every plan (pruned only by rows that do not fit), so its
    optimum is the exact one. On stall-heavy random traces (links 5-50x slower than the compute, copy latency
    up to 1 ms: where the delay rule drops labels) the filtered sweep finds the same optimum. (Seed 1433 is one
    where a filter that left out the reverse clock's delay lost the optimum: 0.65528 s against 0.65392 s.)"""
    import memsched.optimizer.dp.fifo as fifo

    rng = random.Random(seed)
    trace = make_trace(rng.randint(2, 7), seed, dag=rng.random() < 0.5, copy_latency_s=rng.choice([0.0, 2e-5, 1e-3]))
    slow = rng.choice([5.0, 20.0, 50.0])
    trace.device.h2d_bytes_per_s /= slow
    trace.device.d2h_bytes_per_s /= slow
    p = build_problem(trace, budget_between(trace, rng.uniform(0.0, 0.9)))
    filtered = fifo_sweep(p, FAR, np.inf)
    keep_all = fifo._filter
    try:
        fifo._filter = lambda p, k, lab, max_work: (lab, len(lab))  # type: ignore[assignment]
        exhaustive = fifo_sweep(p, FAR, np.inf)
    finally:
        fifo._filter = keep_all
    assert filtered.finished and exhaustive.finished and exhaustive.bound_s is not None
    assert filtered.bound_s == pytest.approx(exhaustive.bound_s, rel=1e-9, abs=1e-12)
    assert filtered.total_labels <= exhaustive.total_labels


def test_a_label_that_keeps_dominating_stays_in_the_ring_past_many_kept_ones() -> None:
    """The filter compares each label with RING earlier kept ones, in order of use: label A (1 s of backward
    cost, one byte pending) dominates every D label (the same cost, 1,000 bytes pending), which come between
    more than RING kept labels X that none dominates. The X labels cost less than A and D but hold more bytes,
    and trade forward stall against backward cost and their queues' time left against bytes held, so none
    dominates another; A, used by each D, stays at the ring's front and every D goes."""
    from memsched.optimizer.dp.fifo_kernels import RING, dominance_fifo

    many = RING + 44
    cf, cr, dq = [0.0], [1.0], [[(1e-9, 1)]]  # A
    for t in range(many):
        x_cf = t * 1e-3
        cf += [x_cf, 0.0]
        cr += [(many - t) * 1e-3, 1.0]
        dq += [[(x_cf + (1 + t) * 1e-3, 2000 + many - t)], [(1.0, 1000)]]  # X_t, then D_t
    keep, _, _ = dominance_fifo(*_labels(cf, cr, dq))
    assert keep[0] and keep[1::2].all()  # A and every X
    assert not keep[2::2].any()  # every D


def test_a_filter_stops_at_its_work_budget_and_so_by_the_deadline() -> None:
    """The FIFO filter's time grows with the ring labels each label is compared with, which its label count
    does not foresee (bert-large at 75% with a 256-deep scan: 60 s asked, 187 s taken, one filter of 2M labels).
    It counts its work and stops where the clock's budget runs out: the sweep then stops with the labels still
    pending. Where no label dominates another, its scan depth falls to _DEPTH_MIN."""
    from memsched.optimizer.dp.clock import SweepClock
    from memsched.optimizer.dp.fifo import FifoLabels, FifoStop, _filter, _State
    from memsched.optimizer.dp.fifo_kernels import _DEPTH_MIN, _DEPTH_WINDOW, RING, dominance_fifo

    # Labels none of which dominates another (forward stall against backward cost, a copy's time left against
    # its bytes), each compared with the whole ring: about RING units of work a label.
    m = 200_000
    cf = np.linspace(0.0, 1.0, m)
    args = _labels(list(cf), list(1.0 - cf), [[(2.0 * c + 1.0, 10 + m - t)] for t, c in enumerate(cf)])
    keep, done, work = dominance_fifo(*args[:-1], m + 10_000)  # a unit per label, then per comparison
    assert 0 < done < m and work > m + 10_000 and keep[:done].all()
    keep, done, work = dominance_fifo(*args)
    assert done == m and keep.all()
    # No label finds a dominator, so the ring's scan depth falls to its least after a few windows.
    assert work < m * (2 + _DEPTH_MIN) + 8 * _DEPTH_WINDOW * RING
    lab = FifoLabels(
        np.zeros(m, np.int64),
        args[0],
        args[1],
        args[2],
        args[5],
        args[6],
        args[7],
        args[8],
        args[9],
        args[10],
        np.zeros(m, np.int32),
        np.zeros(m, np.int32),
        np.zeros(m, np.int16),
    )
    p = build_problem(*_case(0))
    p = replace(p, fwd_prefix=np.zeros(p.n + 1), bwd_prefix=np.zeros(p.n + 1))
    # The filter stops at the work budget it is given: before its next label once the work passes it (a label
    # adds one unit and one per ring label it is compared with), with the labels' mask incomplete.
    out, work = _filter(p, 0, lab, 500_000)
    assert out is None and 500_000 < work <= 500_000 + 1 + RING
    # The sweep's clock gives it the work that fits in the time left at the rate it has timed (SweepClock.
    # work_budget), and the sweep stops there with the labels still pending. Wall time is not asserted here: the
    # rate differs 10x between machines and loads (1.5e-7 s a unit on a loaded 2-core machine on 2026-11-28,
    # against the 2e-8 prior of real sweeps), and the sort and gather before the kernel took 0.05-0.5 s there.
    clock = SweepClock(time.perf_counter() + 0.05, 1e-12)  # a label count that says: affordable
    clock.s_per_work = 1e-7
    assert 0 < clock.work_budget() <= int(0.05 / 1e-7)
    st = _State(pending=[], compact_at=[], clock=clock)
    with pytest.raises(FifoStop, match="deadline"):
        st.filter(p, 0, lab)


def test_a_probe_out_of_time_gets_the_time_the_fluid_sweep_leaves(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the probe stops at its share and the fluid sweep finishes with a loose bound, the FIFO sweep climbs
    from that bound with the time left and proves the answer (8-layer DAG: fluid optimum 0.00639 s, exact
    0.00786 s)."""

    trace, budget = _case(0)
    fluid = exact_search(trace, budget, FAR, incumbent_s=None, gap=0.0)
    opt = exact_optimum(trace, budget)
    probe_ran: list[bool] = []

    def probe_out_of_time(self: Flow) -> None:
        probe_ran.append(True)
        self.fifo_timed_out = True

    monkeypatch.setattr(Flow, "fifo_probe", probe_out_of_time)
    # (The FIFO sweep after the beams, which would prove this one first, left out: cut too.)
    monkeypatch.setattr(Flow, "fifo_early", lambda self, until: None)
    report = solve_report(trace, budget, SolveOptions(solver="dp", time_limit_s=10, gap=0.0))
    rec = report.schedule.solver
    assert probe_ran and report.dp is not None
    assert rec.status == SolverStatus.OPTIMAL and "from dp-fifo" in " ".join(rec.details), rec.details
    assert rec.objective_s == pytest.approx(opt, rel=1e-5)
    assert fluid.bound_s is not None and fluid.bound_s < 0.9 * opt  # the fluid sweep alone could not prove it


@pytest.mark.parametrize(("seed", "frac", "exact"), [(1, 0.5, True), (2, 0.5, True), (3, 0.3, False)])
def test_the_probe_is_skipped_where_the_fluid_beams_price_their_plans_exactly(
    seed: int, frac: float, exact: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fluid beams' best plans cost in the simulator what the sweep said (12-layer chains at 50%, no latency):
    the FIFO probe is skipped. Where they were mispriced (seed 3 at 30%: stalls decide) it runs."""
    from memsched.optimizer.decisions import ALL_ACTIONS
    from memsched.optimizer.synthetic import make_trace
    from memsched.options import SolveResources

    trace = make_trace(12, seed, copy_latency_s=0.0)
    budget = budget_between(trace, frac)
    flow = Flow(trace, budget, SolveOptions(time_limit_s=2), SolveResources(), time.perf_counter(), ALL_ACTIONS)
    flow.prepare_kernels()
    flow.beam(time.perf_counter() + 1.0)
    assert flow.priced_exactly == exact
    probed: list[float] = []
    monkeypatch.setattr(Flow, "fifo_dp", lambda self, until: probed.append(until))
    flow.fifo_probe()
    assert bool(probed) == (not exact)


@pytest.mark.parametrize("slow", [1.0, 0.2, 0.03])
@pytest.mark.parametrize("seed", range(76, 96))
def test_the_pending_copies_bound_keeps_the_optimum(seed: int, slow: float) -> None:
    """Children are also pruned by the future table's forward / backward rows at their retained bytes plus the
    bytes their queued copies still hold (fifo_kernels.pending_bytes): with links as profiled and slowed 5-33x,
    a sweep pruned just above the unpruned optimum still finds it, and without the pending tables it keeps at
    least as many labels."""
    found = _pruned_just_above_the_optimum(seed, slow)
    if found is None:
        return
    p, opt, high = found
    blind = fifo_sweep(replace(p, future_pending=np.zeros_like(p.future_pending)), FAR, opt * (1 + 1e-6) + 1e-12)
    assert blind.finals and blind.finals[0][0] == pytest.approx(opt, rel=1e-9, abs=1e-12)
    assert blind.total_labels >= high.total_labels


def test_pending_bytes_count_what_the_link_cannot_have_moved() -> None:
    """A copy in flight counts only what the link moves from the clock to its completion; later copies count
    at most what it moves between completions; copies done by the clock count nothing."""
    from memsched.optimizer.dp.fifo_kernels import pending_bytes

    qt = np.array([1.0, 2.0, 5.0, 6.0])
    qb = np.array([100, 400, 100, 300], dtype=np.int64)
    # bw 100 B/s, clock 1.5: the first copy is done; the second has 0.5 s left (50 B); the third took 3 s
    # after it (<= 100 B); the fourth 1 s (100 of its 300 B).
    assert pending_bytes(qt, qb, 4, 1.5, 100.0) == pytest.approx(50.0 + 100.0 + 100.0)
    assert pending_bytes(qt, qb, 4, 0.0, 1000.0) == pytest.approx(900.0)
    assert pending_bytes(qt, qb, 4, 6.0, 100.0) == 0.0
    assert pending_bytes(qt, qb, 2, 0.0, 100.0) == pytest.approx(100.0 + 100.0)


def test_a_dp_probe_outlasting_its_share_runs_on_where_its_pace_says_it_finishes() -> None:
    """The DP probe bets that the fluid optimum is the answer (the beams priced their plans exactly). Cut at its
    share, its sweep's work was lost and the exact DP phase began again later: PipeDream ResNet-50 (batch 256) at
    25% ended a 10 s solve `feasible`, 5.1% short, where the sweep needs 2.7 s (30 s: proven at 4.4 s). Its sweeps
    now stop at their pace towards the exact DP phase's own end instead: here, given no share at all, it proves."""
    from helpers import require_pipedream
    from memsched.optimizer.decisions import ALL_ACTIONS
    from memsched.options import SolveResources
    from memsched.service.importers import import_pipedream

    trace = import_pipedream(require_pipedream() / "resnet50.graph.txt", 256)
    budget = max(trace.static.total + round(keepall_activation_peak(trace) * 0.25), min_feasible_budget(trace))
    flow = Flow(trace, budget, SolveOptions(time_limit_s=60), SolveResources(), time.perf_counter(), ALL_ACTIONS)
    flow.prepare_kernels()
    flow.beam(time.perf_counter() + 3.0)
    assert flow.priced_exactly
    flow.dp_probe(time.perf_counter())  # its share: none
    assert flow.proven(), (flow.bound, flow.best.sim.overhead_s)


@pytest.mark.parametrize("pct", [75, 50])
def test_where_a_beam_misprices_its_plans_the_fifo_sweep_runs_before_the_local_search(
    pct: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PipeDream ResNet-18: some fluid beam's plans cost 1.25-7.8x their fluid price, and the FIFO sweep that
    proves the answer takes 0.01-0.04 s. It came after the local search and the stage bound's finer passes, whose
    shares grow with the limit: proven at 2.6-4.1 s of a 10 s solve, 0.8 s of a 2 s one. It now runs right after
    the beams (Flow.fifo_early): the local search never runs."""
    trace, budget = _resnet18_at(pct)
    polished: list[float] = []
    monkeypatch.setattr(Flow, "polish", lambda self, until: polished.append(until))
    rec = solve_report(trace, budget, SolveOptions(time_limit_s=30)).schedule.solver
    assert rec.status == SolverStatus.OPTIMAL, rec.message
    assert not polished


def test_where_the_fifo_probe_was_skipped_and_the_fluid_optimum_leaves_the_gap_open_the_fifo_sweep_climbs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The FIFO probe is skipped where the beams priced their plans exactly and no fluid optimum is known yet (the
    DP probe cut). The exact DP phase then finds the fluid optimum with the gap open: the FIFO climb after it ran
    only where the probe had stopped, so no FIFO sweep ran at all (PipeDream ResNet-18 at 75%, the widest beam
    round and the DP probe left out here: 23.6% short after the whole limit)."""
    _without_the_widest_beam_rounds(monkeypatch)
    monkeypatch.setattr(Flow, "dp_probe", lambda self, until: None)
    trace, budget = _resnet18_at(75)
    rec = solve_report(trace, budget, SolveOptions(time_limit_s=30)).schedule.solver
    assert rec.status == SolverStatus.OPTIMAL, rec.message
    assert "dp-fifo" in " ".join(rec.details)
