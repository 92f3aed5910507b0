"""`memsched trace` and `memsched demo` through the CLI entry point: files, --json, exit codes."""

from __future__ import annotations

import json
import logging

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
    # What the recompute machinery costs, measured by the tracer and written into the trace, is said.
    assert load_trace(path).rerun_overhead is not None and "recompute machinery" in " ".join(out.split())


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


OWN_FACTORY = """
import torch
from torch import nn

from memsched.runtime import Workload


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x):
        return x + self.c(torch.tanh(self.b(torch.tanh(self.a(x)))))


class Net(nn.Module):
    def __init__(self, depth):
        super().__init__()
        self.blocks = nn.Sequential(*[Block() for _ in range(depth)])

    def forward(self, x):
        return self.blocks(x).pow(2).mean()


def make(batch_size=3, num_layers=2, with_optimizer=True):
    torch.manual_seed(0)
    model = Net(num_layers).train()
    opt = torch.optim.AdamW(model.parameters()) if with_optimizer else None
    return Workload(model, "own", {"x": torch.randn(batch_size, 8)}, batch_size, None, opt, loss_fn=lambda out: out)


def make_bare(batch_size=3):
    return make(batch_size, with_optimizer=False)
"""

QUICK = ["--steps", 1, "--warmup", 0]


def _params_bytes(depth: int) -> int:
    return depth * 3 * (8 * 8 + 8) * 4


def test_a_factory_keeps_its_own_defaults_and_its_optimizer_state(tmp_path, capsys, monkeypatch):
    (tmp_path / "own_models.py").write_text(OWN_FACTORY)
    monkeypatch.syspath_prepend(str(tmp_path))
    path = tmp_path / "t.json"
    code, _, err = run(["trace", "own_models:make", *QUICK, "-o", path], capsys)
    assert code == 0, err
    tr = load_trace(path)
    # Its own batch size (3), not the CLI's built-in default (2); AdamW's state counted (two moments per
    # parameter, plus a float32 step count per parameter tensor).
    assert tr.batch_size == 3 and tr.layer_names == ["blocks.0", "blocks.1"]
    assert tr.static.optimizer_state == 2 * _params_bytes(2) + 4 * 2 * 3 * 2
    # Flags it declares are passed on.
    code, _, err = run(["trace", "own_models:make", "--batch-size", 5, "--layers", 3, *QUICK, "-o", path], capsys)
    assert code == 0, err
    tr = load_trace(path)
    assert tr.batch_size == 5 and tr.layer_names == ["blocks.0", "blocks.1", "blocks.2"]


def test_measure_rebuilds_a_factory_with_its_own_defaults(tmp_path, capsys, monkeypatch, caplog):
    # measure passes a factory only what the user or the trace set: no CLI default (batch 2, adamw, ...) is
    # pushed onto it, so nothing is warned about and the trace's batch (the factory's own 3) is rebuilt.
    (tmp_path / "own_models.py").write_text(OWN_FACTORY)
    monkeypatch.syspath_prepend(str(tmp_path))
    path = tmp_path / "t.json"
    assert run(["trace", "own_models:make", *QUICK, "-o", path], capsys)[0] == 0
    with caplog.at_level("WARNING"):
        code, out, err = run(["measure", "own_models:make", "--keep-all", "--trace", path, *QUICK, "--json"], capsys)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["batch_size"] == 3 and doc["dtype"] == "float32" and doc["notes"] == []
    assert not [r for r in caplog.records if "would be ignored" in r.getMessage()]


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--optimizer", "sgd"], "--optimizer sgd would"),
        (["--seq-len", 16], "--seq-len 16 would"),
        (["--dropout", 0.1], "--dropout 0.1 would"),
        (["--small"], "so --small would"),
    ],
)
def test_a_flag_the_factory_does_not_take_is_an_error_naming_it(flags, named, tmp_path, capsys, monkeypatch):
    (tmp_path / "own_models.py").write_text(OWN_FACTORY)
    monkeypatch.syspath_prepend(str(tmp_path))
    code, _, err = run(["trace", "own_models:make", *flags, *QUICK, "-o", tmp_path / "t.json"], capsys)
    assert code == 2 and "Traceback" not in err
    assert named in " ".join(err.split()) and "drop the flag, or add the argument to the factory" in " ".join(
        err.split()
    )
    assert not (tmp_path / "t.json").exists()


