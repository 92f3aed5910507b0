"""memsched.integrations.lightning with the real Lightning Trainer (CPU): a tiny LightningModule (four residual MLP
blocks with dropout), 3 optimizer steps of 2 accumulated batches, validation (sanity check, mid-run, at the end)
and checkpoints mid-run and after. Under the callback the training and validation losses and the final weights
are the plain run's bitwise; the plan was carried out (ledger, host pool) and is gone after training."""

from __future__ import annotations

from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
import torch.nn.functional as F
from test_runtime_support import schedule_of
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from memsched.errors import MemschedError, ScheduleMismatchError
from memsched.integrations.lightning import MemschedCallback
from memsched.optimizer.decisions import KEEP, offload_subset, recompute
from memsched.optimizer.saved_profile import predicted_saved_profile
from memsched.runtime import HostBufferPool, SavedLedger, trace
from memsched.runtime.wrapping import is_wrapped
from memsched.schema import Action

BATCH, TOKENS, WIDTH, BLOCKS, CLASSES = 4, 32, 64, 4, 5
ACCUMULATE = 2
STEPS = 3


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(WIDTH)
        self.up = nn.Linear(WIDTH, 4 * WIDTH)
        self.down = nn.Linear(4 * WIDTH, WIDTH)
        self.drop = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.drop(self.down(F.gelu(self.up(self.norm(x)))))


class Net(nn.Module):
    def __init__(self, blocks: int = BLOCKS) -> None:
        super().__init__()
        self.embed = nn.Linear(16, WIDTH)
        self.blocks = nn.ModuleList(Block() for _ in range(blocks))
        self.head = nn.Linear(WIDTH, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        for b in self.blocks:
            h = b(h)
        return self.head(h)


class Lit(pl.LightningModule):
    def __init__(self, blocks: int = BLOCKS) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = Net(blocks)
        self.val_losses: list[torch.Tensor] = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self.net(x).flatten(0, 1), y.flatten())
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self.net(x).flatten(0, 1), y.flatten())
        self.log("val_loss", loss)
        self.val_losses.append(loss.detach().clone())

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def _loader(n: int, seed: int, shuffle: bool) -> DataLoader:
    g = torch.Generator().manual_seed(seed)
    data = TensorDataset(torch.randn(n, TOKENS, 16, generator=g), torch.randint(0, CLASSES, (n, TOKENS), generator=g))
    return DataLoader(data, batch_size=BATCH, shuffle=shuffle)


