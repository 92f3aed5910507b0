"""Compiled blocks (`block.compile()`, the torchtitan pattern) and CPU bf16 autocast: traced as they run, replayed
with every planned byte moved and gradients bitwise equal to the same step without a schedule (issue 21 item 3).

Compile time dominates on 2 cores: one tiny GPT-2 of 3 blocks is compiled once per module (every test below
reuses it; a re-trace or a replay adds no recompile, which is what the wrapping is for)."""

from __future__ import annotations

import json
import logging
import re

import pytest
import torch
from test_runtime_support import assert_bitwise, grads, schedule_of, tiny

from memsched.cli import main
from memsched.errors import MemschedError
from memsched.io import load_trace
from memsched.optimizer.decisions import KEEP, offload_all, recompute
from memsched.runtime import apply_schedule, builtin_workload, trace
from memsched.runtime.models import compile_blocks
from memsched.schema import Schedule, Trace

MISMATCH = "the schedule offloads"
"""The replay's warning when a step offloads other bytes than planned (runtime/replay.py `_check_offloaded`)."""


def _trace(w) -> Trace:
    return trace(w.model, w.step, steps=1, warmup=1, batch_size=2, seq_len=32, measure_bandwidth=False)


def _offload_plan(tr: Trace) -> Schedule:
    """Every layer offloads every saved tensor, released after its own forward, prefetched at its backward."""
    return schedule_of(tr, [offload_all(tr, i, i, i) for i in range(tr.n)])


def _recompute_plan(tr: Trace) -> Schedule:
    """Layers 0..1 recompute as one segment (across two compiled blocks), layer 2 is kept."""
    return schedule_of(tr, [recompute(), recompute(group=2), KEEP])


def _replay(w, sched: Schedule, tr: Trace, caplog, seed: int = 0) -> tuple[dict[str, torch.Tensor], int]:
    """Gradients of one scheduled step and the host bytes its offloads allocated; fails on the mismatch warning."""
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="memsched"), apply_schedule(w.model, sched, trace=tr) as sm:
        _, got = grads(w, sm, seed=seed)
        moved = sm.pool_stats().allocated_bytes
    assert not [r.getMessage() for r in caplog.records if MISMATCH in r.getMessage()]
    return got, moved


def _planned(sched: Schedule) -> int:
    return sum(a.offload.bytes for a in sched.actions if a.offload)


@pytest.fixture(scope="module", autouse=True)
def _forget_compiled_code():
    """Dynamo's caches keep the compiled blocks' constants alive after the tests: reset them, so that later
    tests which count every live CPU tensor (tests/unit/test_runtime_memory.py) see none of ours."""
    yield
    import gc

    torch._dynamo.reset()
    gc.collect()


@pytest.fixture(scope="module")
def compiled():
    w = tiny("gpt2", layers=3)  # dropout 0.1: the recomputation must replay the compiled RNG too
    eager = _trace(w)
    assert compile_blocks(w.model) == 3
    return w, _trace(w), eager


@pytest.fixture(scope="module")
def autocast():
    w = builtin_workload("llama", small=True, num_layers=3, batch_size=2, seq_len=32, optimizer="none", autocast="bf16")
    assert w.autocast is torch.bfloat16 and w.model_id == "llama-small3+autocast-bf16"
    return w, _trace(w)


def test_compiled_trace_holds_what_the_compiled_step_saves(compiled, caplog):
    """The compiled blocks save other tensors than the eager ones (fused, partitioned): the trace taken under
    compile records those, and an eager trace replayed on the compiled blocks misses planned bytes (the
    warning this work removes: 58% moved)."""
    w, tr, eager = compiled
    assert tr.layers[0].saved_tensor_bytes != eager.layers[0].saved_tensor_bytes
    assert tr.layers[0].saved_bytes < eager.layers[0].saved_bytes
    sched = _offload_plan(eager)
    with caplog.at_level(logging.WARNING, logger="memsched"), apply_schedule(w.model, sched, trace=eager) as sm:
        grads(w, sm)
        moved = sm.pool_stats().allocated_bytes
    assert moved < _planned(sched)
    assert any(MISMATCH in r.getMessage() for r in caplog.records)


def test_compiled_offload_moves_every_planned_byte(compiled, caplog):
    w, tr, _ = compiled
    _, ref = grads(w)
    sched = _offload_plan(tr)
    got, moved = _replay(w, sched, tr, caplog)
    assert_bitwise(got, ref)
    assert moved == _planned(sched) == sum(x.saved_bytes for x in tr.layers)


def test_compiled_recompute_across_blocks(compiled, caplog):
    w, tr, _ = compiled
    _, ref = grads(w, seed=1)
    _, other = grads(w, seed=2)
    assert any(not torch.equal(ref[k], other[k]) for k in ref), "dropout must be active for this test to mean much"
    got, moved = _replay(w, _recompute_plan(tr), tr, caplog, seed=1)
    assert moved == 0
    assert_bitwise(got, ref)


def test_compiled_blocks_are_restored_after_the_replay(compiled):
    """The wrappers come off: the block's own compiled call is back, and no hook is left."""
    w, tr, _ = compiled
    before = [b.__dict__["_compiled_call_impl"] for b in w.model.transformer.h]
    with apply_schedule(w.model, _offload_plan(tr), trace=tr):
        assert all(b.__dict__["_compiled_call_impl"] is not f for b, f in zip(w.model.transformer.h, before))
    assert [b.__dict__["_compiled_call_impl"] for b in w.model.transformer.h] == before


