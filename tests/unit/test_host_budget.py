"""The host-memory budget (SolveOptions.host_budget): brute force over every plan of tiny traces agrees with the
solver's optimum, its bound and its smallest host budget; the heuristic, the local search and every candidate
stay within it; the simulator's host peak; the pinned pool's limit; the option's hash and CLI flag."""

from __future__ import annotations

import json

import pytest
import torch

from helpers.pricing import every_action_plan
from memsched.api.crud import cache_key
from memsched.cli import main
from memsched.errors import InfeasibleHostBudgetError
from memsched.optimizer.budget import budget_between
from memsched.optimizer.decisions import ALL_ACTIONS, KEEP, offload_all, recompute
from memsched.optimizer.heuristic import heuristic
from memsched.optimizer.ilp.model import build_model
from memsched.optimizer.polish import polish
from memsched.optimizer.simulate import host_peak_bytes, host_stage_bytes, simulate
from memsched.optimizer.solve import solve_report
from memsched.optimizer.synthetic import make_trace
from memsched.options import SolveOptions
from memsched.runtime.pool import HostBudgetExceeded, HostBufferPool
from memsched.schema import Action, Schedule, SolverStatus, Trace


def _brute(trace: Trace, budget: int) -> list[tuple[float, int]]:
    """(overhead, host peak) of every plan that fits the device budget."""
    out = []
    for plan in every_action_plan(trace):
        sim = simulate(trace, plan, budget, with_events=False)
        if sim.feasible:
            out.append((sim.overhead_s, sim.host_peak_bytes))
    return out


CASES = [(seed, frac) for seed in range(6) for frac in (1.0, 0.5, 0.25, 0.0)]


@pytest.fixture(scope="module")
def brute_cases() -> dict[int, tuple[Trace, int, list[tuple[float, int]]]]:
    out = {}
    for seed in range(6):
        tr = make_trace(4, seed, dag=seed % 2 == 0)
        budget = budget_between(tr, 0.3)
        out[seed] = (tr, budget, _brute(tr, budget))
    return out


@pytest.mark.parametrize(("seed", "frac"), CASES)
def test_optimum_bound_and_smallest_host_budget_agree_with_brute_force(brute_cases, seed: int, frac: float) -> None:
    tr, budget, plans = brute_cases[seed]
    free = min(plans)
    host = int(free[1] * frac)
    within = [p for p in plans if p[1] <= host]
    for solver in ("auto", "dp"):
        options = SolveOptions(solver=solver, gap=0.0, time_limit_s=20, host_budget=host)
        if not within:
            with pytest.raises(InfeasibleHostBudgetError) as e:
                solve_report(tr, budget, options)
            # The smallest host budget that works, to the byte, and said to be proven.
            assert e.value.min_host_bytes == min(h for _, h in plans) and e.value.proven
            assert e.value.budget_bytes == budget and e.value.host_budget_bytes == host
            assert f"({e.value.min_host_bytes} bytes)" in str(e.value) and "--host-budget" in str(e.value)
            continue
        best = min(within)[0]
        sc = solve_report(tr, budget, options).schedule
        sim = simulate(tr, sc)
        assert sim.feasible and sim.host_peak_bytes <= host
        assert sc.prediction.host_peak_bytes == sim.host_peak_bytes and sc.host_budget_bytes == host
        assert sc.solver.best_bound_s is not None and sc.solver.best_bound_s <= best * (1 + 1e-9) + 1e-12
        assert sim.overhead_s >= best * (1 - 1e-9) - 1e-12
        if solver == "auto" or sc.solver.status == SolverStatus.OPTIMAL:
            # auto's exact-window MILP carries the host row: its optimum is the brute-force one.
            assert sc.solver.status == SolverStatus.OPTIMAL
            assert sim.overhead_s == pytest.approx(best, rel=1e-6, abs=1e-12)


def test_dp_bound_under_a_binding_host_budget_is_lagrangian_and_true(brute_cases) -> None:
    # Seed 4 at half the free optimum's host: the DP's own plan is over the host budget, so its priced sweeps
    # give the bound; it stays at or below the brute-force optimum.
    tr, budget, plans = brute_cases[4]
    host = min(plans)[1] // 2
    best = min(p for p in plans if p[1] <= host)[0]
    sc = solve_report(tr, budget, SolveOptions(solver="dp", gap=0.0, time_limit_s=20, host_budget=host)).schedule
    assert "lower bound" in " ".join(sc.solver.details) and "dp-lagrangian" in " ".join(sc.solver.details)
    assert 0 < sc.solver.best_bound_s <= best
    assert any(d.startswith(f"host budget {host} bytes") for d in sc.solver.details)


