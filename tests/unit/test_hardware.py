"""What-if hardware: --link and --ranks-per-link change the copy rates a plan is made for, the schedule records
them and still replays on its trace, cache keys of earlier jobs stay put, and the runtime names both figures
when its link measures differently."""

from __future__ import annotations

import json

import pytest

from memsched.cli import main
from memsched.errors import MemschedError
from memsched.hardware import LINKS, LinkPreset, parse_link, what_if_device
from memsched.io import load_schedule, save_model
from memsched.optimizer.budget import budget_between
from memsched.optimizer.synthetic import make_trace
from memsched.options import SolveOptions
from memsched.runtime.device import CopySpeed
from memsched.runtime.linkcheck import check_link, link_mismatch
from memsched.schema import Action, PlannedDevice, Trace, check_schedule
from memsched.service import compare_policies, simulate_schedule, solve_trace


@pytest.fixture(scope="module")
def trace() -> Trace:
    # 12e9 B/s copies, a budget a quarter of the way up: offload's speed decides the overhead.
    return make_trace(12, 5)


def test_parse_link() -> None:
    assert parse_link("PCIe4") == LinkPreset.PCIE4 and parse_link("2.5e10") == 2.5e10 and parse_link(2e6) == 2e6
    # 7 bytes/s or 1e-300 (a unit slip: GB/s for bytes/s) made compare print Infinity.
    for bad in ("pcie9", 0, -1, "nan", "inf", True, 1e16, 7, 1e-300):
        with pytest.raises(ValueError):
            parse_link(bad)
    with pytest.raises(MemschedError, match=r"link: .*> 0 bytes/s.*\(--link on the command line\)"):
        SolveOptions.from_user(link="0")
    with pytest.raises(MemschedError, match="--ranks-per-link"):
        SolveOptions.from_user(ranks_per_link=0)


def test_cache_keys_of_earlier_jobs_stay() -> None:
    """Unset, the new options leave a job's key (its JSON fields) as it was before they existed."""
    assert set(SolveOptions().job_fields()) == {"solver", "time_limit_s", "gap", "window", "max_segment"}
    assert SolveOptions(link="pcie4").job_fields()["link"] == "pcie4"
    assert SolveOptions(link=25e9, ranks_per_link=8).job_fields()["ranks_per_link"] == 8


def test_ranks_share_the_link(trace: Trace) -> None:
    d = what_if_device(trace, LinkPreset.PCIE4, 8)
    assert d.h2d_bytes_per_s == LINKS[LinkPreset.PCIE4].h2d_bytes_per_s / 8 and d.link == "pcie4"
    assert d.ranks_per_link == 8
    own = what_if_device(trace, None, 2)
    assert own.link == "measured" and own.d2h_bytes_per_s == trace.device.d2h_bytes_per_s / 2


def test_solve_for_another_link(trace: Trace) -> None:
    budget = budget_between(trace, 0.25)
    opts = {"time_limit_s": 5.0, "gap": 0.0, "actions": [Action.KEEP, Action.OFFLOAD]}
    slow = solve_trace(trace, budget, SolveOptions(link=1e9, **opts))
    fast = solve_trace(trace, budget, SolveOptions(link="gh200", **opts))
    own = solve_trace(trace, budget, SolveOptions(**opts))
    # Offload only: slower copies stall more, faster ones less.
    assert slow.prediction.overhead_s > own.prediction.overhead_s >= fast.prediction.overhead_s
    for sc, rate in ((slow, 1e9), (fast, LINKS[LinkPreset.GH200].h2d_bytes_per_s)):
        assert sc.planned_for is not None and sc.planned_for.h2d_bytes_per_s == rate
        assert sc.trace_hash == trace.content_hash()
        check_schedule(sc, trace)  # it still replays on the model the trace came from
        # simulate and plot use the rates it was planned for.
        assert simulate_schedule(trace, sc).overhead_s == pytest.approx(sc.prediction.overhead_s, rel=1e-9, abs=1e-12)
    assert own.planned_for is not None and own.planned_for.link == "measured"
    # A quarter of the link each is the same plan as a link of a quarter the speed.
    shared = solve_trace(trace, budget, SolveOptions(link=4e9, ranks_per_link=4, **opts))
    assert shared.prediction.overhead_s == pytest.approx(slow.prediction.overhead_s, rel=1e-9)


def test_compare_for_another_link(trace: Trace) -> None:
    budget = budget_between(trace, 0.25)
    by = {r.policy: r for r in compare_policies(trace, budget).rows}
    slow = {r.policy: r for r in compare_policies(trace, budget, 1e9).rows}
    assert slow["offload-all-overlapped"].step_s > by["offload-all-overlapped"].step_s
    assert slow["checkpoint-all"].step_s == by["checkpoint-all"].step_s  # no copies, no change


def run(argv, capsys):
    with pytest.raises(SystemExit) as e:
        main([str(a) for a in argv])
    cap = capsys.readouterr()
    return e.value.code, cap.out, cap.err


def test_cli(trace: Trace, tmp_path, capsys) -> None:
    path, out = tmp_path / "t.json", tmp_path / "s.json"
    save_model(trace, path)
    args = ["solve", path, "--budget", "40%", "--time-limit", 3, "-o", out, "--json"]
    code, _, err = run([*args, "--link", "pcie5", "--ranks-per-link", 2], capsys)
    assert code == 0, err
    planned = load_schedule(out).planned_for
    assert planned is not None and planned.link == "pcie5" and planned.ranks_per_link == 2
    assert planned.d2h_bytes_per_s == LINKS[LinkPreset.PCIE5].d2h_bytes_per_s / 2
    code, outp, err = run(["compare", path, "--budget", "40%", "--link", "0", "--json"], capsys)
    assert code == 2 and "link" in err and "> 0 bytes/s" in err and json.loads(outp)["error"]["code"] == "bad_input"
    code, _, err = run(["compare", path, "--budget", "40%", "--link", "pcie3", "--ranks-per-link", 8], capsys)
    assert code == 0, err


def test_runtime_names_both_figures() -> None:
    planned = PlannedDevice(name="gpu", link="pcie5", h2d_bytes_per_s=60e9, d2h_bytes_per_s=61e9)
    assert link_mismatch(planned, CopySpeed(55e9, 58e9, 1e-5)) is None  # within 25%
    msg = link_mismatch(planned, CopySpeed(24e9, 60e9, 1e-5))
    assert msg is not None and "24.0 GB/s measured here, 60.0 GB/s planned" in msg and "'pcie5'" in msg
    assert "device->host" not in msg and "--link 2.4e+10" in msg


def test_runtime_check_only_where_copies_shape_the_step(trace: Trace) -> None:
    import torch

    sc = solve_trace(trace, budget_between(trace, 0.25), SolveOptions(time_limit_s=2, link=1e9))
    assert check_link(sc, torch.device("cpu")) is None  # the host is the CPU's memory: nothing to compare
    assert check_link(sc.model_copy(update={"planned_for": None}), torch.device("cpu")) is None
