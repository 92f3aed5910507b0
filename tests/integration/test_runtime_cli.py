"""`memsched trace` and `memsched demo` through the CLI entry point: files, --json, exit codes."""

from __future__ import annotations

import json

import pytest
import torch

from memsched.cli import main
from memsched.io import load_schedule, load_trace

torch.set_num_threads(1)


def run(argv, capsys):
    with pytest.raises(SystemExit) as e:
        main([str(a) for a in argv])
    captured = capsys.readouterr()
    return e.value.code, captured.out, captured.err


def test_trace_writes_a_valid_trace(tmp_path, capsys):
    path = tmp_path / "t.json"
    args = ["trace", "gpt2", "--small", "--layers", 2, "--batch", 1, "--seq-len", 16, "--steps", 1, "--warmup", 0]
    code, out, err = run([*args, "-o", path, "--json"], capsys)
    assert code == 0, err
    doc = json.loads(out)
    tr = load_trace(path)
    assert doc["hash"] == tr.content_hash()
    assert tr.layer_names == ["transformer.h.0", "transformer.h.1"] and tr.batch_size == 1 and tr.seq_len == 16
    code, out, _ = run([*args, "-o", path], capsys)
    assert code == 0 and "transformer.h.1" in out and "wrote" in out


def test_trace_with_layer_patterns(tmp_path, capsys):
    path = tmp_path / "t.json"
    code, _, err = run(
        [
            "trace",
            "gpt2",
            "--small",
            "--layers",
            2,
            "--batch",
            1,
            "--seq-len",
            8,
            "--steps",
            1,
            "--warmup",
            0,
            "--layer-pattern",
            r"transformer\.h\.\d+\.mlp",
            "-o",
            path,
        ],
        capsys,
    )
    assert code == 0, err
    assert load_trace(path).layer_names == ["transformer.h.0.mlp", "transformer.h.1.mlp"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["trace", "gpt3"], "unknown model 'gpt3'"),
        (["trace", "nosuchpkg.mod:make"], "cannot import 'nosuchpkg.mod'"),
        (["trace", "gpt2", "--small", "--steps", 0], "--steps must be >= 1"),
        (["trace", "gpt2", "--small", "--device", "cuda:0"] if not torch.cuda.is_available() else ["trace", "x"], ""),
        (
            ["trace", "gpt2", "--small", "--layers", 1, "--layer-pattern", "nothing", "--steps", 1, "--warmup", 0],
            "no module name matches",
        ),
    ],
)
def test_trace_user_errors_exit_2_with_one_line(argv, message, capsys, tmp_path):
    code, _, err = run([*argv, "-o", tmp_path / "x.json"], capsys)
    assert code == 2
    assert message in err and "Traceback" not in err
    assert len(err.strip().splitlines()) <= 2  # one message (rich may wrap it once)


def test_demo_runs_end_to_end(tmp_path, capsys):
    code, out, err = run(
        # 75%: at this size the memory outside the blocks (optimizer step, logits) leaves no room for 50%
        [
            "demo",
            "--out-dir",
            tmp_path,
            "--layers",
            3,
            "--batch-size",
            2,
            "--seq-len",
            32,
            "--steps",
            1,
            "-b",
            "75%",
            "--json",
        ],
        capsys,
    )
    assert code == 0, err
    doc = json.loads(out)
    sched = load_schedule(tmp_path / "schedule.json")
    tr = load_trace(tmp_path / "trace.json")
    assert sched.trace_hash == tr.content_hash()
    rows = {r["quantity"].split(" (")[0]: r for r in doc["rows"]}
    for side in ("keep-all", "scheduled"):  # the whole step, every live tensor byte, predicted vs measured
        peak = rows[f"peak, whole step, {side}"]
        assert abs(peak["measured"] - peak["predicted"]) <= 0.05 * peak["predicted"], peak
    assert rows["peak, whole step, scheduled"]["measured"] <= rows["budget"]["predicted"] == sched.budget_bytes
    saved = rows["saved activations, scheduled"]
    assert abs(saved["measured"] - saved["predicted"]) <= 0.05 * saved["predicted"]
    assert {"step time, keep-all", "step time, scheduled", "overhead vs keep-all"} <= set(rows)
    if doc["plot"] is not None:
        assert (tmp_path / "timeline.png").stat().st_size > 0


FACTORY = """
from memsched.runtime import builtin_workload


def make(batch_size=1, seq_len=8):
    return builtin_workload("bert-base", small=True, num_layers=2, batch_size=batch_size, seq_len=seq_len)
"""


def test_trace_of_a_user_factory(tmp_path, capsys, monkeypatch):
    (tmp_path / "my_models.py").write_text(FACTORY)
    monkeypatch.syspath_prepend(str(tmp_path))
    path = tmp_path / "t.json"
    code, _, err = run(["trace", "my_models:make", "--seq-len", 8, "--steps", 1, "--warmup", 0, "-o", path], capsys)
    assert code == 0, err
    assert load_trace(path).layer_names == ["bert.encoder.layer.0", "bert.encoder.layer.1"]
    code, _, err = run(["trace", "my_models:nothing", "-o", path], capsys)
    assert code == 2 and "no callable 'nothing'" in err
