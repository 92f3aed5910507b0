"""memsched in the Hugging Face `Trainer`: `MemschedCallback` applies a schedule on train begin and removes it
on train end (docs/integrations.md). Needs `pip install 'memsched[hf]'` (transformers and accelerate).

    trainer = Trainer(model=model, args=args, train_dataset=ds, callbacks=[MemschedCallback(budget="50%")])
    trainer.train()

The callback only decides when; the runtime's `apply_schedule` carries the plan out. What the Trainer does
around it is unchanged:
- gradient accumulation: every micro-batch's forward is one pass of the schedule (the runtime starts a pass at
  the first traced layer), its backward the pass's backward;
- evaluation runs plain: the Trainer evaluates under `torch.no_grad()`, and the runtime runs a layer whose
  forward records no graph as is (nothing saved, nothing to offload or recompute);
- `save_model` and checkpoints save the model's own state dict: the schedule is hooks only (no attribute,
  parameter or buffer of the model is changed, so no key is added or renamed).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from typing import Any

try:
    from accelerate.utils import send_to_device
    from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
except ImportError as e:  # one line that names the extra, as the CLI does for its own
    raise ImportError(
        f"memsched.integrations.hf needs transformers and accelerate ({e.name} is missing): pip install 'memsched[hf]'"
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


class MemschedCallback(PlanAccess, TrainerCallback):
    """A `transformers.TrainerCallback` that trains under a memsched schedule.

    schedule: a solved Schedule (or the path of its JSON file), as `memsched solve` writes it.
    trace: a Trace (or its path) to solve here under `budget` instead.
    budget: with `trace`, or alone: then the first steps of this run are traced on the Trainer's own model,
        optimizer and first batch (`model(**batch)`'s loss, as the Trainer's default `compute_loss`), the
        training state is put back, the trace is solved under `budget` and the plan applied. '8GiB', '500MB',
        bytes, or 'N%' (static bytes + N% of the keep-all activation peak).
    options: the solve options (memsched.options.SolveOptions) with `trace` or `budget`.
    layers: the layer patterns (regexes) the trace was made with / to trace with, if not the repeated blocks.
    trace_steps, trace_warmup: the tracer's timed and warm-up steps when tracing in the run (its defaults).
    ledger, pool: passed to `apply_schedule` (a SavedLedger counting live saved bytes; a host buffer pool).

    After train begin, `schedule` (and `trace`, when one was given or traced) hold the plan; `scheduled` is the
    runtime's handle while the plan is applied (None outside training). If `train()` raises, the plan stays
    applied until the next `train()` or `remove()`: the Trainer has no event for it.
    """

    def __init__(
        self,
        schedule: ScheduleArg | None = None,
        *,
        trace: TraceArg | None = None,
        budget: str | int | None = None,
        options: SolveOptions | None = None,
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

    def on_train_begin(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        model: nn.Module | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        train_dataloader: Any = None,
        **kwargs: Any,
    ) -> None:
        assert model is not None, "the Trainer passes its model to every callback event"
        self._plan.apply(model, lambda: _run_step(model, optimizer, train_dataloader, args))

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self._plan.remove()


def _run_step(
    model: nn.Module, optimizer: torch.optim.Optimizer | None, dataloader: Any, args: TrainingArguments
) -> RunStep:
    """The Trainer's training step as the tracer runs it: its first batch on the model's device, the model's own
    loss (under the Trainer's autocast for bf16 / fp16), backward, the optimizer's step."""
    if optimizer is None or dataloader is None:
        raise MemschedError(
            f"{_OWNER}: the Trainer gave no optimizer or training DataLoader at train begin, so the run cannot be "
            "traced; trace yourself (memsched.runtime.trace) and give trace= or schedule="
        )
    # accelerate's AcceleratedOptimizer skips steps outside its accumulation bookkeeping: step the torch one.
    opt: torch.optim.Optimizer = getattr(optimizer, "optimizer", optimizer)
    p = next(model.parameters(), None)
    device = p.device if p is not None else torch.device("cpu")
    batch = send_to_device(first_batch(dataloader, _OWNER), device)
    if not isinstance(batch, Mapping):
        raise MemschedError(
            f"{_OWNER}: the Trainer's batches are {type(batch).__name__}, not a mapping of model inputs; trace "
            "yourself (memsched.runtime.trace) and give trace= or schedule="
        )
    dtype = torch.bfloat16 if args.bf16 else torch.float16 if args.fp16 else None

    def step() -> None:
        model.train()
        autocast = torch.autocast(device.type, dtype=dtype) if dtype is not None else contextlib.nullcontext()
        with autocast:
            out = model(**batch)
        loss = out.get("loss") if isinstance(out, Mapping) else out[0]
        if not isinstance(loss, torch.Tensor):
            raise MemschedError(
                f"{_OWNER}: the model returned no loss for the first batch (no labels?), so the run cannot be "
                "traced with model(**batch).loss; trace yourself and give trace= or schedule="
            )
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    size, seq = batch_shape(batch)
    config = getattr(model, "config", None)
    model_id = getattr(config, "name_or_path", "") or getattr(config, "model_type", "") or type(model).__name__
    return RunStep(step, [opt], size, seq, str(model_id))
