"""Measure a scheduled (or plain) training step: whole-step peak memory and step time, against the prediction.

The peak is every live tensor byte of the step (memsched.runtime.memory): CUDA's max_memory_allocated on a
GPU, the CPU allocator's events under the profiler on the CPU; one function, two sources. Step times are the
median of the timed steps (run without the profiler). The saved-tensor ledger (memsched.runtime.ledger) is
kept beside it for attribution: the live saved bytes of the traced layers, per stage. Its counterpart in the
cost model is the saved part of the simulator's stage memory (memsched.optimizer.profile).
"""

from __future__ import annotations

import logging
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from memsched.errors import MemschedError
from memsched.runtime.clock import cpu_clock_name, time_steps
from memsched.runtime.layers import find_layers
from memsched.runtime.ledger import SavedLedger
from memsched.runtime.memory import MemoryMeter, StepMemory
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
    """Measured whole-step peak: every live device tensor byte (see `peak_source`)."""
    peak_source: str
    """'cuda-allocator' or 'cpu-all-tensors' (memsched.runtime.memory)."""
    host_bytes: int
    """Host copies made by offloading (the buffer pool's resident bytes): not device bytes, not in the peak."""
    saved_peak_bytes: int
    """The ledger's peak of live saved bytes of the traced layers (attribution, not the peak)."""
    stage_saved_peak_bytes: dict[str, int]
    """The ledger's peak per stage ('F3', 'B3')."""
    stage_peak_bytes: dict[str, int]
    """The whole-step peak per stage ('pre', 'F3', 'B3', 'optimizer')."""
    static_bytes: int
    """Static bytes (from the trace when given, else counted on the model)."""
    predicted_peak_bytes: int | None
    """The schedule's predicted whole peak (static + activations + copies + workspace)."""
    predicted_step_s: float | None
    """The schedule's predicted step time."""
    predicted_saved_peak_bytes: int | None
    """The simulator's peak of the saved part (what the ledger measures), when the caller computed it."""
    budget_bytes: int | None
    """The schedule's budget."""
    pool: PoolStats | None
    """Host buffer pool counters after the measured steps."""
    step_times_s: list[float] = field(default_factory=list)
    """Every timed step, in order (the median is `step_s`)."""
    threads: int = 1
    """torch's intra-op thread count during the measurement."""
    clock: str = "wall time"
    """What the step times are: 'wall time' (CUDA, or several CPU threads) or 'process CPU time'."""

    def rows(self) -> list[tuple[str, str, str]]:
        """(quantity, predicted, measured) rows for a table."""

        def b(x: int | None) -> str:
            return "-" if x is None else format_bytes(x)

        return [
            (
                "step time",
                "-" if self.predicted_step_s is None else format_seconds(self.predicted_step_s),
                format_seconds(self.step_s),
            ),
            (f"peak, whole step ({self.peak_source})", b(self.predicted_peak_bytes), b(self.peak_bytes)),
            ("saved activations (ledger)", b(self.predicted_saved_peak_bytes), b(self.saved_peak_bytes)),
            ("host copies (not device bytes)", "", b(self.host_bytes)),
            ("budget", b(self.budget_bytes), ""),
        ]

    def summary(self) -> str:
        return "\n".join(f"{q:<40} predicted {p:>12}   measured {m:>12}" for q, p, m in self.rows())

    def to_json(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "step_s": self.step_s,
            "step_times_s": self.step_times_s,
            "threads": self.threads,
            "clock": self.clock,
            "peak_bytes": self.peak_bytes,
            "peak_source": self.peak_source,
            "host_bytes": self.host_bytes,
            "saved_peak_bytes": self.saved_peak_bytes,
            "stage_saved_peak_bytes": self.stage_saved_peak_bytes,
            "stage_peak_bytes": self.stage_peak_bytes,
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


def _mark_optimizer_step(optimizer: torch.optim.Optimizer | None, meter: MemoryMeter) -> Callable[[], None]:
    """Open the 'optimizer' stage when the optimizer steps; returns the hook's remover."""
    if optimizer is None:
        return lambda: None
    handle = optimizer.register_step_pre_hook(lambda *_a: meter.mark("optimizer"))
    return handle.remove


def measure(
    model: nn.Module,
    step_fn: Callable[[Callable[..., Any]], Any],
    schedule: Schedule | None = None,
    *,
    trace: Trace | None = None,
    layers: Sequence[str] | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    steps: int = 5,
    warmup: int = 2,
    predicted_saved_peak_bytes: int | None = None,
) -> Measurement:
    """Run `step_fn(scheduled_model)` under the schedule (keep-all if None): `warmup` steps, `steps` timed
    steps (median), then one memory step (after a priming step on the CPU, see memsched.runtime.memory).

    step_fn receives the callable to run the forward with (the ScheduledModel) and does one whole step.
    The comparison is logged (INFO) and returned; `Measurement.summary()` formats it.
    """
    if steps < 1 or warmup < 0:
        raise MemschedError(f"steps must be >= 1 and warmup >= 0 (got steps={steps}, warmup={warmup})")
    p0 = next(model.parameters(), None)
    device = p0.device if p0 is not None else torch.device("cpu")
    predicted = schedule is not None
    if schedule is None:
        schedule = keep_all_schedule([n for n, _ in find_layers(model, layers)])
    ledger = SavedLedger()
    with ScheduledModel(model, schedule, trace=trace, layers=layers, ledger=ledger) as sm:
        for _ in range(warmup):
            step_fn(sm)
        times = time_steps(lambda: step_fn(sm), device, steps)
        meter = MemoryMeter(device, host_tensors=sm.pool.buffers)
        ledger.on_mark = meter.mark
        remove_hook = _mark_optimizer_step(optimizer, meter)
        try:
            ledger.reset()
            mem: StepMemory = meter.measure(lambda: step_fn(sm))
        finally:
            remove_hook()
            ledger.on_mark = None
        pool = sm.pool_stats()
    st = ledger.stats()
    m = Measurement(
        device=device.type,
        step_s=statistics.median(times),
        peak_bytes=mem.peak_bytes,
        peak_source=mem.source,
        host_bytes=mem.host_bytes,
        saved_peak_bytes=st.peak_bytes,
        stage_saved_peak_bytes=st.stage_peak_bytes,
        stage_peak_bytes=mem.stage_peak_bytes,
        static_bytes=trace.static.total if trace is not None else static_bytes(model, optimizer).total,
        predicted_peak_bytes=schedule.prediction.peak_bytes if predicted else None,
        predicted_step_s=schedule.prediction.step_s if predicted else None,
        predicted_saved_peak_bytes=predicted_saved_peak_bytes,
        budget_bytes=schedule.budget_bytes if predicted else None,
        pool=pool,
        step_times_s=times,
        threads=torch.get_num_threads(),
        clock="wall time" if device.type == "cuda" else cpu_clock_name(),
    )
    log.info("%s %s:\n%s", schedule.policy, "schedule" if predicted else "(unscheduled)", m.summary())
    return m
