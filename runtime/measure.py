"""Measure a scheduled (or plain) training step: peak memory and step time, against the prediction.

On CUDA the peak is the allocator's max_memory_allocated over the measured steps. On the CPU there is no
device allocator to ask, so the measurement is the saved-tensor ledger (memsched.runtime.ledger): the peak of
live bytes of tensors saved by the traced layers' forwards, attributed and deduplicated like the tracer does.
Its counterpart in the cost model is the saved part of the simulator's stage memory (saved bytes plus
checkpoint inputs, without the static bytes and the per-stage transients).
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from memsched.errors import MemschedError
from memsched.runtime.clock import sync
from memsched.runtime.layers import find_layers
from memsched.runtime.ledger import SavedLedger
from memsched.runtime.pool import PoolStats
from memsched.runtime.replay import ScheduledModel
from memsched.runtime.tracer import static_bytes
from memsched.schema import Action, LayerAction, Prediction, Schedule, SolverRecord, SolverStatus, Trace
from memsched.units import format_bytes, format_seconds

log = logging.getLogger(__name__)


@dataclass
class Measurement:
    """Measured against predicted, for one schedule on one model."""

    device: str
    """'cuda' or 'cpu'."""
    step_s: float
    """Median measured step time."""
    peak_bytes: int
    """Measured peak: CUDA max_memory_allocated; CPU static bytes + the ledger's saved-bytes peak."""
    saved_peak_bytes: int | None
    """CPU: the ledger's peak of live saved bytes (traced layers only); None on CUDA."""
    stage_saved_peak_bytes: dict[str, int]
    """CPU: the ledger's peak per stage ('F3', 'B3'); empty on CUDA."""
    static_bytes: int
    """Static bytes used for the CPU peak (from the trace when given, else counted on the model)."""
    predicted_peak_bytes: int | None
    """The schedule's predicted whole peak (static + activations + copies + workspace)."""
    predicted_step_s: float | None
    """The schedule's predicted step time."""
    predicted_saved_peak_bytes: int | None
    """The simulator's peak of the saved part (what the CPU ledger measures), when the caller computed it."""
    budget_bytes: int | None
    """The schedule's budget."""
    pool: PoolStats | None
    """Host buffer pool counters after the measured steps."""

    def rows(self) -> list[tuple[str, str, str]]:
        """(quantity, predicted, measured) rows for a table."""

        def b(x: int | None) -> str:
            return "-" if x is None else format_bytes(x)

        rows = [
            (
                "step time",
                "-" if self.predicted_step_s is None else format_seconds(self.predicted_step_s),
                format_seconds(self.step_s),
            ),
        ]
        if self.device == "cuda":
            rows.append(("peak (allocator)", b(self.predicted_peak_bytes), b(self.peak_bytes)))
        else:
            rows.append(
                ("saved-activation peak (ledger)", b(self.predicted_saved_peak_bytes), b(self.saved_peak_bytes))
            )
            rows.append(("peak (static + ledger)", b(self.predicted_peak_bytes), b(self.peak_bytes)))
        if self.budget_bytes is not None:
            rows.append(("budget", b(self.budget_bytes), ""))
        return rows

    def summary(self) -> str:
        return "\n".join(f"{q:<32} predicted {p:>12}   measured {m:>12}" for q, p, m in self.rows())

    def to_json(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "step_s": self.step_s,
            "peak_bytes": self.peak_bytes,
            "saved_peak_bytes": self.saved_peak_bytes,
            "stage_saved_peak_bytes": self.stage_saved_peak_bytes,
            "static_bytes": self.static_bytes,
            "predicted_peak_bytes": self.predicted_peak_bytes,
            "predicted_step_s": self.predicted_step_s,
            "predicted_saved_peak_bytes": self.predicted_saved_peak_bytes,
            "budget_bytes": self.budget_bytes,
            "pool": None if self.pool is None else self.pool.__dict__,
        }


def keep_all_schedule(names: Sequence[str], budget_bytes: int = 1) -> Schedule:
    """A schedule that keeps everything (the unscheduled step, measured through the same hooks)."""
    zero = Prediction(peak_bytes=0, step_s=0, keepall_step_s=0, overhead_s=0, overhead_pct=0, stall_s=0, recompute_s=0)
    return Schedule(
        trace_hash="unscheduled",
        layer_names=list(names),
        budget_bytes=budget_bytes,
        policy="keep-all",
        actions=[LayerAction(layer=n, action=Action.KEEP) for n in names],
        prediction=zero,
        solver=SolverRecord(backend="none", status=SolverStatus.HEURISTIC),
    )


def measure(
    model: nn.Module,
    step_fn: Callable[[Callable[..., Any]], Any],
    schedule: Schedule | None = None,
    *,
    trace: Trace | None = None,
    layers: Sequence[str] | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    steps: int = 3,
    warmup: int = 1,
    predicted_saved_peak_bytes: int | None = None,
) -> Measurement:
    """Run `step_fn(scheduled_model)` warmup + steps times under the schedule (keep-all if None) and measure.

    step_fn receives the callable to run the forward with (the ScheduledModel) and does one whole step.
    The comparison is logged (INFO) and returned; `Measurement.summary()` formats it.
    """
    if steps < 1 or warmup < 0:
        raise MemschedError(f"steps must be >= 1 and warmup >= 0 (got steps={steps}, warmup={warmup})")
    p0 = next(model.parameters(), None)
    device = p0.device if p0 is not None else torch.device("cpu")
    cuda = device.type == "cuda"
    if schedule is None:
        schedule = keep_all_schedule([n for n, _ in find_layers(model, layers)])
        predicted = False
    else:
        predicted = True
    ledger = None if cuda else SavedLedger()
    with ScheduledModel(model, schedule, trace=trace, layers=layers, ledger=ledger) as sm:
        for _ in range(warmup):
            step_fn(sm)
        if cuda:
            sync(device)
            torch.cuda.reset_peak_memory_stats(device)
        if ledger is not None:
            ledger.reset()
        times = []
        for _ in range(steps):
            sync(device)
            t0 = time.perf_counter()
            step_fn(sm)
            sync(device)
            times.append(time.perf_counter() - t0)
        pool = sm.pool_stats()
    static = trace.static.total if trace is not None else static_bytes(model, optimizer).total
    if ledger is not None:
        st = ledger.stats()
        saved_peak: int | None = st.peak_bytes
        stages = st.stage_peak_bytes
        peak = static + st.peak_bytes
    else:
        saved_peak, stages = None, {}
        peak = int(torch.cuda.max_memory_allocated(device))
    m = Measurement(
        device=device.type,
        step_s=statistics.median(times),
        peak_bytes=peak,
        saved_peak_bytes=saved_peak,
        stage_saved_peak_bytes=stages,
        static_bytes=static,
        predicted_peak_bytes=schedule.prediction.peak_bytes if predicted else None,
        predicted_step_s=schedule.prediction.step_s if predicted else None,
        predicted_saved_peak_bytes=predicted_saved_peak_bytes,
        budget_bytes=schedule.budget_bytes if predicted else None,
        pool=pool,
    )
    log.info("%s %s:\n%s", schedule.policy, "schedule" if predicted else "(unscheduled)", m.summary())
    return m