def test_a_factory_without_optimizer_is_warned_that_no_state_is_counted(tmp_path, capsys, monkeypatch, caplog):
    (tmp_path / "own_models.py").write_text(OWN_FACTORY)
    monkeypatch.syspath_prepend(str(tmp_path))
    path = tmp_path / "t.json"
    with caplog.at_level(logging.WARNING, logger="memsched"):
        code, out, err = run(["trace", "own_models:make_bare", *QUICK, "-o", path, "--json"], capsys)
    assert code == 0, err
    doc = json.loads(out)
    assert load_trace(path).static.optimizer_state == 0
    warned = [w for w in doc["warnings"] if w.startswith("optimizer:")]
    assert len(warned) == 1 and "counts no optimizer state (0 B)" in warned[0]
    assert "Workload(optimizer=...)" in warned[0] and "counts no optimizer state" in caplog.text


FAILING_FACTORY = """
import torch
from torch import nn

from memsched.runtime import Workload
from own_models import make


def broken(batch_size=3):
    raise KeyError("hidden_size")


class Mismatch(nn.Module):
    def __init__(self, model):
        super().__init__()
        self.inner = model

    def forward(self, x):
        return self.inner(x[:, :4])  # a shape bug of the user's: its blocks take 8 features


def wrong_shape(batch_size=3):
    w = make(batch_size)
    w.model = Mismatch(w.model)
    return w


class NoRoom(nn.Module):
    def __init__(self, model):
        super().__init__()
        self.inner = model

    def forward(self, x):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")


def too_big(batch_size=3):
    w = make(batch_size)
    w.model = NoRoom(w.model)
    return w


class Config:
    use_cache = True


class NeedsItsCache(nn.Module):
    \"\"\"A model that fails only with the KV cache off, which the tracer turns off (runtime.kv_cache).\"\"\"

    def __init__(self, model):
        super().__init__()
        self.inner = model
        self.config = Config()

    def forward(self, x, use_cache=None):
        if use_cache is False:
            raise RuntimeError("this model cannot run without its cache")
        return self.inner(x)


def needs_cache(batch_size=3):
    w = make(batch_size)
    w.model = NeedsItsCache(w.model)
    return w
"""


@pytest.mark.parametrize(
    ("factory", "said"),
    [
        ("broken", "the factory broken() raised KeyError: 'hidden_size'; fix the factory"),
        ("wrong_shape", "the model's training step raised RuntimeError: mat1 and mat2 shapes cannot be multiplied"),
        ("too_big", "the model's training step ran out of device memory on its own, before memsched traced"),
    ],
)
def test_a_model_that_fails_on_its_own_is_a_user_error_naming_it(factory, said, tmp_path, capsys, monkeypatch):
    """The user's own code raising (a factory, or a training step that fails without memsched) is exit 2 and one
    line quoting what it raised, not memsched's internal error; nothing is written."""
    (tmp_path / "own_models.py").write_text(OWN_FACTORY)
    (tmp_path / "failing_models.py").write_text(FAILING_FACTORY)
    monkeypatch.syspath_prepend(str(tmp_path))
    path = tmp_path / "t.json"
    code, _, err = run(["trace", f"failing_models:{factory}", "--warmup", 1, "--steps", 1, "-o", path], capsys)
    flat = " ".join(err.split())
    assert code == 2 and "Traceback" not in err and "internal error" not in err
    assert said in flat
    assert not path.exists()
    # A script that asked for JSON tells the model's own failure from bad input.
    code, out, _ = run(
        ["trace", f"failing_models:{factory}", "--warmup", 1, "--steps", 1, "-o", path, "--json"], capsys
    )
    assert code == 2 and json.loads(out)["error"]["code"] == "user_code"


