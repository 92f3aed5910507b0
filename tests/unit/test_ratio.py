"""The ratio plan: the best member of its family by brute force, within the budget, the host budget and the
allowed actions, and a candidate of every solve."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memsched.optimizer.budget import budget_between
from memsched.optimizer.decisions import KEEP, offload_all, recompute
from memsched.optimizer.ratio import _recompute_order, ratio_plan
from memsched.optimizer.simulate import checkpoint_input_bytes, external_input_bytes, simulate
from memsched.optimizer.synthetic import make_trace
from memsched.options import SolveOptions
from memsched.schema import Action

KEEP_RECOMPUTE = frozenset({Action.KEEP, Action.RECOMPUTE})
KEEP_OFFLOAD = frozenset({Action.KEEP, Action.OFFLOAD})


def _members(trace, budget, offload=True, host_budget=None):  # type: ignore[no-untyped-def]
    """Every member of the family, simulated by the Python simulator: (overhead, k, -tail) of those that fit."""
    order = _recompute_order(trace)
    out = []
    for tail in range(trace.n + 1) if offload else [trace.n]:
        for k in range(len(order) + 1):
            chosen = set(order[:k])
            decisions = [
                recompute()
                if i in chosen
                else offload_all(trace, i)
                if offload and i < min(tail, trace.n - 1)
                else KEEP
                for i in range(trace.n)
            ]
            sim = simulate(trace, decisions, budget, with_events=False)
            host = sum(d.offload_bytes for d in decisions if d.action == Action.OFFLOAD)
            if sim.feasible and (host_budget is None or host <= host_budget):
                out.append((sim.overhead_s, k, -tail))
    return out


def _greedy_order(trace):  # type: ignore[no-untyped-def]
    """_recompute_order by its definition, one full scoring per pick: the layer of least re-run per byte freed,
    where producers an earlier pick's checkpoint holds cost nothing (ties: the lower index)."""
    held: set[int] = set()
    left = set(range(trace.n))
    order = []
    while True:
        best = None
        for i in sorted(left):
            layer = trace.layers[i]
            holds = sum(checkpoint_input_bytes(trace, j) for j in set(layer.deps) if j not in held)
            freed = layer.saved_bytes - holds - external_input_bytes(trace, i)
            if freed > 0 and (best is None or layer.rerun_s / freed < best[0]):
                best = (layer.rerun_s / freed, i)
        if best is None:
            return order
        order.append(best[1])
        left.discard(best[1])
        held |= set(trace.layers[best[1]].deps)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(2, 60), seed=st.integers(0, 10**6), dag=st.booleans())
def test_the_recompute_order_picks_by_bytes_freed_given_what_is_held(n: int, seed: int, dag: bool) -> None:
    trace = make_trace(n, seed, dag=dag)
    assert _recompute_order(trace) == _greedy_order(trace)


def test_a_held_producer_frees_its_other_readers() -> None:
    # Layer 2 reads layer 0's 40 MiB output (a skip) besides layer 1's 1 MiB, and saves 30 MiB: recomputed alone
    # it would hold more than it frees. Layer 1 (64 MiB saved, reading layer 0) is picked first, and then its
    # checkpoint holds layer 0's output already: layer 2 holds only layer 1's, frees 29 MiB, and is picked too.
    mib = 2**20
    base = make_trace(4, 1, dag=False)
    sizes = {0: (8, 40), 1: (64, 1), 2: (30, 4), 3: (8, 4)}  # layer: (saved MiB, output MiB)
    layers = []
    for i, lay in enumerate(base.layers):
        saved, out = sizes[i]
        deps = [0, 1] if i == 2 else [i - 1] if i else []
        layers.append(
            lay.model_copy(
                update={
                    "saved_bytes": saved * mib,
                    "saved_tensor_bytes": [saved * mib],
                    "output_bytes": out * mib,
                    "input_bytes": sum(sizes[j][1] for j in deps) * mib if deps else lay.input_bytes,
                    "deps": deps,
                }
            )
        )
    trace = base.model_copy(update={"layers": layers})
    trace = type(trace).model_validate(trace.model_dump())
    order = _recompute_order(trace)
    assert order == _greedy_order(trace)
    assert 2 in order and order.index(1) < order.index(2)
    alone = layers[2].saved_bytes - checkpoint_input_bytes(trace, 0) - checkpoint_input_bytes(trace, 1)
    assert alone <= 0


@settings(max_examples=25, deadline=None)
@given(n=st.integers(2, 24), seed=st.integers(0, 10**6), dag=st.booleans(), frac=st.floats(0.0, 0.6))
def test_the_best_member_by_brute_force(n: int, seed: int, dag: bool, frac: float) -> None:
    # Under 32 candidate layers and 50 layers the scans try every (k, tail), so they must find the brute force's
    # best.
    trace = make_trace(n, seed, dag=dag)
    budget = budget_between(trace, frac)
    members = _members(trace, budget)
    got = ratio_plan(trace, budget)
    if not members:
        assert got is None
        return
    assert got is not None and got.feasible and got.peak_bytes <= budget
    assert got.overhead_s == pytest.approx(min(members)[0], rel=1e-9, abs=1e-12)
    # Only whole offloads and recompute segments of one layer.
    for d in got.decisions:
        assert d.action != Action.RECOMPUTE or d.group == -1


def test_a_long_chain_starts_far_below_the_greedy() -> None:
    from memsched.optimizer.heuristic import heuristic

    trace = make_trace(400, 1)
    budget = budget_between(trace, 0.05)
    got = ratio_plan(trace, budget)
    assert got is not None and got.feasible
    assert got.overhead_s < 0.8 * heuristic(trace, budget).sim.overhead_s
    # It splits the work: the link carries what it can, and recompute frees the rest.
    actions = [d.action for d in got.decisions]
    assert actions.count(Action.OFFLOAD) > trace.n // 4 and actions.count(Action.RECOMPUTE) > 0


def test_allowed_actions_and_host_budget() -> None:
    trace = make_trace(30, 3)
    budget = budget_between(trace, 0.2)
    assert ratio_plan(trace, budget, KEEP_OFFLOAD) is None  # no recompute: the family is offload-all (a baseline)
    kr = ratio_plan(trace, budget, KEEP_RECOMPUTE)
    if kr is not None:
        assert {d.action for d in kr.decisions} <= KEEP_RECOMPUTE
        assert kr.overhead_s == pytest.approx(min(_members(trace, budget, offload=False))[0])
    full = ratio_plan(trace, budget)
    assert full is not None
    host = sum(d.offload_bytes for d in full.decisions if d.action == Action.OFFLOAD)
    capped = ratio_plan(trace, budget, host_budget=host // 2)
    members = _members(trace, budget, host_budget=host // 2)
    if not members:
        assert capped is None
    else:
        assert capped is not None
        assert sum(d.offload_bytes for d in capped.decisions if d.action == Action.OFFLOAD) <= host // 2
        assert capped.overhead_s == pytest.approx(min(members)[0])


def test_the_solve_never_answers_worse_than_the_ratio_plan() -> None:
    from memsched.optimizer.solve import solve_report

    trace = make_trace(300, 2)
    budget = budget_between(trace, 0.05)
    plan = ratio_plan(trace, budget)
    assert plan is not None
    report = solve_report(trace, budget, SolveOptions(solver="heuristic"))
    assert report.schedule.prediction.overhead_s <= plan.overhead_s + 1e-12
