"""Smoke tests of the peer benchmark harness (bench/peers) and the cost-model comparison (bench/costmodel):
they run the machinery on a 2-block GPT-2 for one step, they do not benchmark anything."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # bench/ is a folder of the checkout, not an installed package
    sys.path.insert(0, str(REPO))

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from helpers import tiny_trace  # noqa: E402


def test_harness_on_tiny_gpt2(tmp_path):
    from bench.peers.report import write_report
    from bench.peers.run import Settings, run_model

    s = Settings(
        model="gpt2-tiny",
        batch_size=2,
        size=16,
        steps=1,
        warmup=1,
        budgets=(0.5,),
        # sac-milp is left out: without CUDA it only spawns a child that fails (seconds of imports, no coverage).
        approaches=("keep-all", "checkpoint-blocks", "checkpoint-sqrt", "save_on_cpu", "memsched"),
        solve_time_limit_s=5.0,
        command="test",
    )
    path = run_model(s, tmp_path)
    res = json.loads(path.read_text())
    rows = {(r["approach"], r["budget"]): r for r in res["rows"]}
    assert res["keepall_peak_bytes"] > 0
    # The forward leaves the saved activations behind; the backward's peak is at least that.
    assert 0 < rows[("keep-all", None)]["forward_end_bytes"] <= res["keepall_peak_bytes"]
    keep = rows[("keep-all", None)]
    assert keep["peak_ratio"] == 1.0 and keep["time_ratio"] == 1.0
    for name in ("checkpoint-blocks", "checkpoint-sqrt", "save_on_cpu"):
        r = rows[(name, None)]
        assert r["status"] == "ok", r.get("reason")
        assert r["grad"]["ok"], r["grad"]
        assert set(r["fits"]) == {"0.5"}
    # Recomputing the blocks must lower the measured peak below keep-all's.
    assert rows[("checkpoint-blocks", None)]["peak_bytes"] < keep["peak_bytes"]
    # Every approach is either measured or carries its failure reason.
    for r in res["rows"]:
        assert r["status"] == "ok" or r.get("reason"), r
    assert rows[("memsched", 0.5)]["status"] in ("ok", "failed")  # tiny model: 50% may be below its minimum
    report = write_report(tmp_path)
    text = report.read_text()
    assert "gpt2-tiny" in text and "recompute side of the trade" in text
    assert (tmp_path / "peers-gpt2-tiny-pareto.png").is_file()


def test_grad_check_catches_a_wrong_gradient():
    from bench.peers.measure import compare_grads

    ref = {"w": torch.ones(4), "b": torch.ones(2)}
    assert compare_grads({"w": torch.ones(4), "b": torch.ones(2)}, ref).bitwise
    close = compare_grads({"w": torch.ones(4) * (1 + 1e-7), "b": torch.ones(2)}, ref)
    assert close.ok and not close.bitwise
    wrong = compare_grads({"w": torch.ones(4) * 2, "b": torch.ones(2)}, ref)
    assert not wrong.ok and wrong.worst_param == "w"
    assert not compare_grads({"w": torch.ones(4)}, ref).ok  # a missing gradient fails
    # A gradient that is mathematically zero (rounding noise) is judged against the model's scale, not its own.
    ref = {"w": torch.ones(1000), "noise": torch.full((4,), 1e-9)}
    assert compare_grads({"w": torch.ones(1000), "noise": torch.full((4,), -1e-9)}, ref).ok
    assert not compare_grads({"w": torch.ones(1000), "noise": torch.full((4,), 1e-2)}, ref).ok


def test_peak_counts_what_the_step_allocates():
    from bench.peers.measure import peak_activation_bytes

    keep = []

    def step():
        a = torch.ones(1 << 18)  # 1 MiB, freed at the end of the step
        b = torch.ones(1 << 18)
        keep.append(float((a + b).sum()))

    peak = peak_activation_bytes(step, torch.device("cpu"))
    assert 3 << 20 <= peak.peak_bytes < 4 << 20  # a, b and a + b live at once
    assert peak.forward_end_bytes is None  # no backward mark in this step


def test_pwlf_shim_fits_a_two_piece_line():
    import numpy as np

    from bench.peers.pwlf_shim import PiecewiseLinFit

    x = np.linspace(0, 1, 21)
    y = np.where(x < 0.5, 0.2 * x, 0.1 + 2.0 * (x - 0.5))
    f = PiecewiseLinFit(x, y)
    breaks = f.fit(n_segments=2)
    assert breaks[1] == pytest.approx(0.5)
    assert f.calc_slopes() == pytest.approx([0.2, 2.0])
    assert f.predict([0.25, 0.75]) == pytest.approx([0.05, 0.6])
    assert f.intercepts == pytest.approx([0.0, -0.9])


def test_costmodel_marks_infeasible_budgets_and_beats_baselines():
    from bench.costmodel import evaluate

    tr = tiny_trace(
        [0.01, 0.02, 0.03],
        [0.02, 0.04, 0.06],
        [1000, 2000, 3000],
        output=[100] * 3,
        inputs=[0, 100, 100],
        static=500,
        bandwidth=1e6,
    )
    hi = evaluate(tr, 90, time_limit_s=5)
    m = hi.policies["memsched"]
    assert m["feasible"]
    for name, p in hi.policies.items():
        if p.get("feasible") and name != "memsched":
            assert m["overhead_pct"] <= p["overhead_pct"] + 1e-9, name
    lo = evaluate(tr, 1, time_limit_s=5)
    assert not lo.policies["memsched"]["feasible"] and "smallest feasible" in lo.policies["memsched"]["reason"]
