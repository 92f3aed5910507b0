"""The late beam and the race of two local searches (optimizer/solve.py, `Flow.late_beam`, `Flow._race`)."""

from __future__ import annotations

import math
import time

import pytest

from memsched.optimizer.budget import budget_between
from memsched.optimizer.dp.future import FUTURE, LOSS
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


def test_a_dp_seed_skips_the_late_beam_only_where_the_dp_prices_its_plans_exactly(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # A plan of the exact DP that the simulator prices dearer than the incumbent seeds the last local search, which
    # then has the late beam's time (DenseNet-121 at 75%). Where the DP's problem is a relaxation (here: outputs it
    # prices as if kept, `output_relaxed`), its plan is not the bound's, and the late beam runs as well (ResNet-50
    # with every output saved and 100 us copies at 50%: from the DP's plan 0.0220 s, from the late beam's 0.02183 s).
    import dataclasses
    import logging

    monkeypatch.setattr(shares, "LATE_BEAM_MIN_WIDTH", 72)
    trace = make_trace(60, 5)
    flow = _flow(trace, limit_s=30.0)
    flow.prepare_kernels()
    flow.widest_beam = 24
    flow.dp_seed = flow.cands[-1].sim  # a plan dearer than the incumbent

    def skipped() -> bool:
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="memsched.optimizer.flow.answers"):
            flow.late_beam(time.perf_counter() + 3.0)
        return any("late beam skipped: the exact DP" in r.getMessage() for r in caplog.records)

    assert flow.problem().offload_complete and not flow.problem().output_relaxed
    assert skipped()
    relaxed = dataclasses.replace(flow.problem(), output_relaxed=True, _remaps={})
    monkeypatch.setattr(flow, "problem", lambda: relaxed)
    assert not skipped()
    assert any("late beam" in r.getMessage() for r in caplog.records)


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


def test_the_relaxed_fifo_beam_round_that_the_beam_share_cut_runs_before_the_exact_dp() -> None:
    from memsched.optimizer.solve import Step, plan_for

    for solver in (SolverName.AUTO, SolverName.DP):
        steps = [p.step for p in plan_for(solver, 24)]
        # The early STAGE_REFINE and the loss-row beam between.
        assert steps.index(Step.LATE_FIFO_BEAM) == steps.index(Step.DP_FIRST) - 3
        assert steps.index(Step.LOSS_BEAM) == steps.index(Step.DP_FIRST) - 1
        assert Step.LATE_FIFO_BEAM not in [p.step for p in plan_for(solver, shares.LONG_TRACE + 1)]


