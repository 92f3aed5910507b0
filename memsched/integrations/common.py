"""What the stack integrations share (memsched.integrations.hf, .lightning): which plan to apply, and the
schedule applied between the stack's train-begin and train-end events.

A plan comes from one of three sources: a solved schedule; a trace, solved here under a budget (the service's
`solve_trace`, the function behind `memsched solve`); or the run itself, traced for a few steps on the stack's
own model, optimizer and first batch (the runtime's tracer), then solved. The tracer runs real optimizer
steps, so the training state they touch (parameters, buffers, gradients, optimizer state, RNG states,
train/eval modes) is copied to the host before and put back after: the run then trains from exactly the state
it had, and its losses are those of a run without memsched, up to what the schedule itself changes (nothing,
on the CPU: docs/integrations.md).

The runtime (`apply_schedule`) carries the plan out; nothing here replays anything.
"""

from __future__ import annotations

import contextlib
import logging
import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any, TypedDict

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, IterableDataset

from memsched.errors import MemschedError
from memsched.io import load_schedule, load_trace
from memsched.options import SolveOptions
from memsched.runtime import HostBufferPool, SavedLedger, ScheduledModel, apply_schedule
from memsched.runtime import trace as run_tracer
from memsched.runtime.checkpointing import flatten
from memsched.schema import Schedule, Trace
from memsched.service import solve_trace
from memsched.units import format_bytes, parse_budget

log = logging.getLogger(__name__)

ScheduleArg = Schedule | str | Path
"""A solved schedule, or the path of its JSON file."""
TraceArg = Trace | str | Path
"""A trace, or the path of its JSON file."""


@dataclass(frozen=True)
class RunStep:
    """What tracing inside a run needs from the stack: one whole training step on its first batch."""

    step: Callable[[], Any]
    """Runs one training step: forward, loss, backward, optimizer step, gradients zeroed."""
    optimizers: list[torch.optim.Optimizer]
    """The optimizers `step` steps: their state is counted as static memory and put back after tracing."""
    batch_size: int
    """The batch's leading dimension (the trace's batch_size)."""
    seq_len: int | None
    """The sequence length of a token batch, else None."""
    model_id: str
    """The trace's model id."""
    owner_module: nn.Module | None = None
    """The module whose state the step changes, when it holds more than the traced model (a LightningModule
    around the submodule a plan is for): its state is the one put back after tracing."""


class TraceCounts(TypedDict, total=False):
    """The tracer's step counts that a TraceSettings sets (the others keep the tracer's defaults)."""

    steps: int
    warmup: int


@dataclass(frozen=True)
class TraceSettings:
    """How many steps the tracer runs when the plan is traced inside the run (None: the tracer's defaults)."""

    steps: int | None = None
    """Timed steps (the tracer's `steps`; it runs warmup + 2 x steps + 4 steps in all)."""
    warmup: int | None = None
    """Untimed steps first (the tracer's `warmup`)."""

    def kwargs(self) -> TraceCounts:
        out: TraceCounts = {}
        if self.steps is not None:
            out["steps"] = self.steps
        if self.warmup is not None:
            out["warmup"] = self.warmup
        return out