def test_autocast_offload_moves_every_planned_byte(autocast, caplog):
    w, tr = autocast
    _, ref = grads(w)
    sched = _offload_plan(tr)
    got, moved = _replay(w, sched, tr, caplog)
    assert_bitwise(got, ref)
    assert moved == _planned(sched) == sum(x.saved_bytes for x in tr.layers)
    # Autocast's cache keeps the bf16 weight casts a layer saves on the device until the autocast region ends, so
    # offloading them would free nothing in the forward (the ledger's peak was 519,680 B against 318,976 B
    # predicted). The tracer counts those of layers 0 and 1 as static (the last layer's are not checked: no later
    # layer starts), so no plan moves them and the replay has nothing to name.
    assert tr.static.saved_held_by_code == 204_800
    assert not [r.getMessage() for r in caplog.records if "still on the device" in r.getMessage()]


def test_autocast_recompute(autocast, caplog):
    w, tr = autocast
    _, ref = grads(w)
    got, moved = _replay(w, _recompute_plan(tr), tr, caplog)
    assert moved == 0
    assert_bitwise(got, ref)


def test_autocast_trace_counts_the_bf16_copies():
    """Under autocast a layer saves bf16 copies of its weights and activations: other bytes than in float32."""
    kw = {"small": True, "num_layers": 2, "batch_size": 2, "seq_len": 32, "optimizer": "none"}
    fp32 = _trace(builtin_workload("llama", **kw))
    bf16 = _trace(builtin_workload("llama", autocast="bf16", **kw))
    q_proj_bf16 = 64 * 64 * 2  # the bf16 copy of a 64x64 weight
    assert q_proj_bf16 in bf16.layers[0].saved_tensor_bytes
    assert bf16.layers[0].saved_tensor_bytes != fp32.layers[0].saved_tensor_bytes


def test_whole_model_compiled_is_refused():
    w = tiny("gpt2", layers=2)
    w.model.compile()  # lazily: nothing is compiled before a call, and the check comes before any call
    with pytest.raises(MemschedError, match="compiled as a whole.*block.compile"):
        _trace(w)


def test_fp16_autocast_on_the_cpu_is_refused():
    with pytest.raises(MemschedError, match="--autocast fp16 on the CPU.*--autocast bf16"):
        builtin_workload("gpt2", small=True, num_layers=2, autocast="fp16")


_NO_COMPILER = """
import torch._inductor.config as inductor
from memsched.errors import MemschedError
from memsched.runtime.models import compile_blocks
from test_runtime_support import tiny

w = tiny("gpt2", layers=2)
with inductor.patch({"cpp.cxx": ("no-such-g++",), "fx_graph_cache": False}):
    try:
        compile_blocks(w.model)
    except MemschedError as e:
        print(e)
print(sum(b.__dict__.get("_compiled_call_impl") is not None for b in w.model.transformer.h), "compiled")
"""


def test_compile_without_a_working_compiler_is_one_line():
    """Inductor pointed at a C++ compiler that does not exist (its cache off, so it must compile): the real
    failure, reported as one line naming --compile and the fix, before any block is compiled. In a fresh
    process: once the probe compiled in this one, Dynamo keeps its code and would not compile it again."""
    import subprocess
    import sys
    from pathlib import Path

    here = Path(__file__).parent
    done = subprocess.run(
        [sys.executable, "-c", _NO_COMPILER], capture_output=True, text=True, timeout=300, cwd=here, check=True
    )
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 2, done.stdout + done.stderr
    assert re.match(r"--compile: torch.compile cannot build kernels .*g\+\+.*drop --compile$", lines[0])
    assert lines[1] == "0 compiled"


def _cli(argv, capsys) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as e:
        main([str(a) for a in argv])
    captured = capsys.readouterr()
    return e.value.code, captured.out, captured.err


def test_cli_trace_solve_measure_compiled_bf16(tmp_path, capsys):
    """`memsched trace --compile --autocast bf16`, solve with offload, `measure` with the same flags: the
    replay moves the planned bytes (measured peak = predicted) and the flags are in the reproducing command;
    without them the trace is refused with the flags to pass."""
    t, s = tmp_path / "t.json", tmp_path / "s.json"
    model = ["gpt2", "--small", "--layers", 2, "--batch", 2, "--seq-len", 32]
    flags = ["--compile", "--autocast", "bf16"]
    code, _, err = _cli(["trace", *model, *flags, "--steps", 1, "--warmup", 1, "--threads", 1, "-o", t], capsys)
    assert code == 0, err
    tr = load_trace(t)
    assert tr.model == "gpt2-small2+compile+autocast-bf16"
    one_layer = tr.layers[0].saved_bytes
    budget = tr.baseline.peak_bytes - one_layer // 2
    code, _, err = _cli(["solve", t, "--budget", budget, "--actions", "keep,offload", "-o", s], capsys)
    assert code == 0, err
    code, out, err = _cli(
        ["measure", *model, s, "--trace", t, *flags, "--steps", 1, "--warmup", 1, "--no-baseline", "--json"], capsys
    )
    assert code == 0, err
    doc = json.loads(out)
    side = doc["scheduled"]
    assert side["predicted_peak_bytes"] == side["measured_peak_bytes"]
    assert "--compile --autocast bf16" in doc["command"]
    assert MISMATCH not in err
    code, _, err = _cli(["measure", *model, s, "--trace", t, "--steps", 1, "--warmup", 0], capsys)
    assert code != 0 and "--compile, --autocast" in err and "Traceback" not in err
    code, _, err = _cli(["trace", *model, "--autocast", "fp16", "-o", t], capsys)
    assert code != 0 and len(err.strip().splitlines()) == 1 and "--autocast bf16" in err