def test_a_step_that_fails_only_under_memsched_stays_an_internal_error(tmp_path, capsys, monkeypatch):
    """Where the first step fails with the tracer's KV-cache switch and passes without it, the fault is
    memsched's: an internal error (exit 1), not blamed on the model."""
    (tmp_path / "own_models.py").write_text(OWN_FACTORY)
    (tmp_path / "failing_models.py").write_text(FAILING_FACTORY)
    monkeypatch.syspath_prepend(str(tmp_path))
    code, _, err = run(["trace", "failing_models:needs_cache", "--warmup", 1, *QUICK[:2], "-o", tmp_path / "t"], capsys)
    assert code == 1 and "internal error" in err and "cannot run without its cache" in err


def test_the_factory_doc_example_traces(tmp_path, capsys, monkeypatch):
    """docs/factory.md's worked example, run as written: an own nn.Module, autocast and gradient clipping."""
    from pathlib import Path

    doc = (Path(__file__).parents[2] / "docs" / "factory.md").read_text()
    code_block = doc.split("```python\n", 1)[1].split("```", 1)[0]
    pkg = tmp_path / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "models.py").write_text(code_block)
    monkeypatch.syspath_prepend(str(tmp_path))
    path = tmp_path / "net.json"
    code, _, err = run(["trace", "mypkg.models:make_model", *QUICK, "-o", path], capsys)
    assert code == 0, err
    tr = load_trace(path)
    assert (tr.model, tr.batch_size, tr.seq_len) == ("net-4l", 4, 32)
    assert tr.layer_names == [f"blocks.{k}" for k in range(4)]
    params = sum(p.numel() * 4 for p in __import__("mypkg.models").models.make_model().model.parameters())
    n_tensors = len(list(__import__("mypkg.models").models.make_model().model.parameters()))
    assert tr.static.optimizer_state == 2 * params + 4 * n_tensors
    assert tr.dtype == "float32" and all(layer.backward_s > 0 for layer in tr.layers)
    code, _, err = run(["trace", "mypkg.models:make_model", "--optimizer", "sgd", *QUICK, "-o", path], capsys)
    assert code == 2 and "make_model() takes no `optimizer` argument" in " ".join(err.split())


def test_measure_without_the_trace_builds_what_the_schedule_was_traced_at(tmp_path, capsys):
    """A schedule records the workload its trace was recorded at (Schedule.traced): measure without --trace
    rebuilds it (it built the default batch 2 and compared the batch-4 prediction with it, 'within budget'), and
    a flag that departs from it is noted as with --trace; a model that is not it is refused."""
    trace, sched = tmp_path / "t.json", tmp_path / "s.json"
    quick = ["--small", "--layers", 2, "--steps", 1, "--warmup", 0]
    assert run(["trace", "gpt2", *quick, "--batch-size", 4, "--seq-len", 16, "-o", trace], capsys)[0] == 0
    assert run(["solve", trace, "--budget", "60%", "-o", sched], capsys)[0] == 0
    traced = load_schedule(sched).traced
    assert traced is not None and (traced.batch_size, traced.seq_len) == (4, 16)
    code, out, err = run(["measure", "gpt2", sched, *quick, "--no-baseline", "--json"], capsys)
    assert code == 0, err
    doc = json.loads(out)
    assert (doc["batch_size"], doc["seq_len"]) == (4, 16) and doc["notes"] == [], doc["notes"]
    code, out, err = run(["measure", "gpt2", sched, *quick, "--batch-size", 2, "--no-baseline", "--json"], capsys)
    assert code == 0 and any("--batch-size 2 overrides the trace's 4" in n for n in json.loads(out)["notes"])
    code, _, err = run(["measure", "gpt2", sched, "--small", "--layers", 3, "--no-baseline"], capsys)
    assert code == 2 and "the schedule's trace's model is 'gpt2-small2'" in err, err
