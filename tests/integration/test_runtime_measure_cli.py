"""`memsched measure` and `--dtype`: replay a solved schedule on the CPU, predicted vs measured, and the bad
inputs that must exit 2 with one line. Tiny configs: the whole file runs in seconds."""

from __future__ import annotations

import json

import pytest
import torch

from memsched.cli import main
from memsched.io import load_trace, save_model

torch.set_num_threads(1)

WL = ["--small", "--layers", 4, "--batch-size", 4, "--seq-len", 32]
FAST = ["--steps", 1, "--warmup", 0, "--threads", 1]


def run(argv, capsys):
    with pytest.raises(SystemExit) as e:
        main([str(a) for a in argv])
    captured = capsys.readouterr()
    return e.value.code, captured.out, captured.err


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    """A bf16 trace of a 4-block small GPT-2 and a schedule solved halfway between its smallest feasible
    budget and keep-all (at this size the memory outside the blocks leaves no room for a 50% budget)."""
    from memsched.optimizer.budget import budget_between
    from memsched.service import solve_trace

    d = tmp_path_factory.mktemp("measure")
    trace_path = d / "t.json"
    with pytest.raises(SystemExit) as e:
        main(["trace", "gpt2", *map(str, WL), "--dtype", "bfloat16", *map(str, FAST), "-o", str(trace_path)])
    assert e.value.code == 0
    tr = load_trace(trace_path)
    schedule_path = d / "s.json"
    save_model(solve_trace(tr, budget_between(tr, 0.5)), schedule_path)
    return trace_path, schedule_path


def test_trace_dtype_is_recorded(traced):
    tr = load_trace(traced[0])
    assert tr.dtype == "bfloat16"
    # bf16 halves what a float32 trace of the same workload saves: every layer's tensors are 2-byte.
    assert tr.static.params > 0 and all(x.saved_bytes > 0 for x in tr.layers)


def test_measure_schedule_reports_predicted_vs_measured(traced, tmp_path, capsys):
    trace_path, schedule_path = traced
    out = tmp_path / "r.json"
    code, stdout, err = run(
        ["measure", "gpt2", schedule_path, "--trace", trace_path, *WL, "--dtype", "bf16", *FAST, "--json", "-o", out],
        capsys,
    )
    assert code == 0, err
    doc = json.loads(stdout)
    assert json.loads(out.read_text()) == doc
    assert doc["dtype"] == "bfloat16" and doc["device"] == "cpu" and doc["peak_source"] == "cpu-all-tensors"
    headline = {
        "predicted_peak_bytes",
        "measured_peak_bytes",
        "peak_source",
        "budget_bytes",
        "predicted_step_s",
        "measured_step_s",
        "predicted_overhead_pct",
        "measured_overhead_pct",
    }
    assert headline <= set(doc) and doc["threads"] == 1
    s, k = doc["scheduled"], doc["keep_all"]
    assert doc["measured_peak_bytes"] == s["measured_peak_bytes"] and doc["predicted_step_s"] == s["predicted_step_s"]
    assert s["measured_peak_bytes"] > 0 and k["measured_peak_bytes"] >= s["measured_peak_bytes"]
    # The whole-step peak (every live tensor byte) follows the simulator on GPT-2, both sides.
    assert s["ratio_measured_over_predicted"]["peak"] == pytest.approx(1.0, abs=0.05)
    assert k["ratio_measured_over_predicted"]["peak"] == pytest.approx(1.0, abs=0.05)
    assert doc["fits_budget"] is True and doc["budget_bytes"] > 0
    assert {"slowdown_pct", "oversubscription", "activation_oversubscription", "peak_within_target"} <= set(doc)
    assert doc["activation_oversubscription"] > 1.0  # keep-all's activations do not fit the budget's room
    assert doc["command"].startswith("memsched measure gpt2 ") and "--dtype bfloat16" in doc["command"]