class PlanHolder:
    """The plan of one callback (given, solved from a trace, or traced in the run and solved: once, then kept
    for the next `apply`) and the schedule it has applied, if any."""

    def __init__(
        self,
        owner: str,
        *,
        schedule: ScheduleArg | None,
        trace: TraceArg | None,
        budget: str | int | None,
        options: SolveOptions | None,
        layers: Sequence[str] | None,
        tracing: TraceSettings,
        ledger: SavedLedger | None,
        pool: HostBufferPool | None,
    ) -> None:
        if schedule is not None and trace is not None:
            raise MemschedError(
                f"{owner}: give schedule= (a solved plan) or trace= (solved here under budget=), not both; a "
                "schedule already names the trace it was solved for"
            )
        if schedule is not None and (budget is not None or options is not None):
            given = "budget=" if budget is not None else "options="
            raise MemschedError(
                f"{owner}: {given} is for solving, but schedule= is already solved (under its own budget); drop "
                f"{given} or give trace= instead of schedule="
            )
        if schedule is None and budget is None:
            raise MemschedError(
                f"{owner}: budget= is needed to solve the plan (e.g. budget='8GiB' or '50%'); or give a solved "
                "schedule="
            )
        if budget is not None:
            parse_budget(budget)  # a budget that cannot be read fails here, not after the first steps were traced
        for name, v in (("trace_steps", tracing.steps), ("trace_warmup", tracing.warmup)):
            if v is not None and v < (1 if name == "trace_steps" else 0):
                raise MemschedError(f"{owner}: {name} must be >= {1 if name == 'trace_steps' else 0}, got {v}")
        self.owner = owner
        self.schedule: Schedule | None = load_schedule(schedule) if isinstance(schedule, str | Path) else schedule
        """The plan: given, or once solved."""
        self.trace: Trace | None = load_trace(trace) if isinstance(trace, str | Path) else trace
        """The trace the plan was solved from (given, or traced in the run), if any."""
        self.budget = budget
        self.options = options
        self.layers = list(layers) if layers is not None else None
        self.tracing = tracing
        self.ledger = ledger
        self.pool = pool
        self.applied: ScheduledModel | None = None
        """The runtime's handle on the applied schedule, between apply() and remove()."""

    @property
    def needs_run(self) -> bool:
        """Whether the plan still has to be traced in the run (no schedule, no trace given)."""
        return self.schedule is None and self.trace is None

    def apply(self, model: nn.Module, run: Callable[[], RunStep] | None = None) -> ScheduledModel:
        """Apply the plan to `model` (making it first if needed: `run` gives the stack's training step)."""
        self.remove()  # a second train() on the same callback: the plan is applied afresh
        if self.schedule is None:
            if self.trace is None:
                assert run is not None, "the stack's callback passes its step when the plan is traced in the run"
                self.trace = trace_in_run(model, run(), self.layers, self.tracing)
            assert self.budget is not None  # checked in __init__
            self.schedule = solve_trace(self.trace, self.budget, self.options)
            _log_plan(self.owner, self.schedule)
        self.applied = apply_schedule(
            model, self.schedule, trace=self.trace, layers=self.layers, ledger=self.ledger, pool=self.pool
        )
        return self.applied

    def remove(self) -> None:
        """Take the applied schedule off the model (a no-op when none is applied)."""
        applied, self.applied = self.applied, None
        if applied is not None:
            applied.remove()


def _log_plan(owner: str, schedule: Schedule) -> None:
    counts = schedule.action_counts()
    p = schedule.prediction
    log.info(
        "%s: solved %s under %s: %s; predicted peak %s, step %+.1f%% (%s)",
        owner,
        schedule.policy,
        format_bytes(schedule.budget_bytes),
        ", ".join(f"{n} {a}" for a, n in counts.items()),
        format_bytes(p.peak_bytes),
        p.overhead_pct,
        schedule.solver.status.value,
    )


def trace_in_run(model: nn.Module, run: RunStep, layers: Sequence[str] | None, tracing: TraceSettings) -> Trace:
    """Trace `run.step` on `model` (the runtime's tracer), then put the training state back as it was."""
    with training_state_kept(run.owner_module or model, run.optimizers):
        return run_tracer(
            model,
            run.step,
            layers=layers,
            model_id=run.model_id,
            batch_size=run.batch_size,
            seq_len=run.seq_len,
            optimizer=run.optimizers[0] if run.optimizers else None,
            **tracing.kwargs(),
        )


