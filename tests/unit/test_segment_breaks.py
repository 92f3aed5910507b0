"""Code that saves between two traced layers (Layer.code_after_saves: a norm between an attention and an MLP
traced apart) ends every recompute segment there, because the replay re-runs only the traced layers. The rule
has one home (Trace.segment_last); the DP sweeps, the MILP, the heuristic and the local search keep to it, the
schedule check refuses a plan that does not, and simulate cuts any other plan where the replay would."""

from __future__ import annotations

import dataclasses
import random
import time

import numpy as np
import pytest

from helpers.pricing import assert_brute_force_dp_and_milp_agree, keep_recompute_plans, plan_of
from memsched.errors import ScheduleMismatchError
from memsched.optimizer.budget import budget_between
from memsched.optimizer.decisions import segment_ends, split_at_breaks
from memsched.optimizer.dp import build_problem
from memsched.optimizer.dp.decode import decode
from memsched.optimizer.dp.fifo import fifo_sweep
from memsched.optimizer.dp.lagrange import lagrange_arrays, lagrangian_bound
from memsched.optimizer.heuristic import heuristic
from memsched.optimizer.ilp.model import segments
from memsched.optimizer.link_plan import LinkShares, link_plan
from memsched.optimizer.polish import LocalSearch
from memsched.optimizer.simulate import make_schedule, simulate
from memsched.optimizer.solve import solve
from memsched.optimizer.synthetic import make_trace
from memsched.options import SolveOptions
from memsched.schema import Action, SolverRecord, SolverStatus, Trace, check_schedule

FAR = time.perf_counter() + 10**6  # a deadline that never comes


def _with_breaks(tr: Trace, breaks: list[int]) -> Trace:
    tr = tr.model_copy(deep=True)
    for i in breaks:
        tr.layers[i].code_after_saves = True
    return tr


def _random_breaks(tr: Trace, seed: int) -> Trace:
    rng = random.Random(seed)
    return _with_breaks(tr, [i for i in range(tr.n - 1) if rng.random() < 0.5])


def _crosses(tr: Trace, decisions: list) -> bool:
    return split_at_breaks(tr, decisions) != decisions


def test_segment_last_is_the_first_break_from_each_layer_on() -> None:
    tr = _with_breaks(make_trace(6, 1), [1, 3])
    assert tr.segment_last() == [1, 1, 3, 3, 5, 5]
    assert make_trace(6, 1).segment_last() == [5] * 6


def test_split_cuts_a_segment_after_each_break_and_leaves_the_rest() -> None:
    tr = _with_breaks(make_trace(6, 1), [1, 3])
    # One segment over layers 0..4: the replay can run it as [0..1], [2..3], [4].
    assert segment_ends(split_at_breaks(tr, plan_of("SCCCCK"))) == {0: 1, 2: 3, 4: 4}
    legal = plan_of("SCSCSK")
    assert split_at_breaks(tr, legal) == legal


def test_a_schedule_with_a_segment_across_a_break_is_refused_and_says_why() -> None:
    plain = make_trace(4, 2)
    tr = _with_breaks(plain, [1])
    record = SolverRecord(backend="test", status=SolverStatus.HEURISTIC)
    crossing = make_schedule(plain, plan_of("SCCK"), budget_between(plain, 1.0), "test", record)
    crossing.trace_hash = tr.content_hash()
    with pytest.raises(ScheduleMismatchError, match=r"past layer 1 .*code_after_saves.*solve the schedule again"):
        check_schedule(crossing, tr)
    # Priced on the trace that has the break, the same decisions are the segments the replay runs.
    sim = simulate(tr, plan_of("SCCK"), budget_between(tr, 1.0))
    assert segment_ends(sim.decisions) == {0: 1, 2: 2}


def test_the_break_enters_the_hash_only_where_set() -> None:
    plain = make_trace(4, 2)
    assert _with_breaks(plain, []).content_hash() == plain.content_hash()
    assert _with_breaks(plain, [1]).content_hash() != plain.content_hash()


