"""HiGHS in a process of its own (optimizer/ilp/highs_process.py): it solves what HiGHS solves in-process, a child
that runs past its limit and grace is killed (HiGHS 1.12 does not stop everywhere at its own limit), and one that
fails says why."""

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest

pytest.importorskip("highspy", reason="the highs extra (pip install memsched[highs]) is not installed")

from memsched.optimizer.ilp import highs_process
from memsched.optimizer.ilp.highs_process import HighsJob, run_highs


def _knapsack() -> HighsJob:
    """max 5a + 4b + 3c (as min of the negation) with 2a + 3b + c <= 4, binaries: the optimum is a + c = 8."""
    return HighsJob(
        col_cost=[-5.0, -4.0, -3.0],
        col_lower=[0.0, 0.0, 0.0],
        col_upper=[1.0, 1.0, 1.0],
        row_lower=[-math.inf],
        row_upper=[4.0],
        start=[0, 3],
        index=[0, 1, 2],
        value=[2.0, 3.0, 1.0],
        binary=[True, True, True],
        options={"mip_rel_gap": 0.0},
        start_values=[0.0, 1.0, 0.0],
    )


def test_the_child_solves_a_knapsack_to_its_optimum() -> None:
    run = run_highs(_knapsack(), 20.0, 1.0)
    assert not run.killed and run.error is None
    assert run.optimal and not run.infeasible
    assert run.objective == pytest.approx(-8.0)
    assert run.values is not None and [round(v) for v in run.values] == [1, 0, 1]
    assert run.dual_bound == pytest.approx(-8.0)


def test_an_infeasible_model_is_reported_as_such() -> None:
    job = _knapsack()
    job.row_lower, job.row_upper = [7.0], [math.inf]  # 2a + 3b + c >= 7: at most 6
    job.start_values = None
    run = run_highs(job, 20.0, 1.0)
    assert not run.killed and run.infeasible and run.values is None


def test_a_child_past_its_limit_and_grace_is_killed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stuck = tmp_path / "stuck.py"
    stuck.write_text("import time\ntime.sleep(60)\n")
    monkeypatch.setattr(highs_process, "CHILD", stuck)
    began = time.perf_counter()
    run = run_highs(_knapsack(), 0.3, 0.5)
    assert run.killed
    assert time.perf_counter() - began < 5.0  # the limit and the grace, and the kill: not the child's 60 s


def test_a_child_that_fails_says_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    broken = tmp_path / "broken.py"
    broken.write_text("raise SystemExit('no HiGHS here')\n")
    monkeypatch.setattr(highs_process, "CHILD", broken)
    run = run_highs(_knapsack(), 5.0, 0.5)
    assert not run.killed
    assert run.error is not None and "no HiGHS here" in run.error


def test_a_child_that_cannot_start_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(highs_process.sys, "executable", "/nonexistent/python")
    run = run_highs(_knapsack(), 5.0, 0.5)
    assert not run.killed
    assert run.error is not None and "did not start" in run.error and "--solver cbc" in run.error
