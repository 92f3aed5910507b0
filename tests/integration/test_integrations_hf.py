"""memsched.integrations.hf with the real Trainer (transformers + accelerate, CPU): a tiny GPT-2 built from a config
(nothing downloaded), 3 optimizer steps of 2 accumulated micro-batches, an evaluation mid-run and after, a
checkpoint mid-run and save_model after. Under the callback the losses, eval losses and final weights are the
plain run's bitwise (the runtime's CPU guarantee, docs/integrations.md); the plan was carried out (the ledger and
the host pool) and is gone after train end."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from test_runtime_support import schedule_of
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

from memsched.errors import MemschedError, ScheduleMismatchError
from memsched.integrations.hf import MemschedCallback
from memsched.optimizer.decisions import KEEP, offload_subset, recompute
from memsched.optimizer.saved_profile import predicted_saved_profile
from memsched.runtime import HostBufferPool, SavedLedger, trace
from memsched.runtime.wrapping import is_wrapped
from memsched.schema import Action

BATCH, SEQ, LAYERS, VOCAB = 2, 32, 4, 128
MICRO = 2
"""Micro-batches per optimizer step (gradient accumulation)."""
STEPS = 3


def _model(layers: int = LAYERS) -> GPT2LMHeadModel:
    """GPT-2 with its default dropouts (0.1: the RNG matters) at a tiny width."""
    torch.manual_seed(0)
    return GPT2LMHeadModel(
        GPT2Config(
            n_layer=layers, n_embd=64, n_head=2, vocab_size=VOCAB, n_positions=SEQ, bos_token_id=0, eos_token_id=0
        )
    )


def _data(n: int, seed: int) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        ids = torch.randint(0, VOCAB, (SEQ,), generator=g)
        out.append({"input_ids": ids, "labels": ids.clone()})
    return out


TRAIN, EVAL = _data(24, 1), _data(4, 2)


class _Recording(Trainer):
    """The Trainer, recording each micro-batch's loss exactly (the logged ones are rounded)."""

    def training_step(self, *args, **kwargs):
        loss = super().training_step(*args, **kwargs)
        self.losses.append(loss.detach().clone())
        return loss


class _Watch(TrainerCallback):
    """Whether the layers are wrapped at each optimizer step's end (the plan applied while training)."""

    def __init__(self):
        self.wrapped: list[bool] = []

    def on_step_end(self, args, state, control, model=None, **kwargs):
        self.wrapped.append(all(is_wrapped(model.transformer.h[i]) for i in range(LAYERS)))


def _train(model, out: Path, callbacks=()):
    args = TrainingArguments(
        output_dir=str(out),
        per_device_train_batch_size=BATCH,
        per_device_eval_batch_size=BATCH,
        gradient_accumulation_steps=MICRO,
        max_steps=STEPS,
        learning_rate=1e-3,
        eval_strategy="steps",
        eval_steps=2,
        save_strategy="steps",
        save_steps=2,
        logging_steps=1,
        report_to=[],
        use_cpu=True,
        seed=0,
        disable_tqdm=True,
    )
    trainer = _Recording(model=model, args=args, train_dataset=TRAIN, eval_dataset=EVAL, callbacks=list(callbacks))
    trainer.losses = []
    torch.manual_seed(123)  # the dropout stream of the run (Trainer seeds at construction only)
    trainer.train()
    evals = [h["eval_loss"] for h in trainer.state.log_history if "eval_loss" in h]
    evals.append(trainer.evaluate()["eval_loss"])
    trainer.save_model(str(out / "final"))
    return trainer.losses, evals


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    model = _model()
    out = tmp_path_factory.mktemp("plain")
    losses, evals = _train(model, out)
    assert len(losses) == STEPS * MICRO and len(evals) == 3  # at step 2, at the last step, after
    return model, out, losses, evals