def test_a_cut_relaxed_fifo_beam_round_runs_again_where_the_gap_is_open(monkeypatch: pytest.MonkeyPatch) -> None:
    # gpt2-medium on an H100 at 50%: its relaxed FIFO beam of 1,024 labels finds the answer (0.034801 s, within 1% of
    # the stage bound), and a slower host's beam share cut it (the answer stayed 0.036449 s). Here the real beam
    # phase runs with its relaxed round of 64 labels cut: that width is left for `late_fifo_beam`, which runs it
    # whole, once, and not once the answer is proven.
    from pathlib import Path

    from memsched.io import load_trace
    from memsched.optimizer.budget import resolve_budget

    trace = load_trace(Path(__file__).resolve().parents[2] / "traces" / "gpt2-medium-bf16-b20-s1024-h100.json")
    options = SolveOptions.from_user(time_limit_s=30.0)
    flow = Flow(
        trace,
        resolve_budget("50%", trace),
        options,
        SolveResources(),
        time.perf_counter(),
        options.allowed_actions(trace),
    )
    flow.prepare_kernels()
    real = Flow._fifo_beam
    calls: list[tuple[int, bool, bool]] = []

    def cut_at_64(self: Flow, until: float, width: int, relaxed: bool = False) -> bool:
        finished = real(self, until, width, relaxed) if not (relaxed and width == 64 and not calls_late) else False
        calls.append((width, relaxed, finished))
        return finished

    calls_late: list[bool] = []
    monkeypatch.setattr(Flow, "_fifo_beam", cut_at_64)
    flow.beam(flow.until(shares.BEAM_SHARE))
    assert (64, True, False) in calls and not any(w > 64 and relaxed for w, relaxed, _ in calls), calls
    assert flow.relaxed_beam_left == 64 and len(flow.relaxed_beam_s) == 1  # the round of 16 finished
    if flow.proven():  # the other rounds proved it: the late round has nothing to do
        flow.late_fifo_beam(flow.until(shares.LATE_FIFO_BEAM_SHARE))
        assert flow.relaxed_beam_left is None and calls[-1] == (64, True, False)
        return
    calls_late.append(True)
    ran = len(calls)
    flow.late_fifo_beam(flow.until(shares.LATE_FIFO_BEAM_SHARE))
    late = calls[ran:]
    assert late[0] == (64, True, True) and flow.relaxed_beam_left is None
    # Wider relaxed rounds may follow (4x each), while they fit the share and the gap is open.
    assert [w for w, _, _ in late] == [64 * 4**i for i in range(len(late))] and all(r for _, r, _ in late)
    ran = len(calls)
    flow.late_fifo_beam(flow.until(shares.LATE_FIFO_BEAM_SHARE))  # once only
    assert len(calls) == ran
    flow.relaxed_beam_left = 256
    flow.bound = flow.best.sim.overhead_s  # proven: no late round
    flow.late_fifo_beam(flow.until(shares.LATE_FIFO_BEAM_SHARE))
    assert len(calls) == ran and flow.relaxed_beam_left is None


@pytest.mark.parametrize(("share_s", "widths"), [(0.5, [256]), (1.2, [256, 1024])])
def test_the_late_relaxed_fifo_beam_widens_while_its_rounds_fit_the_share(
    monkeypatch: pytest.MonkeyPatch, share_s: float, widths: list[int]
) -> None:
    # gpt2-medium on an H100 at 65%, 2 s: the beam's share cut its relaxed round of 64 labels; the late phase's
    # round of 256 finds 0.023139 s, which the stage bound proves, where the ratio plan's 0.025399 s was the answer.
    # Here each round takes 10 ms per 16 labels; the rounds of 16 and 64 finished in the beam's share, the round of
    # 256 is left. In 0.5 s the round of 256 runs (0.16 s predicted and taken) and 1,024 (0.64 s) would not end;
    # in 1.2 s both run, and 4,096 (2.56 s) would not end.
    flow = _flow(make_trace(12, 1))
    flow.bound = 0.0  # the gap is open
    flow.relaxed_beam_s = [0.01, 0.04]
    flow.relaxed_beam_left = 256
    calls: list[int] = []

    def fake(self: Flow, until: float, width: int, relaxed: bool = False) -> bool:
        assert relaxed
        calls.append(width)
        time.sleep(0.01 * width / 16)
        return True

    monkeypatch.setattr(Flow, "_fifo_beam", fake)
    flow.late_fifo_beam(time.perf_counter() + share_s)
    assert calls == widths and flow.relaxed_beam_left is None
    # A round the clock cut ends the phase: its width is not left for another late round.
    monkeypatch.setattr(Flow, "_fifo_beam", lambda self, until, width, relaxed=False: calls.append(width) or False)
    flow.relaxed_beam_s, flow.relaxed_beam_left, calls[:] = [0.01, 0.04], 256, []
    flow.late_fifo_beam(time.perf_counter() + 10.0)
    assert calls == [256] and flow.relaxed_beam_left is None


