"""The late beam and the race of two local searches (optimizer/solve.py, `Flow.late_beam`, `Flow._race`)."""

from __future__ import annotations

import time

import pytest

from memsched.optimizer.budget import budget_between
from memsched.optimizer.flow import shares
from memsched.optimizer.flow.phases import Flow
from memsched.optimizer.polish import LocalSearch, PolishResult
from memsched.optimizer.synthetic import make_trace
from memsched.options import SolveOptions, SolveResources, SolverName
from memsched.schema import Trace


def _flow(trace: Trace, limit_s: float = 10.0) -> Flow:
    """A Flow on `trace` at 20%, as solve() builds it, holding only the heuristic's and the baselines' plans."""
    options = SolveOptions.from_user(time_limit_s=limit_s)
    allowed = options.allowed_actions(trace)
    return Flow(trace, budget_between(trace, 0.2), options, SolveResources(), time.perf_counter(), allowed)


@pytest.mark.parametrize(("n_layers", "late"), [(149, False), (150, True), (400, True), (500, True), (501, False)])
def test_a_late_beam_runs_before_the_last_local_search_on_150_to_500_layers(n_layers: int, late: bool) -> None:
    from memsched.optimizer.solve import Step, plan_for

    for solver in (SolverName.AUTO, SolverName.DP):
        steps = [p.step for p in plan_for(solver, n_layers)]
        assert (Step.LATE_BEAM in steps) == late
        if late:
            assert steps[-2:] == [Step.LATE_BEAM, Step.POLISH]
    # A backend asked for by name gets the time after the DP: no late beam.
    assert Step.LATE_BEAM not in [p.step for p in plan_for(SolverName.CBC, 400)]


def test_a_race_gives_both_searches_turns_and_keeps_what_either_finds() -> None:
    trace = make_trace(40, 3)
    flow = _flow(trace)
    start = flow.best.sim.decisions
    flow._search = LocalSearch(trace, flow.budget, start, seed=1)
    flow._rival = LocalSearch(trace, flow.budget, start, seed=2)
    main, rival = flow._search, flow._rival
    flow.bound = 0.0  # nothing proven: the race runs to its deadline unless a search stops by itself
    flow._race(time.perf_counter() + 4 * shares.RACE_TURN_S, None)
    assert main.evaluations > 0 and rival.evaluations > 0
    assert flow.best.sim.overhead_s <= min(main.best.overhead_s, rival.best.overhead_s) + 1e-15
    assert flow._search_at is main.best  # a later local search goes on from the incumbent's own search


def test_a_late_beam_pruned_at_a_poor_incumbent_seeds_a_rival_search(monkeypatch: pytest.MonkeyPatch) -> None:
    # The heuristic's plan on a 60-layer chain at 20% is far from the optimum: a beam of hundreds of labels
    # pruned at it finds a cheaper plan, which joins the candidates and seeds the rival search. (At least 72
    # labels here, 3x the probe's, not 512: the machine may be loaded, and a 60-layer beam is cheap.)
    monkeypatch.setattr(shares, "LATE_BEAM_MIN_WIDTH", 72)
    trace = make_trace(60, 5)
    flow = _flow(trace, limit_s=30.0)
    flow.prepare_kernels()  # as solve() does first: the probe is timed, and loading the kernels is not its time
    before = flow.best.sim.overhead_s
    flow.widest_beam = 24  # as if `beam` had run one narrow round
    flow.late_beam(time.perf_counter() + 3.0)
    assert flow._rival is not None
    assert any(c.name == "dp-beam" for c in flow.cands)
    assert flow.best.sim.overhead_s < before
    assert flow._rival.ref.decisions == next(c for c in flow.cands if c.name == "dp-beam").sim.decisions


def test_no_late_beam_without_a_finished_beam_round_or_once_proven() -> None:
    trace = make_trace(60, 5)
    flow = _flow(trace)
    flow.late_beam(time.perf_counter() + 3.0)  # `beam` never ran
    assert flow._rival is None
    flow.widest_beam = 24
    flow.bound = flow.best.sim.overhead_s  # proven
    flow.late_beam(time.perf_counter() + 3.0)
    assert flow._rival is None


