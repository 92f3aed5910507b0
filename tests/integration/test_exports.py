"""Exports to native formats (issue 21, item 2), on a small Llama (CPU): each export gives keep-all's gradients;
a recompute export's measured whole-step peak (every live CPU tensor byte, memsched.runtime.memory) is within
5% of the schedule's prediction, or of the export's own prediction where the format drops part of the plan;
what a format drops is said (warning line and `memsched.lost`); bad input is one MemschedError line."""

from __future__ import annotations

import gc
import json
import tomllib

import pytest
import torch
from test_runtime_support import assert_bitwise, schedule_of

from memsched.cli import main
from memsched.errors import MemschedError, ScheduleMismatchError
from memsched.io import save_model
from memsched.optimizer.decisions import KEEP, offload_all, recompute
from memsched.runtime import Workload, builtin_workload, trace
from memsched.runtime.export import apply_checkpoint_wrappers, apply_selective_checkpointing, unwrapped_name
from memsched.runtime.memory import MemoryMeter
from memsched.schema import Schedule, Trace
from memsched.service.export import FORMATS, export_schedule

PEAK_WITHIN = 0.05


def _workload() -> Workload:
    return builtin_workload("llama", small=True, batch_size=4, seq_len=64, optimizer="adamw")


_TRACE: list[Trace] = []


def _trace() -> Trace:
    """The small Llama traced with its AdamW step, once (nothing else of size alive: the CPU peak counts all)."""
    if not _TRACE:
        gc.collect()
        w = _workload()
        _TRACE.append(
            trace(w.model, w.step, steps=1, warmup=1, batch_size=4, optimizer=w.optimizer, measure_bandwidth=False)
        )
    return _TRACE[0]


def _grads(w: Workload) -> dict[str, torch.Tensor]:
    w.model.zero_grad(set_to_none=True)
    w.backward()
    return {unwrapped_name(n): p.grad.clone() for n, p in w.model.named_parameters() if p.grad is not None}


def _measured_peak(apply) -> int:
    """The whole-step peak of AdamW steps on a fresh small Llama with `apply(model)` on it."""
    gc.collect()
    w = _workload()
    with apply(w.model):
        w.step()  # the optimizer state exists from here on, as in the traced steps
        return MemoryMeter(torch.device("cpu")).measure(w.step).peak_bytes


PLANS = {
    "alternate": lambda tr: [KEEP, recompute(), KEEP, recompute()],
    "first-two": lambda tr: [recompute(), recompute(), KEEP, KEEP],
    "segment": lambda tr: [recompute(), recompute(group=0), KEEP, KEEP],
    "offload": lambda tr: [offload_all(tr, 0, 1, 1), recompute(), KEEP, KEEP],
}


def _schedule(plan: str) -> Schedule:
    tr = _trace()
    return schedule_of(tr, PLANS[plan](tr), plan)


@pytest.mark.parametrize(
    "apply",
    [
        apply_checkpoint_wrappers,
        apply_selective_checkpointing,
        lambda m, s: apply_selective_checkpointing(m, s, wrap_kept=True),
    ],
    ids=["checkpoint", "sac", "sac-wrap-kept"],
)
@pytest.mark.parametrize("plan", ["alternate", "segment", "offload"])
def test_exports_give_keep_alls_gradients(apply, plan):
    sched = _schedule(plan)
    torch.manual_seed(0)
    w = _workload()
    ref = _grads(w)
    with apply(w.model, sched) as native:
        got = _grads(w)
        assert native.wrapped  # something is checkpointed
        assert all(".layers." in n for n in native.wrapped)
    assert_bitwise(ref, got)
    assert not any("_checkpoint_wrapped_module" in n for n, _ in w.model.named_parameters())  # removed
    assert w.model.config.use_cache  # put back


@pytest.mark.parametrize("apply", [apply_checkpoint_wrappers, apply_selective_checkpointing], ids=["checkpoint", "sac"])
@pytest.mark.parametrize("plan", ["alternate", "first-two"])
def test_recompute_export_peak_is_the_schedules_prediction(apply, plan):
    sched = _schedule(plan)
    assert export_schedule(sched, "checkpoint").lost is None  # single-layer segments: carried whole
    measured = _measured_peak(lambda m: apply(m, sched))
    predicted = sched.prediction.peak_bytes
    assert abs(measured / predicted - 1) <= PEAK_WITHIN, f"measured {measured} B, predicted {predicted} B"