class _Record(pl.Callback):
    """Each training batch's loss, exactly, and whether the blocks were wrapped when it ended."""

    def __init__(self) -> None:
        self.losses: list[torch.Tensor] = []
        self.wrapped: list[bool] = []
        self.metrics: dict[str, torch.Tensor] = {}
        """What the run logged (its callback_metrics at the end)."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.losses.append(outputs["loss"].detach().clone())
        self.wrapped.append(all(is_wrapped(b) for b in pl_module.net.blocks))


def _fit(module: Lit, out: Path, callbacks=()):
    record = _Record()
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=STEPS,
        accumulate_grad_batches=ACCUMULATE,
        val_check_interval=4,
        limit_val_batches=2,
        callbacks=[record, pl.callbacks.ModelCheckpoint(dirpath=out, every_n_train_steps=2, save_top_k=-1), *callbacks],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    torch.manual_seed(123)  # the shuffle and dropout streams of the run
    trainer.fit(module, _loader(48, 1, shuffle=True), _loader(8, 2, shuffle=False))
    trainer.save_checkpoint(out / "final.ckpt")
    record.metrics = dict(trainer.callback_metrics)
    return record


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    module, out = Lit(), tmp_path_factory.mktemp("plain")
    record = _fit(module, out)
    assert len(record.losses) == STEPS * ACCUMULATE and len(module.val_losses) > 2  # sanity check + mid-run
    return module, out, record


def _trace_of(net: Net):
    """A trace of the bare net at the training batch shape (the tracer takes optimizer steps: give a copy)."""
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    x, y = next(iter(_loader(BATCH, 3, shuffle=False)))

    def step():
        F.cross_entropy(net(x).flatten(0, 1), y.flatten()).backward()
        opt.step()
        opt.zero_grad()

    return trace(net, step, steps=1, warmup=0, batch_size=BATCH, optimizer=opt, measure_bandwidth=False)


@pytest.fixture(scope="module")
def traced():
    return _trace_of(Lit().net)


def _assert_same_run(plain, module, record):
    ref_module, _, ref_record = plain
    assert all(torch.equal(a, b) for a, b in zip(record.losses, ref_record.losses, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(module.val_losses, ref_module.val_losses, strict=True))
    # What the run logged: nothing of what training_step logged while the tracer ran it counts.
    assert record.metrics.keys() == ref_record.metrics.keys() == {"train_loss", "val_loss"}
    assert all(torch.equal(record.metrics[k], ref_record.metrics[k]) for k in ref_record.metrics)
    ref, got = ref_module.state_dict(), module.state_dict()
    assert list(got) == list(ref) and all(torch.equal(got[k], ref[k]) for k in ref)


def _assert_removed(module, keys_before):
    assert not any(is_wrapped(m) for m in module.modules())
    assert all(not m._forward_pre_hooks and not m._forward_hooks for m in module.modules())
    assert type(module.net).forward is module.net.forward.__func__
    assert list(module.state_dict()) == keys_before


def _assert_same_checkpoints(plain, out: Path):
    for name in ("epoch=0-step=2.ckpt", "final.ckpt"):
        got = torch.load(out / name, weights_only=False)["state_dict"]
        ref = torch.load(plain[1] / name, weights_only=False)["state_dict"]
        assert list(got) == list(ref) and all(torch.equal(got[k], ref[k]) for k in ref), name


def test_given_schedule_for_the_inner_model(plain, traced, tmp_path):
    """A plan solved for the bare Net, applied to the LightningModule's `net` (module='net'): block 0 offloads
    two tensors, 1 keeps, 2..3 recompute as one segment."""
    tr = traced
    decisions = [offload_subset(tr, 0, (0, 2), done_by=1, prefetch_at=2), KEEP, recompute(), recompute(group=2)]
    sched = schedule_of(tr, decisions, "mixed")
    ledger, pool = SavedLedger(), HostBufferPool(pin_memory=False)
    passes: list[str] = []
    ledger.on_mark = lambda stage: passes.append(stage) if stage == "F0" else None
    cb = MemschedCallback(sched, module="net", ledger=ledger, pool=pool)
    module = Lit()
    keys = list(module.state_dict())

    record = _fit(module, tmp_path, [cb])

    _assert_same_run(plain, module, record)
    assert record.wrapped == [True] * (STEPS * ACCUMULATE)
    assert len(passes) == STEPS * ACCUMULATE  # validation forwards ran plain (no pass of the schedule)
    planned = sum(a.offload.bytes for a in sched.actions if a.action == Action.OFFLOAD)
    assert planned > 0 and pool.stats().allocated_bytes == planned and pool.stats().in_use_buffers == 0
    stats = ledger.stats()
    keep_all = predicted_saved_profile(tr, schedule_of(tr, [KEEP] * tr.n, "keep-all"))
    # At F3 layer 2's saved bytes are gone (the checkpoint holds its input); layer 3's exist while its own
    # forward runs, as the cost model has them (docs/cost-model.md, 'Actions').
    assert stats.stage_peak_bytes["F3"] <= keep_all[3] - tr.layers[2].saved_bytes + tr.layers[2].input_bytes
    predicted = max(predicted_saved_profile(tr, sched))
    assert abs(stats.peak_bytes - predicted) <= 0.05 * predicted, (stats.peak_bytes, predicted)
    assert cb.scheduled is None
    _assert_removed(module, keys)
    _assert_same_checkpoints(plain, tmp_path)


def test_plan_traced_in_the_run(plain, tmp_path):
    """budget= alone: the module's own training_step traced on the first batch (its self.log calls dropped),
    solved, applied; the tracer's steps and RNG draws are undone, so the run is the plain one bitwise."""
    cb = MemschedCallback(budget="85%", trace_steps=1, trace_warmup=0)
    module = Lit()
    keys = list(module.state_dict())
    record = _fit(module, tmp_path, [cb])
    _assert_same_run(plain, module, record)
    assert cb.trace is not None and cb.trace.layer_names == [f"net.blocks.{i}" for i in range(BLOCKS)]
    assert cb.trace.batch_size == BATCH
    assert cb.schedule is not None and cb.schedule.action_counts()["recompute"] > 0
    _assert_removed(module, keys)
    _assert_same_checkpoints(plain, tmp_path)


def test_bad_input_is_one_line(traced, tmp_path):
    sched = schedule_of(traced, [KEEP, recompute(), KEEP, KEEP])
    for kwargs, word in (
        ({"schedule": sched, "trace": traced}, "not both"),
        ({"schedule": sched, "budget": "50%"}, "budget="),
        ({}, "budget="),
    ):
        with pytest.raises(MemschedError) as e:
            MemschedCallback(**kwargs)
        assert word in str(e.value) and "\n" not in str(e.value)
    # A schedule solved for another model (2 blocks), and one given for the wrong module: fit() fails when
    # training starts, before any step, with one line, and leaves the module plain.
    other = schedule_of(_trace_of(Net(blocks=2)), [KEEP, recompute()])
    for cb, error, word in (
        (MemschedCallback(other, module="net"), ScheduleMismatchError, "4 repeated blocks"),
        (MemschedCallback(sched), ScheduleMismatchError, "not a module of this Lit"),
        (MemschedCallback(sched, module="nett"), MemschedError, "module='nett'"),
    ):
        module = Lit()
        keys = list(module.state_dict())
        with pytest.raises(error) as e:
            _fit(module, tmp_path, [cb])
        assert word in str(e.value) and "\n" not in str(e.value), str(e.value)
        _assert_removed(module, keys)