def _to_host(obj: Any) -> Any:
    """A copy of `obj` with every tensor in it copied to the host (an optimizer's state_dict holds its live
    state tensors, which the tracer's steps change in place)."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: _to_host(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(_to_host(v) for v in obj)
    return obj


@contextlib.contextmanager
def training_state_kept(model: nn.Module, optimizers: Sequence[torch.optim.Optimizer]) -> Iterator[None]:
    """Put back, on exit, what training steps inside the block change: parameter and buffer values, gradients,
    the optimizers' state, the RNG states (Python, NumPy, torch CPU and CUDA) and each module's train/eval mode.
    Copies are kept on the host, so the device holds no second model while the tracer measures it."""
    tensors: list[torch.Tensor] = []
    seen: set[int] = set()
    for t in [*model.parameters(), *model.buffers()]:
        if id(t) not in seen:
            seen.add(id(t))
            tensors.append(t)
    values = [t.detach().to("cpu", copy=True) for t in tensors]
    params = [p for p in tensors if isinstance(p, nn.Parameter)]
    grads = [None if p.grad is None else p.grad.detach().to("cpu", copy=True) for p in params]
    states = [_to_host(o.state_dict()) for o in optimizers]
    modes = [(m, m.training) for m in model.modules()]
    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    rng = (random.getstate(), np.random.get_state(), torch.get_rng_state())
    cuda_rng = torch.cuda.get_rng_state_all() if cuda else None
    try:
        yield
    finally:
        with torch.no_grad():
            for t, v in zip(tensors, values, strict=True):
                t.copy_(v)
            for p, g in zip(params, grads, strict=True):
                if g is None:
                    p.grad = None
                elif p.grad is not None and p.grad.shape == g.shape:
                    p.grad.copy_(g)  # in place: a DDP bucket view stays the bucket's
                else:
                    p.grad = g.to(p.device)
        for o, st in zip(optimizers, states, strict=True):
            o.load_state_dict(st)
        for m, mode in modes:
            m.training = mode
        random.setstate(rng[0])
        np.random.set_state(rng[1])
        torch.set_rng_state(rng[2])
        if cuda_rng is not None:
            torch.cuda.set_rng_state_all(cuda_rng)


def first_batch(dataloader: Any, owner: str) -> Any:
    """The first batch-size samples of the loader's dataset, collated by its collate_fn: taken by index (from
    a fresh iterator for an iterable dataset), so that neither the loader's iterator state nor its sampler's
    random stream moves and the run's first epoch sees the batches it would have seen."""
    base = getattr(dataloader, "base_dataloader", dataloader)  # accelerate's DataLoaderShard wraps one
    if not isinstance(base, DataLoader):
        raise MemschedError(
            f"{owner}: tracing in the run needs the training data as one torch DataLoader, got "
            f"{type(dataloader).__name__}; trace yourself (memsched.runtime.trace) and give trace= or schedule="
        )
    size = base.batch_size or getattr(base.batch_sampler, "batch_size", None)
    if not size:
        raise MemschedError(
            f"{owner}: the training DataLoader has no batch_size (a custom batch_sampler); trace yourself "
            "(memsched.runtime.trace) and give trace= or schedule="
        )
    data = base.dataset
    if isinstance(data, IterableDataset):
        samples = list(islice(iter(data), size))
    else:
        samples = [data[i] for i in range(min(size, len(data)))]  # type: ignore[arg-type]
    if not samples:
        raise MemschedError(f"{owner}: the training dataset is empty; nothing to trace")
    assert base.collate_fn is not None  # DataLoader sets the default one
    return base.collate_fn(samples)


def batch_shape(batch: Any) -> tuple[int, int | None]:
    """(batch size, sequence length) of a batch: the leading dimension of its first tensor, and the second
    dimension of `input_ids` where it has one (a token batch)."""
    ids = batch.get("input_ids") if isinstance(batch, Mapping) else None
    if isinstance(ids, torch.Tensor) and ids.dim() >= 2:
        return int(ids.shape[0]), int(ids.shape[1])
    for _, t in flatten(batch if not isinstance(batch, Mapping) else dict(batch)):
        if t.dim() >= 1:
            return int(t.shape[0]), None
    return 1, None


class PlanAccess:
    """What both callbacks show of their plan (a mixin over the stack's own callback class): `_plan` is the
    callback's PlanHolder."""

    _plan: PlanHolder

    @property
    def schedule(self) -> Schedule | None:
        """The plan (given, or solved when training first starts)."""
        return self._plan.schedule

    @property
    def trace(self) -> Trace | None:
        """The trace the plan was solved from, if any."""
        return self._plan.trace

    @property
    def scheduled(self) -> ScheduledModel | None:
        """The runtime's handle on the applied schedule while training; None outside."""
        return self._plan.applied

    def remove(self) -> None:
        """Take the schedule off the model now (training's end does it; this is for a run that raised)."""
        self._plan.remove()