@pytest.mark.parametrize("seed", range(8))
def test_dp_and_milp_equal_brute_force_over_the_plans_the_replay_runs(seed: int) -> None:
    # Brute force prices every keep / recompute plan as simulate cuts it: the legal plans. The DP and the MILP
    # search only those; with the DP's segments unrestricted, seeds 1 and 7 of this family fail.
    tr = make_trace(5, 500 + seed)
    tr.device.concurrent_copies = False
    tr = _random_breaks(tr, seed)
    assert_brute_force_dp_and_milp_agree(tr)


@pytest.mark.parametrize("seed", range(6))
def test_the_planners_emit_no_segment_across_a_break(seed: int) -> None:
    tr = _random_breaks(make_trace(8, 700 + seed, dag=seed % 2 == 0), seed)
    assert all(b <= tr.segment_last()[a] for a, b in segments(tr, tr.n))
    for frac in (0.1, 0.4):
        budget = budget_between(tr, frac)
        p = build_problem(tr, budget)
        res = fifo_sweep(p, FAR, float("inf"))
        for _cost, label in res.finals[:3]:
            assert not _crosses(tr, decode(tr, p, res, label))
        heur = heuristic(tr, budget, frozenset(Action))
        assert not _crosses(tr, heur.decisions)
        if heur.sim.feasible:
            found = LocalSearch(tr, budget, heur.decisions, seed=seed).run(0.3).sim
            assert not _crosses(tr, found.decisions)


def test_every_layer_its_own_segment_where_every_gap_saves() -> None:
    # A sub-module trace (attention and MLP apart): code saves in every gap, so every segment is one layer.
    tr = _with_breaks(make_trace(12, 9), list(range(11)))
    for frac in (0.05, 0.3):
        sched = solve(tr, budget_between(tr, frac), SolveOptions(time_limit_s=5))
        check_schedule(sched, tr)
        assert all(a.recompute_group in (None, i) for i, a in enumerate(sched.actions))
        assert any("after the 11 layer(s)" in d and "code_after_saves" in d for d in sched.solver.details)
    plain = solve(make_trace(12, 9), budget_between(tr, 0.3), SolveOptions(time_limit_s=2))
    assert not any("code_after_saves" in d for d in plain.solver.details)


@pytest.mark.parametrize("seed", range(12))
def test_the_rows_lagrangian_keeps_to_the_breaks_and_stays_a_bound(seed: int) -> None:
    # Keep and recompute plans as the replay runs them (brute force through simulate, which cuts at the breaks):
    # the Lagrangian that knows the breaks (its segment arcs end there) stays below their optimum.
    tr = make_trace(5, 900 + seed, dag=seed % 2 == 0)
    tr.device.concurrent_copies = False
    marked = _with_breaks(tr, list(range(tr.n - 1)) if seed % 4 == 0 else [i for i in range(tr.n - 1) if i % 2])
    for frac in (0.05, 0.3, 0.5):
        budget = budget_between(marked, frac)
        sims = [simulate(marked, ds, budget, with_events=False) for ds in keep_recompute_plans(tr.n)]
        opt = min((s.overhead_s for s in sims if s.feasible), default=None)
        if opt is None or opt <= 0.0:
            continue
        assert _rows_bound(marked, budget, opt) <= opt * (1 + 1e-9) + 1e-12


def _rows_bound(tr: Trace, budget: int, upper: float) -> float:
    p = build_problem(tr, budget)
    p = dataclasses.replace(p, offload=[[] for _ in range(p.n)])
    return lagrangian_bound(lagrange_arrays(p, tr), upper, FAR, max_iterations=3000).bound_s


@pytest.mark.parametrize("seed", range(6))
def test_the_link_plan_starts_a_segment_after_each_break(seed: int) -> None:
    # Shares that recompute every layer: the family's member is one run of recomputed layers, which the link plan
    # cuts at each break (KIND_START) before it scores it: its answer is the segments the replay runs.
    tr = _random_breaks(make_trace(10, 40 + seed), seed)
    shares = LinkShares(recompute=np.ones(tr.n), offload=np.zeros(tr.n), steps=1)
    sim = link_plan(tr, budget_between(tr, 1.0), shares, frozenset({Action.KEEP, Action.RECOMPUTE}))
    assert sim is not None and sim.feasible and not _crosses(tr, sim.decisions)
    assert segment_ends(sim.decisions) == {
        a: tr.segment_last()[a] for a in [0, *(i + 1 for i in range(tr.n - 1) if tr.layers[i].code_after_saves)]
    }