def test_host_budget_zero_plans_keep_and_recompute_only() -> None:
    tr = make_trace(20, 3)
    budget = budget_between(tr, 0.5)
    sc = solve_report(tr, budget, SolveOptions(host_budget=0, time_limit_s=5)).schedule
    assert all(a.action != Action.OFFLOAD for a in sc.actions)
    assert sc.prediction.host_peak_bytes == 0 and sc.host_budget_bytes == 0
    assert SolveOptions(host_budget=0).allowed_actions(tr) == frozenset({Action.KEEP, Action.RECOMPUTE})


def test_host_budget_zero_below_what_recompute_reaches_names_the_host_budget_needed() -> None:
    tr = make_trace(6, 1)
    budget = budget_between(tr, 0.0)  # only offloading everything synchronously fits
    with pytest.raises(InfeasibleHostBudgetError) as e:
        solve_report(tr, budget, SolveOptions(host_budget=0, time_limit_s=10))
    sync = simulate(tr, [offload_all(tr, i, i, i) for i in range(tr.n)], budget, with_events=False)
    assert 0 < e.value.min_host_bytes <= sync.host_peak_bytes
    assert "keep and recompute alone need a budget of at least" in str(e.value)


@pytest.mark.parametrize("actions", [["keep", "offload"], None])
@pytest.mark.parametrize("seed", [3, 11])
def test_below_offload_alls_budget_the_host_budget_sets_the_smallest_device_budget(seed: int, actions) -> None:
    """Under a small host budget, the smallest device budget lies above offload-all's: the error named offload-all's,
    and a solve at it was then refused for the host budget. The number named now fits under the host budget and,
    proven, nothing below it does."""
    from memsched.errors import InfeasibleBudgetError
    from memsched.optimizer.budget import min_feasible_budget

    trace = make_trace(6, seed)
    floor = min_feasible_budget(trace)
    host = sum(layer.saved_bytes for layer in trace.layers) // 8
    options = SolveOptions(time_limit_s=10, actions=actions, host_budget=host)
    with pytest.raises(InfeasibleBudgetError) as e:
        solve_report(trace, floor - 1, options)
    least = e.value.min_feasible_bytes
    assert least > floor and "under the host budget" in str(e.value)
    fits = solve_report(trace, least, options).schedule
    assert simulate(trace, fits).feasible and fits.prediction.host_peak_bytes <= host
    if e.value.proven:
        with pytest.raises((InfeasibleBudgetError, InfeasibleHostBudgetError)):
            solve_report(trace, least - 1, options)


@pytest.mark.parametrize("frac", [0.0, 0.1, 0.3, 0.6])
def test_heuristic_and_local_search_never_offload_past_the_host_budget(frac: float) -> None:
    tr = make_trace(30, 7)
    budget = budget_between(tr, 0.4)
    free = heuristic(tr, budget).sim
    host = int(free.host_peak_bytes * frac)
    res = heuristic(tr, budget, ALL_ACTIONS, host)
    assert res.sim.host_peak_bytes <= host
    if res.sim.feasible:
        out = polish(tr, budget, res.sim.decisions, 0.5, host_budget=host)
        assert out.sim.feasible and out.sim.host_peak_bytes <= host
        assert out.sim.overhead_s <= res.sim.overhead_s


def test_host_peak_is_every_offloaded_byte_from_forward_to_backward() -> None:
    tr = make_trace(5, 2)
    plan = [offload_all(tr, 0), KEEP, offload_all(tr, 2), recompute(), KEEP]
    stages = host_stage_bytes(simulate(tr, plan).decisions)
    x0, x2 = plan[0].offload_bytes, plan[2].offload_bytes
    # F0 F1 F2 F3 F4 | B4 B3 B2 B1 B0: layer 0's buffers from F0 through B0, layer 2's from F2 through B2.
    assert stages == [x0, x0, x0 + x2, x0 + x2, x0 + x2, x0 + x2, x0 + x2, x0 + x2, x0, x0]
    assert max(stages) == host_peak_bytes(plan) == simulate(tr, plan).prediction().host_peak_bytes


def test_milp_has_one_host_row_only_with_a_host_budget() -> None:
    tr = make_trace(5, 2)
    budget = budget_between(tr, 0.3)
    assert not [r for r in build_model(tr, budget).rows if r.name == "host_budget"]
    (row,) = [r for r in build_model(tr, budget, host_budget=12345).rows if r.name == "host_budget"]
    assert row.const == -12345 and row.sense == "<=" and len(row.terms) >= 1


