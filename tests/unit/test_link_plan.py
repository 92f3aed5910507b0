"""The link plan: the link windows' Lagrangian's steps recorded and averaged, and the family that rounds them: its
plans fit, are members of the family, beat every member of its first scan, and keep runs of recomputed layers as
one segment; and on a long chain it starts far below the ratio plan."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memsched.optimizer.budget import budget_between
from memsched.optimizer.decisions import KEEP, Decision, offload_all, recompute
from memsched.optimizer.dp import build_problem, lagrange
from memsched.optimizer.dp.lagrange import (
    _PLAN_BLOCK,
    PLAN_CONTINUE,
    PLAN_START,
    LinkLagrangian,
    _spread,
    lagrange_arrays,
)
from memsched.optimizer.dp.problem import relaxed_problem
from memsched.optimizer.link_plan import LinkShares, link_plan
from memsched.optimizer.ratio import ratio_plan
from memsched.optimizer.simulate import simulate
from memsched.optimizer.synthetic import make_trace
from memsched.schema import Action, Trace

FAR = float("inf")
KEEP_RECOMPUTE = frozenset({Action.KEEP, Action.RECOMPUTE})
KEEP_OFFLOAD = frozenset({Action.KEEP, Action.OFFLOAD})


def _link(trace: Trace, budget: int, upper: float) -> LinkLagrangian:
    p = relaxed_problem(build_problem(trace, budget), trace, 32)
    return LinkLagrangian(lagrange_arrays(p, trace), upper)


def _member(trace: Trace, shares: LinkShares, a: float, tail: int, c: float) -> list[Decision]:
    """The family's member (a, tail, c), by its definition: recompute each layer whose recompute share is at least
    a (a run of them one segment), offload whole each other layer before the tail (never the last) whose offload
    share is at least c, keep the rest."""
    out: list[Decision] = []
    start = -1
    for i in range(trace.n):
        if shares.recompute[i] >= a:
            start = i if start < 0 else start
            out.append(recompute(group=start))
            continue
        start = -1
        off = i < min(tail, trace.n - 1) and shares.offload[i] >= c
        out.append(offload_all(trace, i) if off else KEEP)
    return out


def _random_shares(n: int, seed: int) -> LinkShares:
    rng = random.Random(seed)
    rec = [rng.choice([0.0, 0.0, 0.1, 0.3, 0.5, 0.8, 1.0]) for _ in range(n)]
    off = [rng.choice([0.0, 0.2, 0.6, 1.0]) * (1.0 - r) for r in rec]
    return LinkShares(recompute=np.array(rec), offload=np.array(off), steps=1)


def _first_scan(trace: Trace, budget: int, shares: LinkShares) -> list[float]:
    """The overheads of the first scan's members that fit, under 50 layers: every tail at each recompute level
    k / 20, offloading every layer up to the tail (c = 0)."""
    out = []
    # Levels between two share values give the same member: one per distinct recompute set.
    levels = {frozenset(np.flatnonzero(shares.recompute >= k / 20)): k / 20 for k in range(20, 0, -1)}
    for level in levels.values():
        for tail in range(trace.n + 1):
            sim = simulate(trace, _member(trace, shares, level, tail, 0.0), budget, with_events=False)
            if sim.feasible:
                out.append(sim.overhead_s)
    return out


@st.composite
def _cases(draw: st.DrawFn, max_layers: int) -> tuple[Trace, int, int]:
    """A random chain or DAG of 2..max_layers layers, a budget between its least and its keep-all peak, a seed."""
    n, seed = draw(st.integers(2, max_layers)), draw(st.integers(0, 10**6))
    trace = make_trace(n, seed, dag=draw(st.booleans()))
    return trace, budget_between(trace, draw(st.floats(0.0, 0.6))), seed


@settings(max_examples=20, deadline=None)
@given(case=_cases(24))
def test_the_plan_is_a_member_at_least_as_good_as_every_member_of_the_first_scan(case: tuple[Trace, int, int]) -> None:
    # Under 50 layers the first scan tries every tail at each recompute level k / 20, offloading every layer up to
    # the tail (c = 0); the finer scan can only do better, with members of the same family.
    trace, budget, seed = case
    n = trace.n
    shares = _random_shares(n, seed)
    first_scan = _first_scan(trace, budget, shares)
    got = link_plan(trace, budget, shares)
    if got is None:
        assert not first_scan
        return
    assert got.feasible and got.peak_bytes <= budget
    if first_scan:
        assert got.overhead_s <= min(first_scan) * (1 + 1e-9) + 1e-15
    # A member of the family: the recomputed layers are those at or above some level, each run one segment.
    rec = [i for i, d in enumerate(got.decisions) if d.action == Action.RECOMPUTE]
    if rec:
        level = min(shares.recompute[i] for i in rec)
        assert rec == [i for i in range(n) if shares.recompute[i] >= level]
        for i in rec:
            first = i
            while first - 1 in rec:
                first -= 1
            assert got.decisions[i].group == first
    for i, d in enumerate(got.decisions):
        if d.action == Action.OFFLOAD:  # whole (the simulator has filled in its copies' timing)
            assert d.offload_tensors == offload_all(trace, i).offload_tensors and i < n - 1


def test_allowed_actions_and_host_budget() -> None:
    trace = make_trace(30, 3)
    budget = budget_between(trace, 0.2)
    shares = _random_shares(30, 3)
    full = link_plan(trace, budget, shares)
    assert full is not None
    kr = link_plan(trace, budget, shares, KEEP_RECOMPUTE)
    assert kr is None or {d.action for d in kr.decisions} <= KEEP_RECOMPUTE
    ko = link_plan(trace, budget, shares, KEEP_OFFLOAD)
    assert ko is None or {d.action for d in ko.decisions} <= KEEP_OFFLOAD
    host = sum(d.offload_bytes for d in full.decisions if d.action == Action.OFFLOAD)
    if host:
        capped = link_plan(trace, budget, shares, host_budget=host // 2)
        if capped is not None:
            assert sum(d.offload_bytes for d in capped.decisions if d.action == Action.OFFLOAD) <= host // 2


def test_shares_for_another_trace_are_refused() -> None:
    trace = make_trace(10, 1)
    with pytest.raises(ValueError, match="shares for 9 layers, the trace has 10"):
        link_plan(trace, budget_between(trace, 0.3), _random_shares(9, 1))


def test_the_lagrangian_records_a_plan_per_step_and_averages_the_later_half() -> None:
    trace = make_trace(40, 3)
    budget = budget_between(trace, 0.2)
    link = _link(trace, budget, 0.05)
    assert link.shares() is None  # no step yet
    link.run(FAR, max_iterations=3 * _PLAN_BLOCK + 4)
    shares = link.shares()
    assert shares is not None
    # The open block of 4 steps and the two latest whole blocks: the least whole blocks covering half of the steps.
    assert shares.steps == 2 * _PLAN_BLOCK + 4
    assert shares.since == _PLAN_BLOCK
    assert np.all((shares.recompute >= 0) & (shares.offload >= 0) & (shares.recompute + shares.offload <= 1 + 1e-12))
    assert shares.recompute.any() and shares.offload.any()
    # The last step's plan is a plan: a segment's later layers follow its first, an offload is one of the layer's
    # own options.
    plan, opt_ptr = link.plan, link.arrays.opt_ptr
    for i, code in enumerate(plan):
        if code == PLAN_CONTINUE:
            assert i > 0 and plan[i - 1] in (PLAN_START, PLAN_CONTINUE)
        elif code >= 0:
            assert opt_ptr[i] <= code < opt_ptr[i + 1]


def test_on_a_long_chain_it_starts_far_below_the_ratio_plan() -> None:
    # Measured 2026-11-30: 0.0253 s against the ratio plan's 0.0343 s (600 steps); the LP's recompute runs are
    # segments that share their checkpoints, which the ratio plan's one-layer segments are not.
    trace = make_trace(200, 1)
    budget = budget_between(trace, 0.2)
    ratio = ratio_plan(trace, budget)
    assert ratio is not None
    link = _link(trace, budget, ratio.overhead_s)
    link.run(FAR, max_iterations=600)
    shares = link.shares()
    assert shares is not None
    got = link_plan(trace, budget, shares)
    assert got is not None and got.feasible
    assert got.overhead_s < 0.9 * ratio.overhead_s
    assert any(d.action == Action.RECOMPUTE and d.group != i for i, d in enumerate(got.decisions))


def test_spread_orders_every_index_once_each_prefix_spread_over_the_range() -> None:
    assert _spread(1, 8) == [4, 2, 6, 1, 3, 5, 7]
    assert _spread(1, 1) == [] and _spread(1, 2) == [1]
    for lo, hi in ((0, 1), (1, 15), (3, 40)):
        order = _spread(lo, hi)
        assert sorted(order) == list(range(lo, hi))
        # The first k indices leave no gap wider than about (hi - lo) / k uncovered.
        for k in range(1, len(order) + 1):
            marks = sorted([lo - 1, *order[:k], hi])
            assert max(b - a for a, b in itertools.pairwise(marks)) <= 2 * (hi - lo + 1) / k + 1


def test_past_the_block_cap_neighbouring_blocks_merge_and_the_windows_stay_the_recorded_means(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # At 4 blocks kept (not 256), 300 steps: 4 blocks of 32 merge into 2 of 64, 4 of 64 into 2 of 128, then 44
    # steps open. The windows still average the plans recorded over their own steps.
    monkeypatch.setattr(lagrange, "_MAX_PLAN_BLOCKS", 4)
    trace = make_trace(40, 3)
    budget = budget_between(trace, 0.2)
    link = _link(trace, budget, 0.05)
    plans = []
    for it in range(1, 301):
        link.run(FAR, max_iterations=it)
        assert link.iterations == it
        plans.append(link.plan.copy())
    rec = np.array([p <= PLAN_START for p in plans], dtype=float)
    off = np.array([p >= 0 for p in plans], dtype=float)
    windows = link.windows()
    assert [w.steps for w in windows[1:]] == [2 * 2 * _PLAN_BLOCK] and windows[1].since == 128
    assert windows[0].since == 128 and windows[0].steps == 172  # the later half: the last whole block and the open
    for w in windows:
        lo, hi = w.since, w.since + w.steps
        assert np.allclose(w.recompute, rec[lo:hi].mean(axis=0)) and np.allclose(w.offload, off[lo:hi].mean(axis=0))


def test_the_windows_are_the_later_half_then_single_blocks_of_the_recorded_plans() -> None:
    # Step by step, the least priced plan of each step is recorded here; each window's shares are its steps' means.
    trace = make_trace(40, 3)
    budget = budget_between(trace, 0.2)
    link = _link(trace, budget, 0.05)
    assert link.windows() == []
    plans = []
    for it in range(1, 6 * _PLAN_BLOCK + 8):
        link.run(FAR, max_iterations=it)
        assert link.iterations == it  # no plateau stopped it this early
        plans.append(link.plan.copy())
    rec = np.array([p <= PLAN_START for p in plans], dtype=float)
    off = np.array([p >= 0 for p in plans], dtype=float)
    windows = link.windows()
    half = link.shares()
    assert half is not None
    assert windows[0].since == half.since and np.array_equal(windows[0].recompute, half.recompute)
    since = [w.since for w in windows[1:]]
    # Whole blocks 1..5 (not the first, whose prices start at 0, nor the open one), spread: 3, 2, 5, 1, 4, less
    # those whose counts repeat an earlier window's.
    assert set(since) <= {k * _PLAN_BLOCK for k in range(1, 6)} and len(set(since)) == len(since)
    order = [k * _PLAN_BLOCK for k in _spread(1, 6)]
    assert since == [s for s in order if s in since]
    for w in windows:
        lo, hi = w.since, w.since + w.steps
        assert np.allclose(w.recompute, rec[lo:hi].mean(axis=0)) and np.allclose(w.offload, off[lo:hi].mean(axis=0))
    for w in windows[1:]:
        assert w.steps == _PLAN_BLOCK
    keys = {(w.recompute.tobytes(), w.offload.tobytes()) for w in windows}
    assert len(keys) == len(windows)
    for k in _spread(1, 6):  # a block left out repeats a window taken
        lo = k * _PLAN_BLOCK
        block = (rec[lo : lo + _PLAN_BLOCK].mean(axis=0).tobytes(), off[lo : lo + _PLAN_BLOCK].mean(axis=0).tobytes())
        assert block in keys


@settings(max_examples=15, deadline=None)
@given(case=_cases(30))
def test_several_windows_beat_the_first_alone_and_every_window_first_scan(case: tuple[Trace, int, int]) -> None:
    trace, budget, seed = case
    windows = [_random_shares(trace.n, seed + k) for k in range(3)]
    got = link_plan(trace, budget, windows)
    alone = [link_plan(trace, budget, w) for w in windows]
    if got is None:
        assert all(a is None for a in alone)
        return
    assert got.feasible and got.peak_bytes <= budget
    # The first window is scanned as it is alone; each later one's first scan is in the family's scans.
    first = alone[0]
    assert first is None or got.overhead_s <= first.overhead_s * (1 + 1e-9) + 1e-15
    for w in windows:
        for overhead in _first_scan(trace, budget, w):
            assert got.overhead_s <= overhead * (1 + 1e-9) + 1e-15


def test_on_a_dag_a_block_of_the_ascent_rounds_far_below_its_later_half() -> None:
    # Measured 2026-12-02 (400 steps): the later half rounds to 0.02104 s, about the ratio plan's 0.02105 s; the
    # windows to 0.01704 s. The prices circle their best, and the average of a stretch of them is not the LP's.
    trace = make_trace(120, 1, dag=True)
    budget = budget_between(trace, 0.2)
    ratio = ratio_plan(trace, budget)
    assert ratio is not None
    link = _link(trace, budget, ratio.overhead_s)
    link.run(FAR, max_iterations=400)
    half, windows = link.shares(), link.windows()
    assert half is not None and len(windows) > 1
    alone, got = link_plan(trace, budget, half), link_plan(trace, budget, windows)
    assert alone is not None and got is not None and got.feasible
    assert got.overhead_s < 0.9 * alone.overhead_s