def _trace_of(model: GPT2LMHeadModel):
    """A trace of the model at the Trainer's micro-batch shape (the tracer takes optimizer steps: give a copy)."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batch = {k: torch.stack([s[k] for s in TRAIN[:BATCH]]) for k in TRAIN[0]}

    def step():
        model(**batch).loss.backward()
        opt.step()
        opt.zero_grad()

    return trace(model, step, steps=1, warmup=0, batch_size=BATCH, seq_len=SEQ, optimizer=opt, measure_bandwidth=False)


@pytest.fixture(scope="module")
def traced():
    return _trace_of(_model())


def _assert_same_run(plain, model, losses, evals):
    ref_model, _, ref_losses, ref_evals = plain
    assert all(torch.equal(a, b) for a, b in zip(losses, ref_losses, strict=True)), (losses, ref_losses)
    assert evals == ref_evals
    ref = ref_model.state_dict()
    got = model.state_dict()
    assert list(got) == list(ref)
    bad = [k for k in ref if not torch.equal(got[k], ref[k])]
    assert not bad, f"weights differ from the plain run's in {bad[:5]}"


def _assert_removed(model, keys_before):
    assert not any(is_wrapped(m) for m in model.modules())
    assert all(not m._forward_pre_hooks and not m._forward_hooks for m in model.modules())
    assert type(model).forward is model.forward.__func__
    assert list(model.state_dict()) == keys_before


def test_given_schedule_with_accumulation_eval_and_saves(plain, traced, tmp_path):
    """A plan with every action (layer 0 offloads two tensors, 1 keeps, 2..3 recompute as one segment)."""
    tr = traced
    decisions = [offload_subset(tr, 0, (0, 3), done_by=1, prefetch_at=2), KEEP, recompute(), recompute(group=2)]
    sched = schedule_of(tr, decisions, "mixed")
    ledger, pool = SavedLedger(), HostBufferPool(pin_memory=False)
    passes: list[str] = []
    ledger.on_mark = lambda stage: passes.append(stage) if stage == "F0" else None
    cb, watch = MemschedCallback(sched, ledger=ledger, pool=pool), _Watch()
    model = _model()
    keys = list(model.state_dict())

    losses, evals = _train(model, tmp_path, [cb, watch])

    _assert_same_run(plain, model, losses, evals)
    # Applied at every step; one schedule pass per training micro-batch and none for the evaluations (plain).
    assert watch.wrapped == [True] * STEPS
    assert len(passes) == STEPS * MICRO
    # The plan carried out. Offload: the host pool holds exactly the planned bytes (one micro-batch's, reused
    # by the next ones) and lends none out after the run.
    planned = sum(a.offload.bytes for a in sched.actions if a.action == Action.OFFLOAD)
    assert planned > 0 and pool.stats().allocated_bytes == planned and pool.stats().in_use_buffers == 0
    # Recompute: in the forward of the segment's last layer the ledger's live saved bytes lack what layer 2
    # would have saved, and the peak is the plan's predicted one (within 5%, the runtime tests' tolerance),
    # not keep-all's.
    stats = ledger.stats()
    keep_all = predicted_saved_profile(tr, schedule_of(tr, [KEEP] * tr.n, "keep-all"))
    # At F3 layer 2's saved bytes are gone (the checkpoint holds its input); layer 3's exist while its own
    # forward runs, as the cost model has them (docs/cost-model.md, 'Actions').
    assert stats.stage_peak_bytes["F3"] <= keep_all[3] - tr.layers[2].saved_bytes + tr.layers[2].input_bytes
    predicted = max(predicted_saved_profile(tr, sched))
    assert abs(stats.peak_bytes - predicted) <= 0.05 * predicted, (stats.peak_bytes, predicted)
    assert cb.schedule is sched and cb.scheduled is None  # removed at train end
    _assert_removed(model, keys)
    # Saved while applied (checkpoint-2, mid-run) and after (save_model): the plain run's files, key for key
    # and bit for bit.
    for name in ("checkpoint-2", "final"):
        got = load_file(str(tmp_path / name / "model.safetensors"))
        ref = load_file(str(plain[1] / name / "model.safetensors"))
        assert list(got) == list(ref) and all(torch.equal(got[k], ref[k]) for k in ref), name
        assert set(got) <= set(keys)


def test_plan_traced_in_the_run(plain, tmp_path):
    """budget= alone: the first steps traced on the Trainer's model, optimizer and first batch, solved, applied;
    the tracer's optimizer steps and RNG draws are undone, so the run is the plain one bitwise."""
    cb = MemschedCallback(budget="85%", trace_steps=1, trace_warmup=0)
    model = _model()
    keys = list(model.state_dict())
    losses, evals = _train(model, tmp_path, [cb])
    _assert_same_run(plain, model, losses, evals)
    assert cb.trace is not None and cb.trace.layer_names == [f"transformer.h.{i}" for i in range(LAYERS)]
    assert (cb.trace.batch_size, cb.trace.seq_len) == (BATCH, SEQ)
    assert cb.schedule is not None and cb.schedule.action_counts()["recompute"] > 0
    _assert_removed(model, keys)


def test_trace_given_is_solved(traced, tmp_path):
    cb = MemschedCallback(trace=traced, budget="85%")
    model = _model()
    _train(model, tmp_path, [cb])
    assert cb.schedule is not None and cb.schedule.trace_hash == traced.content_hash()
    assert cb.schedule.action_counts()["recompute"] > 0


def _one_line(err: pytest.ExceptionInfo) -> str:
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(("MemschedCallback: ", "schedule ")), msg
    return msg


def test_bad_input_is_one_line(traced, tmp_path):
    sched = schedule_of(traced, [KEEP, KEEP, recompute(), KEEP])
    with pytest.raises(MemschedError) as e:
        MemschedCallback(sched, trace=traced)
    assert "not both" in _one_line(e)
    with pytest.raises(MemschedError) as e:
        MemschedCallback(sched, budget="50%")
    assert "budget=" in _one_line(e)
    with pytest.raises(MemschedError) as e:
        MemschedCallback()
    assert "budget=" in _one_line(e)
    with pytest.raises(MemschedError) as e:
        MemschedCallback(budget="half")
    assert "half" in str(e.value) and "\n" not in str(e.value)
    # A schedule solved for another model (2 blocks) given to a Trainer of this one (4 blocks): train() fails
    # at train begin, before any step, and leaves the model plain.
    small = _trace_of(_model(layers=2))
    other = schedule_of(small, [KEEP, recompute()])
    model = _model()
    keys = list(model.state_dict())
    with pytest.raises(ScheduleMismatchError) as e:
        _train(model, tmp_path, [MemschedCallback(other)])
    assert "4 repeated blocks" in _one_line(e)
    _assert_removed(model, keys)