@pytest.mark.parametrize("plan", ["segment", "offload"])
def test_what_a_format_drops_is_priced_and_the_price_is_measured(plan, caplog):
    """A two-layer segment is checkpointed layer by layer, an offloaded layer is kept: the export says so and
    predicts that plan's peak, and the measured peak is within 5% of that prediction."""
    sched, tr = _schedule(plan), _trace()
    with pytest.raises(MemschedError, match="give --trace"):
        export_schedule(sched, "checkpoint")
    ex = export_schedule(sched, "checkpoint", tr)
    lost = ex.lost
    assert lost is not None and not ex.document["memsched"]["exact"]
    assert ex.document["memsched"]["lost"]["predicted_peak_bytes"] == lost.predicted_peak_bytes
    assert lost.extra_peak_bytes == lost.predicted_peak_bytes - sched.prediction.peak_bytes
    if plan == "offload":
        assert lost.offloaded_layers == ["model.layers.0"] and "model.layers.0" in ex.warnings[0]
        assert lost.extra_peak_bytes == tr.layers[0].saved_bytes  # kept instead of offloaded
    else:
        assert lost.split_segments == [("model.layers.0", "model.layers.1")] and lost.extra_peak_bytes > 0
    assert f"{lost.extra_peak_bytes:+,} B" in ex.warnings[0]
    measured = _measured_peak(lambda m: apply_checkpoint_wrappers(m, sched))
    assert abs(measured / lost.predicted_peak_bytes - 1) <= PEAK_WITHIN, (measured, lost.predicted_peak_bytes)


def test_torchtitan_config():
    tr = _trace()
    every_second = tomllib.loads(export_schedule(_schedule("alternate"), "torchtitan", tr).text)
    ac = every_second["activation_checkpoint"]
    # torchtitan's layer SAC checkpoints block k when (k + 1) % N == 0.
    assert ac["mode"] == "selective" and ac["selective_ac_option"] == "2" and ac["memsched_blocks"] == [1, 3]
    assert every_second["memsched"]["exact"] is True
    first = export_schedule(_schedule("first-two"), "torchtitan", tr)
    doc = tomllib.loads(first.text)["activation_checkpoint"]
    assert "selective_ac_option" not in doc and doc["memsched_blocks"] == [0, 1]
    assert any("no selective_ac_option" in w for w in first.warnings)
    full = schedule_of(tr, [recompute()] * 4)
    assert tomllib.loads(export_schedule(full, "torchtitan", tr).text)["activation_checkpoint"]["mode"] == "full"
    as_json = json.loads(export_schedule(full, "torchtitan", tr, toml=False).text)
    assert as_json["activation_checkpoint"]["mode"] == "full"


def test_megatron_lists():
    tr = _trace()
    block = json.loads(export_schedule(_schedule("first-two"), "megatron", tr).text)
    assert (block["recompute_granularity"], block["recompute_method"], block["recompute_num_layers"]) == (
        "full",
        "block",
        2,
    )
    assert block["memsched"]["exact"] and not block["cpu_offloading"]
    chunks = schedule_of(tr, [recompute(), recompute(group=0), recompute(), recompute(group=2)])
    uniform = export_schedule(chunks, "megatron", tr)
    assert uniform.lost is None  # Megatron's uniform method keeps two-layer chunks
    assert (uniform.document["recompute_method"], uniform.document["recompute_num_layers"]) == ("uniform", 2)
    off = export_schedule(_schedule("offload"), "megatron", tr)
    assert off.document["cpu_offloading"] and off.document["cpu_offloading_num_layers"] == 1
    assert off.document["offload_layers"] == [0] and off.document["recompute_layers"] == [1]
    assert off.lost is not None and off.lost.offloaded_layers == ["model.layers.0"]
    assert "offload timing of model.layers.0" in off.warnings[0]


def test_bad_input_is_one_line(tmp_path, capsys):
    sched = _schedule("alternate")
    gpt2 = builtin_workload("gpt2", small=True, seq_len=16, optimizer="none")
    with pytest.raises(ScheduleMismatchError, match="not a module of this GPT2LMHeadModel"):
        apply_checkpoint_wrappers(gpt2.model, sched)
    other = trace(gpt2.model, gpt2.backward, steps=1, warmup=0, batch_size=2, measure_bandwidth=False)
    with pytest.raises(MemschedError):
        export_schedule(sched, "checkpoint", other)
    with pytest.raises(MemschedError, match="not an export format"):
        export_schedule(sched, "deepspeed")
    assert set(FORMATS) == {"checkpoint", "sac", "torchtitan", "megatron"}
    s, t = tmp_path / "s.json", tmp_path / "t.json"
    save_model(sched, s)
    save_model(other, t)

    def cli(*args: str) -> tuple[int, str]:
        capsys.readouterr()  # what building the models printed
        with pytest.raises(SystemExit) as e:
            main(["export", str(s), *args])
        return e.value.code, capsys.readouterr().err

    for args in (["--format", "deepspeed"], ["--format", "sac", "--trace", str(t)]):
        code, err = cli(*args)
        lines = [x for x in err.splitlines() if x.strip()]
        assert code == 2 and len(lines) == 1 and lines[0].startswith("error:"), err
    code, err = cli("--format", "megatron", "-o", str(tmp_path / "m.json"))
    assert code == 0, err
    assert json.loads((tmp_path / "m.json").read_text())["recompute_layers"] == [1, 3]