def test_measure_table_and_keep_all_only(traced, capsys):
    trace_path, _ = traced
    code, stdout, err = run(
        ["measure", "gpt2", "--keep-all", "--trace", trace_path, *WL, "--dtype", "bf16", *FAST], capsys
    )
    assert code == 0, err
    assert "keep-all" in stdout and "cpu-all-tensors" in stdout and "scheduled" not in stdout
    code, stdout, err = run(["measure", "gpt2", "--keep-all", *WL, *FAST, "--json"], capsys)
    assert code == 0, err
    doc = json.loads(stdout)
    assert doc["scheduled"] is None and doc["keep_all"]["predicted_peak_bytes"] is None  # no trace: nothing to predict
    assert doc["dtype"] == "float32"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--keep-all", "SCHED"], "--keep-all measures without a schedule"),
        ([], "give a SCHEDULE"),
        (["SCHED", "--dtype", "int8"], "--dtype 'int8' is not supported"),
        (["SCHED", "--device", "cuda"] if not torch.cuda.is_available() else ["SCHED", "--device", "tpu"], "--device"),
        (["SCHED", "--steps", 0], "--steps must be >= 1"),
    ],
)
def test_measure_bad_input_exits_2_with_one_line(traced, extra, message, capsys):
    trace_path, schedule_path = traced
    sub = {"SCHED": schedule_path, "TRACE": trace_path}
    argv = ["measure", "gpt2", *WL, *FAST, *[sub.get(x, x) for x in extra]]  # later flags win
    code, _, err = run(argv, capsys)
    assert code == 2, err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_measure_takes_the_workload_from_the_trace_and_a_flag_overrides_it_with_a_note(traced, capsys):
    trace_path, schedule_path = traced
    # Only what the trace cannot know (the built-in's size) is given: batch, sequence, dtype and layers come
    # from the trace and the schedule.
    base = ["measure", "gpt2", schedule_path, "--trace", trace_path, "--small", "--layers", 4, *FAST, "--json"]
    code, stdout, err = run(base, capsys)
    assert code == 0, err
    doc = json.loads(stdout)
    assert (doc["batch_size"], doc["seq_len"], doc["dtype"]) == (4, 32, "bfloat16") and doc["notes"] == []
    code, stdout, err = run([*base, "--batch-size", 3], capsys)
    assert code == 0, err
    doc = json.loads(stdout)
    assert doc["batch_size"] == 3
    assert doc["notes"] == [
        "--batch-size 3 overrides the trace's 4: the trace's predictions are for 4, so compare "
        "with care (or re-trace at 3)"
    ]


def test_measure_schedule_for_another_model_is_refused(traced, capsys):
    _, schedule_path = traced
    argv = ["measure", "gpt2", schedule_path, "--small", "--layers", 3, "--batch-size", 4, "--seq-len", 32, *FAST]
    code, _, err = run(argv, capsys)
    assert code == 2 and "the schedule has 4 layers but this model has 3" in err


def test_builtin_dtypes_and_large_models():
    from memsched.runtime import BUILTIN_MODELS, builtin_workload
    from memsched.runtime.models import parse_dtype

    assert {"bert-large", "vit-large"} <= set(BUILTIN_MODELS)
    assert parse_dtype("bf16") is torch.bfloat16 and parse_dtype("float16") is torch.float16
    w = builtin_workload("vit-large", small=True, num_layers=2, batch_size=1, dtype="float16")
    assert {p.dtype for p in w.model.parameters()} == {torch.float16}
    assert w.batch["pixel_values"].dtype == torch.float16 and w.batch["labels"].dtype == torch.int64
    # The published sizes (one block, to stay fast): 1024 wide, 16 heads, 4096 intermediate.
    for name in ("bert-large", "vit-large"):
        w = builtin_workload(name, num_layers=1, batch_size=1, seq_len=8, dtype="bfloat16", optimizer="none")
        cfg = w.model.config
        assert (cfg.hidden_size, cfg.num_attention_heads, cfg.intermediate_size) == (1024, 16, 4096)
        assert next(w.model.parameters()).dtype == torch.bfloat16
    w = builtin_workload("resnet50", small=True, num_layers=4, batch_size=1, dtype="bfloat16")
    assert w.batch["pixel_values"].dtype == torch.bfloat16