def test_a_late_relaxed_round_predicted_to_fit_may_run_past_the_share_by_its_margin(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # gpt2-medium on an H100 at 70%, 2 s, both cores busy: the round of 1,024 labels, predicted at 0.45 s from the
    # rounds before (0.05 / 0.15 s), needed 0.86 s and the share's end cut it at 0.83 s: no plan, and the answer
    # stayed the ratio plan's 0.020772 s. Run to its margin it finds 0.018777 s. So a round predicted to fit ends at
    # the later of the share's end and LATE_ROUND_MARGIN x its prediction, never past the solve's deadline.
    flow = _flow(make_trace(12, 1), limit_s=2.0)
    flow.bound = 0.0
    flow.relaxed_beam_s = [0.05, 0.15]
    flow.relaxed_beam_left = 1024
    ends: list[float] = []

    def fake(self: Flow, until: float, width: int, relaxed: bool = False) -> bool:
        ends.append(until - time.perf_counter())
        return False  # cut: the phase ends

    monkeypatch.setattr(Flow, "_fifo_beam", fake)
    share_end = time.perf_counter() + 0.5  # the prediction (0.45 s) fits
    flow.late_fifo_beam(share_end)
    assert ends and ends[0] == pytest.approx(shares.LATE_ROUND_MARGIN * 0.45, abs=0.02)
    ends.clear()
    flow.relaxed_beam_left = 1024
    flow.deadline = time.perf_counter() + 0.7  # the solve's deadline comes first
    flow.late_fifo_beam(time.perf_counter() + 0.5)
    assert ends and ends[0] <= 0.7 - flow.reserve + 1e-3


def test_the_late_beams_width_is_sized_by_w_log_w_with_a_fixed_part_fitted_from_two_probes() -> None:
    from memsched.optimizer.flow.answers import beam_width_for

    # DenseNet-121 at 50%, one core: 384 labels in 0.30 s, 1,536 in 1.02 s, 12,288 in 9.89 s. Sized from the two
    # probes the width for 9.89 s is within 6% of 12,288; linear in w from 1,536 it is 15,500 (a beam that runs past
    # its share), and w ln w from 384 alone 8,600 (half the time left unused).
    densenet = [(384, 0.30), (1536, 1.02)]
    assert beam_width_for(densenet, 9.89) == pytest.approx(12_288, rel=0.06)
    assert beam_width_for(densenet, 9.89) < 1536 * 9.89 / 1.02
    assert beam_width_for(densenet[:1], 9.89) < 9_000
    # One probe: no fixed part, as wide as itself for its own time.
    assert beam_width_for([(1536, 0.98)], 0.98) == 1536
    # PipeDream ResNet-50 with every node output saved at 25%: 384 in 0.27 s, 1,536 in 0.94 s, 3,072 in 1.59 s:
    # the width for 1.59 s stays at or below 3,072 (never past the share).
    assert 2_000 < beam_width_for([(384, 0.27), (1536, 0.94)], 1.59) <= 3_072
    # Wider with more time; none where the fixed part alone takes it; noisy probes (the wider one faster) fall back
    # to w ln w from the widest.
    widths = [beam_width_for([(128, 0.1), (512, 0.3)], s) for s in (0.5, 1.0, 2.0, 4.0)]
    assert widths == sorted(widths) and len(set(widths)) == 4
    assert beam_width_for([(128, 0.1), (512, 0.3)], 0.0) == 0
    assert beam_width_for([(128, 0.4), (512, 0.3)], 0.3) == 512


def _bert_flow(pct: str, limit_s: float = 10.0) -> Flow:
    from pathlib import Path

    from memsched.io import load_trace
    from memsched.optimizer.budget import resolve_budget

    trace = load_trace(Path(__file__).resolve().parents[2] / "traces" / "bert-large-bf16-b32-s512-h100.json")
    options = SolveOptions.from_user(time_limit_s=limit_s)
    allowed = options.allowed_actions(trace)
    return Flow(trace, resolve_budget(pct, trace), options, SolveResources(), time.perf_counter(), allowed)


def test_the_beams_rank_without_the_loss_row_and_a_series_runs_with_it(monkeypatch: pytest.MonkeyPatch) -> None:
    # bert-large's logits make the loss point its peak (16.9 GB against F_23's 13.9 GB): the future table's loss
    # row decides there. The beams see the table without it (their answers as before the row), and `loss_beam`
    # runs the relaxed series once more with it, up to the series' widest round, while the gap is open.
    flow = _bert_flow("55%")
    p = flow.problem()
    assert p.loss_row_decides
    beams = p.for_beams()
    assert beams.future[0, 0] < p.future[0, 0] and (beams.future <= p.future).all()
    assert (beams.future_pending <= p.future_pending).all()
    # With the row: the loss row's table, not the forward rows' reach and holds (future_table's REACH), which only
    # the proving sweeps take.
    with_loss = p.for_beams(loss_row=True)
    assert with_loss.future_pending is p.future_pending and (with_loss.future <= p.future).all()
    assert with_loss.future[0, 0] == max(p.beam_future[FUTURE, 0, 0], p.beam_future[LOSS, 0, 0])
    assert not beams.loss_row_decides and beams.for_beams() is beams
    # Without the loss's own bytes the row decides nothing (a synthetic chain: its loss point is F_{n-1}'s).
    assert not _flow(make_trace(12, 1)).problem().loss_row_decides

    calls: list[tuple[int, bool, bool]] = []

    thresholds: list[float] = []

    def record(
        self: Flow, until: float, width: int, relaxed: bool = False, loss_row: bool = False, threshold: float = -1.0
    ) -> bool:
        calls.append((width, relaxed, loss_row))
        thresholds.append(threshold)
        self.fifo_beam_found_s = 0.05 - 0.01 * len(calls)  # each round a better plan
        return True

    monkeypatch.setattr(Flow, "_fifo_beam", record)
    flow.loss_beam(time.perf_counter() + 5.0)
    assert calls == []  # no relaxed series ran: nothing to rank again
    flow.relaxed_beam_s = [0.01, 0.05, 0.2]  # 16, 64, 256 labels
    flow.loss_beam(time.perf_counter() + 5.0)
    assert calls == [(16, True, True), (64, True, True), (256, True, True)]  # up to the series' widest
    # Each round pruned at the series' own best plan so far, not at the incumbent.
    assert thresholds == pytest.approx([math.inf, 0.04, 0.03])
    flow.bound = flow.best.sim.overhead_s  # proven: nothing to add
    flow.loss_beam(time.perf_counter() + 5.0)
    assert len(calls) == 3


def test_the_exact_dps_plan_gets_its_local_search_before_the_exact_window_milp(monkeypatch: pytest.MonkeyPatch) -> None:
    # Under auto on traces short enough for the exact-window MILP, the MILP took the time left after the exact DP,
    # and the last local search, which starts from the DP's plan, got none (the 80-layer chain at 20%, 10 s: the DP
    # proved 0.012896 s at 5.6 s, CBC ran to the deadline, the answer stayed 0.013339 s; with 90 s the search from
    # the DP's plan proves 0.013010 s in 0.46 s). So that search comes first (`Flow.seed_polish`).
    import dataclasses

    from memsched.optimizer.solve import Step, plan_for

    steps = [p.step for p in plan_for(SolverName.AUTO, 80)]
    assert steps[-3:] == [Step.SEED_POLISH, Step.MILP, Step.POLISH]
    assert Step.SEED_POLISH not in [p.step for p in plan_for(SolverName.AUTO, 101)]
    trace = make_trace(40, 3)
    flow = _flow(trace)
    flow.bound = 0.0
    seed = max((c.sim for c in flow.cands), key=lambda sim: sim.overhead_s)
    searched: list[float] = []
    monkeypatch.setattr(flow, "polish", searched.append)
    flow.seed_polish(time.perf_counter() + 1.0)
    assert searched == []  # no plan of the DP's waiting
    flow.dp_seed = seed
    relaxed = dataclasses.replace(flow.problem(), output_relaxed=True, _remaps={})
    exact = flow.problem()
    monkeypatch.setattr(flow, "problem", lambda: relaxed)
    flow.seed_polish(time.perf_counter() + 1.0)
    assert searched == []  # the DP's plan is a relaxation's: the MILP keeps its time
    monkeypatch.setattr(flow, "problem", lambda: exact)
    flow.seed_polish(time.perf_counter() + 1.0)
    assert len(searched) == 1
    flow.bound = flow.best.sim.overhead_s  # proven: nothing to search for
    flow.seed_polish(time.perf_counter() + 1.0)
    assert len(searched) == 1