def test_a_trailing_rival_that_finds_nothing_leaves_the_race(monkeypatch: pytest.MonkeyPatch) -> None:
    # The rival starts from the dearest candidate (a baseline's plan) and (patched) finds nothing in its turns:
    # after RACE_PATIENCE turns it leaves, and the incumbent's search gets every later turn.
    trace = make_trace(40, 3)
    flow = _flow(trace)
    flow._search = LocalSearch(trace, flow.budget, flow.best.sim.decisions)
    flow._rival = LocalSearch(trace, flow.budget, flow.cands[-1].sim.decisions)
    main, rival = flow._search, flow._rival
    assert rival.found_s > main.found_s
    turns = {"main": 0, "rival": 0}
    main_run = main.run

    def rival_run(limit_s: float, target_s: float | None = None) -> object:
        turns["rival"] += 1
        return PolishResult(rival.best, 0, False)

    def counted_main(limit_s: float, target_s: float | None = None) -> object:
        turns["main"] += 1
        return main_run(limit_s, target_s)

    monkeypatch.setattr(rival, "run", rival_run)
    monkeypatch.setattr(main, "run", counted_main)
    flow.bound = 0.0
    flow._race(time.perf_counter() + 6 * shares.RACE_TURN_S, None)
    assert turns["rival"] == shares.RACE_PATIENCE
    assert turns["main"] >= shares.RACE_PATIENCE + 2 or main.finished


def test_a_dp_seeds_search_that_passes_the_incumbent_races_the_incumbents_basin() -> None:
    # The exact DP's plan gets a local search of its own first (`polish`, DP_SEED_SHARE). Where that search passes
    # the incumbent, the incumbent's basin would be left unsearched: a search from the incumbent races it.
    trace = make_trace(40, 3)
    flow = _flow(trace)
    flow.bound = 0.0  # nothing proven: the race runs to its deadline unless a search stops by itself
    incumbent = flow.best.sim
    seed = max((c.sim for c in flow.cands), key=lambda sim: sim.overhead_s)  # a plan of another basin, dearer
    assert seed.overhead_s > incumbent.overhead_s
    flow.dp_seed = seed
    flow.polish(time.perf_counter() + 8 * shares.RACE_TURN_S)
    assert flow.best.sim.overhead_s < incumbent.overhead_s  # the seed's search passed the incumbent
    rival = flow._rival
    assert rival is not None and rival.ref.decisions == incumbent.decisions and rival.evaluations > 0
    assert flow.best.sim.overhead_s <= min(flow._search.best.overhead_s, rival.best.overhead_s) + 1e-15


def test_a_local_search_that_stops_by_itself_leaves_its_time_to_new_ones_until_they_find_nothing() -> None:
    # A search stops by itself once its kicks find nothing for _MAX_STALE_RESTARTS in a row; in the solve's last
    # time, with the gap open, new searches from the best plan, each with its own seed, take the time, until
    # MAX_FRUITLESS_RESTARTS in a row find nothing better (a 10-layer DAG's searches stop within a fraction of a
    # second, and its plans are soon exhausted: the call ends long before its 30 s).
    trace = make_trace(10, 3, dag=True)
    flow = _flow(trace)
    flow.bound = 0.0  # nothing proven, and nothing will be: the overhead stays above 0
    began = time.perf_counter()
    flow._polish_from(flow.best.sim, 30.0, None, restart=True)
    assert flow._restarts >= shares.MAX_FRUITLESS_RESTARTS and flow.best.sim.overhead_s > 0
    assert time.perf_counter() - began < 15.0
    assert flow._search is not None and flow._search.finished
    # Not the solve's last time: the search that stopped by itself is not started again.
    flow = _flow(trace)
    flow.bound = 0.0
    flow._polish_from(flow.best.sim, 30.0, None)
    assert flow._restarts == 0