def test_factory_without_dtype_refuses_a_dtype(tmp_path, monkeypatch):
    from memsched.errors import MemschedError
    from memsched.runtime import workload

    (tmp_path / "fac_mod.py").write_text(
        "from memsched.runtime import builtin_workload\n"
        "def make(batch_size=1):\n"
        "    return builtin_workload('gpt2', small=True, num_layers=2, batch_size=batch_size, seq_len=8)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert workload("fac_mod:make", batch_size=1, dtype="float32").model_id == "gpt2-small2"
    with pytest.raises(MemschedError, match="needs a factory that takes a `dtype` argument"):
        workload("fac_mod:make", batch_size=1, dtype="bfloat16")


def test_offload_on_the_cpu_is_labelled_an_emulation_with_the_host_copies_shown(traced, tmp_path, capsys):
    from memsched.optimizer.decisions import KEEP, offload_all
    from memsched.optimizer.simulate import make_schedule
    from memsched.schema import SolverRecord, SolverStatus

    trace_path, _ = traced
    tr = load_trace(trace_path)
    # Asked for explicitly (the CPU default plans no offload): every layer but the last offloaded synchronously.
    decisions = [offload_all(tr, i, done_by=i, prefetch_at=i) for i in range(tr.n - 1)] + [KEEP]
    record = SolverRecord(backend="test", status=SolverStatus.HEURISTIC)
    sched = make_schedule(tr, decisions, tr.baseline.peak_bytes, "offload-all-sync", record)
    path = tmp_path / "offload.json"
    save_model(sched, path)
    argv = ["measure", "gpt2", path, "--trace", trace_path, "--small", "--layers", 4, *FAST]
    code, stdout, err = run([*argv, "--json"], capsys)
    assert code == 0, err
    doc = json.loads(stdout)
    host = doc["scheduled"]["host_bytes"]
    assert host > 0 and doc["offload_emulated"] is True
    assert doc["process_peak_bytes_with_host_copies"] == doc["scheduled"]["measured_peak_bytes"] + host
    code, stdout, err = run(argv, capsys)
    assert code == 0, err
    assert "offload emulated on the CPU" in stdout and "host copies" in stdout


def test_measure_names_the_stage_that_departs_most_from_the_plan(traced, capsys):
    """Item 2 of issue 20: the measured whole-step peak per stage against the simulator's per stage, and the
    stage that departs most named by its layer, with both byte counts and their difference."""
    trace_path, schedule_path = traced
    layers = [x.name for x in load_trace(trace_path).layers]
    code, stdout, err = run(
        ["measure", "gpt2", schedule_path, "--trace", trace_path, *WL, "--dtype", "bf16", *FAST, "--json"], capsys
    )
    assert code == 0, err
    doc = json.loads(stdout)
    for side in (doc["scheduled"], doc["keep_all"]):
        predicted = side["predicted_stage_peak_bytes"]
        # Both sides of the comparison mean the same thing: the predicted stages' maximum is the predicted peak.
        assert max(predicted.values()) == side["predicted_peak_bytes"]
        assert set(predicted) == {f"{d}{i}" for d in "FB" for i in range(len(layers))}
        w = side["worst_stage"]
        assert w["layer"] in layers and w["layer"] == layers[int(w["stage"][1:])]
        assert w["predicted_bytes"] == predicted[w["stage"]]
        assert w["measured_bytes"] <= side["measured_peak_bytes"]
        assert w["difference_bytes"] == w["measured_bytes"] - w["predicted_bytes"]
        assert w["notable"] == (abs(w["difference_bytes"]) > 0.05 * side["predicted_peak_bytes"])
    assert doc["worst_stage"] == doc["scheduled"]["worst_stage"]  # the headline is the scheduled step's


def test_measure_table_notes_a_stage_that_departs_by_more_than_5pct(capsys):
    from memsched.cli.runtime import _print_measure

    side = {
        "predicted_peak_bytes": 1000,
        "measured_peak_bytes": 1100,
        "predicted_step_s": 1.0,
        "measured_step_s": 1.0,
        "host_bytes": 0,
        "ratio_measured_over_predicted": {"peak": 1.1, "step": 1.0},
    }
    worst = {
        "stage": "B2",
        "layer": "transformer.h.2",
        "predicted_bytes": 900,
        "measured_bytes": 1100,
        "difference_bytes": 200,
        "fraction_of_predicted_peak": 0.2,
        "notable": True,
    }
    doc = {
        "budget_bytes": 1000,
        "model": "m",
        "batch_size": 1,
        "seq_len": 8,
        "dtype": "float32",
        "device_name": "cpu",
        "policy": "p",
        "peak_source": "cpu-all-tensors",
        "step_clock": "wall time",
        "threads": 1,
        "keep_all": None,
        "scheduled": side,
        "measured_overhead_pct": None,
        "worst_stage": worst,
    }
    _print_measure(doc)
    out = " ".join(capsys.readouterr().out.split())
    assert "departs from the plan at stage B2 (layer transformer.h.2)" in out and "+20.0% of the predicted peak" in out
    _print_measure({**doc, "worst_stage": {**worst, "notable": False}})
    assert "departs" not in capsys.readouterr().out