def test_pool_refuses_to_grow_past_its_limit_and_says_why() -> None:
    pool = HostBufferPool(pin_memory=False, limit_bytes=100)
    a = pool.acquire(60)
    b = pool.acquire(40)
    with pytest.raises(HostBudgetExceeded) as e:
        pool.acquire(8)
    msg = str(e.value)
    # The budget, the bytes asked, the bytes in use and the fix.
    assert "needs 8 B (8 bytes) more" in msg
    assert "100 B (100 bytes) of its limit of 100 B (100 bytes) are in use" in msg
    assert "--host-budget" in msg and "host_budget=" in msg
    pool.release(a)
    # A free 60-byte buffer of another size is dropped to make room for 50 bytes within the limit.
    c = pool.acquire(50)
    st = pool.stats()
    assert st.allocated_bytes == 90 and st.in_use_bytes == 90 and st.limit_bytes == 100
    assert st.peak_in_use_bytes == 100
    pool.release(b)
    pool.release(c)
    assert pool.acquire(40).numel() == 40 and pool.stats().reuses == 1


def test_pool_without_a_limit_grows_as_before() -> None:
    pool = HostBufferPool(pin_memory=False)
    bufs = [pool.acquire(1 << 10) for _ in range(4)]
    assert pool.stats().in_use_bytes == 4 << 10 and pool.stats().limit_bytes is None
    assert all(isinstance(x, torch.Tensor) for x in bufs)


def test_host_budget_changes_the_cache_key_and_leaves_old_keys_alone() -> None:
    plain = SolveOptions()
    assert "host_budget" not in plain.job_fields()  # jobs stored before the option keep their keys
    assert SolveOptions(host_budget=2**30).job_fields()["host_budget"] == 2**30
    keys = {cache_key("t", 10, SolveOptions(host_budget=h)) for h in (None, 0, 2**30, "1GiB", "2GiB")}
    assert len(keys) == 4  # "1GiB" is 2**30 bytes: the same key


def test_old_schedules_without_host_fields_still_load() -> None:
    tr = make_trace(4, 0)
    sc = solve_report(tr, budget_between(tr, 0.5), SolveOptions(time_limit_s=5)).schedule
    doc = json.loads(sc.model_dump_json())
    del doc["host_budget_bytes"]
    del doc["prediction"]["host_peak_bytes"]
    old = Schedule.model_validate(doc)
    assert old.host_budget_bytes is None and old.prediction.host_peak_bytes is None
    assert sc.host_budget_bytes is None and sc.prediction.host_peak_bytes is not None


@pytest.mark.parametrize(
    ("value", "expected"), [("64GiB", 64 << 30), ("0", 0), (0, 0), ("1.5e9", 1_500_000_000), (123, 123)]
)
def test_host_budget_parses_sizes(value: object, expected: int) -> None:
    assert SolveOptions.from_user(host_budget=value).host_budget == expected


def _cli(args: list[str], capsys) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as e:
        main(args)
    out, err = capsys.readouterr()
    return int(e.value.code or 0), out, err


@pytest.mark.parametrize("bad", ["lots", "-1GiB", "50%"])
def test_cli_bad_host_budget_is_one_line(tmp_path, capsys, bad: str) -> None:
    tr = make_trace(4, 0)
    path = tmp_path / "t.json"
    path.write_text(tr.model_dump_json())
    code, out, err = _cli(
        ["solve", str(path), "--budget", "60%", "--host-budget", bad, "-o", str(tmp_path / "s")], capsys
    )
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(" ".join(lines).split("error:")) == 2 and "host_budget" in err and "--host-budget" in err


def test_cli_infeasible_host_budget_json_names_the_smallest(tmp_path, capsys) -> None:
    tr = make_trace(4, 0)
    path = tmp_path / "t.json"
    path.write_text(tr.model_dump_json())
    budget = budget_between(tr, 0.3)
    args = ["solve", str(path), "--budget", str(budget), "--host-budget", "1MiB", "--json", "-o", str(tmp_path / "s")]
    code, out, err = _cli(args, capsys)
    doc = json.loads(out)["error"]
    assert code == 2 and doc["code"] == "infeasible_host_budget"
    assert doc["min_host_bytes"] > 2**20 and f"({doc['min_host_bytes']} bytes)" in doc["message"]
    code, out, err = _cli(
        [
            "solve",
            str(path),
            "--budget",
            str(budget),
            "--host-budget",
            str(doc["min_host_bytes"]),
            "-o",
            str(tmp_path / "s"),
        ],
        capsys,
    )
    assert code == 0 and "predicted host peak" in out
    sc = Schedule.model_validate_json((tmp_path / "s").read_text())
    assert sc.host_budget_bytes == doc["min_host_bytes"] >= sc.prediction.host_peak_bytes
