"""memsched in Lightning's `Trainer`: `MemschedCallback` applies a schedule when training starts and removes it
when training ends or raises (docs/integrations.md). Needs `pip install 'memsched[lightning]'`.

    trainer = lightning.pytorch.Trainer(max_epochs=1, callbacks=[MemschedCallback(budget="50%")])
    trainer.fit(module, train_loader, val_loader)

The callback only decides when; the runtime's `apply_schedule` carries the plan out. What Lightning does
around it is unchanged: validation runs plain (Lightning validates under `torch.inference_mode()`, and the
runtime runs a layer whose forward records no graph as is), gradient accumulation is one schedule pass per
micro-batch, and checkpoints hold the module's own state dict (the schedule is hooks only).
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

try:
    import lightning.pytorch as pl
except ImportError as e:  # one line that names the extra, as the CLI does for its own
    raise ImportError(
        f"memsched.integrations.lightning needs lightning ({e.name} is missing): pip install 'memsched[lightning]'"
    ) from None

import torch
from torch import nn

from memsched.errors import MemschedError
from memsched.integrations.common import (
    PlanAccess,
    PlanHolder,
    RunStep,
    ScheduleArg,
    TraceArg,
    TraceSettings,
    batch_shape,
    first_batch,
)
from memsched.options import SolveOptions
from memsched.runtime import HostBufferPool, SavedLedger

_OWNER = "MemschedCallback"


class MemschedCallback(PlanAccess, pl.Callback):
    """A `lightning.pytorch.Callback` that trains under a memsched schedule.

    schedule: a solved Schedule (or the path of its JSON file), as `memsched solve` writes it.
    trace: a Trace (or its path) to solve here under `budget` instead.
    budget: with `trace`, or alone: then the first steps of this run are traced (the module's own
        `training_step` on the first batch, backward, its optimizer's step; automatic optimization only), the
        training state is put back, the trace is solved under `budget` and the plan applied. '8GiB', '500MB',
        bytes, or 'N%' (static bytes + N% of the keep-all activation peak).
    options: the solve options (memsched.options.SolveOptions) with `trace` or `budget`.
    module: the attribute path of the submodule the plan is for (e.g. 'model', when the schedule was solved for
        the bare model a LightningModule holds); default the LightningModule itself.
    layers: the layer patterns (regexes) the trace was made with / to trace with, if not the repeated blocks.
    trace_steps, trace_warmup: the tracer's timed and warm-up steps when tracing in the run (its defaults).
    ledger, pool: passed to `apply_schedule` (a SavedLedger counting live saved bytes; a host buffer pool).

    After training starts, `schedule` (and `trace`, when one was given or traced) hold the plan; `scheduled`
    is the runtime's handle while the plan is applied (None outside training).
    """

    def __init__(
        self,
        schedule: ScheduleArg | None = None,
        *,
        trace: TraceArg | None = None,
        budget: str | int | None = None,
        options: SolveOptions | None = None,
        module: str | None = None,
        layers: Sequence[str] | None = None,
        trace_steps: int | None = None,
        trace_warmup: int | None = None,
        ledger: SavedLedger | None = None,
        pool: HostBufferPool | None = None,
    ) -> None:
        self._plan = PlanHolder(
            _OWNER,
            schedule=schedule,
            trace=trace,
            budget=budget,
            options=options,
            layers=layers,
            tracing=TraceSettings(trace_steps, trace_warmup),
            ledger=ledger,
            pool=pool,
        )
        self.module = module

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        target = self._target(pl_module)
        self._plan.apply(target, lambda: _run_step(trainer, pl_module, target))

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._plan.remove()

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        self._plan.remove()

    def _target(self, pl_module: pl.LightningModule) -> nn.Module:
        if self.module is None:
            return pl_module
        try:
            return pl_module.get_submodule(self.module)
        except AttributeError:
            raise MemschedError(
                f"{_OWNER}: module={self.module!r} is not a submodule of {type(pl_module).__name__}; give the "
                "attribute path of the model the schedule was solved for (e.g. 'model'), or leave module= out"
            ) from None


@contextlib.contextmanager
def _logging_off(pl_module: pl.LightningModule) -> Iterator[None]:
    """The tracer's steps are not training steps: what `training_step` logs in them must not reach the run's
    metrics (outside the loop, Lightning would record it under the hook that is running)."""

    def ignore(*_args: Any, **_kwargs: Any) -> None:
        return None

    pl_module.log = ignore  # type: ignore[method-assign]
    pl_module.log_dict = ignore  # type: ignore[method-assign]
    try:
        yield
    finally:
        del pl_module.log
        del pl_module.log_dict


def _run_step(trainer: pl.Trainer, pl_module: pl.LightningModule, target: nn.Module) -> RunStep:
    """Lightning's automatic-optimization step as the tracer runs it: the first batch moved as Lightning moves
    it, `training_step` under the precision plugin's context, backward, the optimizer's step."""
    if not pl_module.automatic_optimization:
        raise MemschedError(
            f"{_OWNER}: tracing in the run needs automatic optimization (this module steps its optimizers itself); "
            "trace yourself (memsched.runtime.trace) and give trace= or schedule="
        )
    if len(trainer.optimizers) != 1:
        raise MemschedError(
            f"{_OWNER}: tracing in the run needs exactly one optimizer, the module has {len(trainer.optimizers)}; "
            "trace yourself (memsched.runtime.trace) and give trace= or schedule="
        )
    opt = trainer.optimizers[0]
    batch = trainer.strategy.batch_to_device(first_batch(trainer.train_dataloader, _OWNER))
    params = inspect.signature(pl_module.training_step).parameters
    extra = (0,) if len(params) >= 2 or any(p.kind == p.VAR_POSITIONAL for p in params.values()) else ()

    def step() -> None:
        pl_module.train()
        with _logging_off(pl_module), trainer.precision_plugin.train_step_context():
            out = pl_module.training_step(batch, *extra)
        loss = out.get("loss") if isinstance(out, Mapping) else out
        if not isinstance(loss, torch.Tensor):
            raise MemschedError(
                f"{_OWNER}: training_step returned no loss for the first batch, so the run cannot be traced; "
                "trace yourself (memsched.runtime.trace) and give trace= or schedule="
            )
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    size, seq = batch_shape(batch)
    return RunStep(step, [opt], size, seq, type(target).__name__, owner_module=pl_module)
