"""Measure a scheduled (or plain) training step: whole-step peak memory and step time, against the prediction.

The peak is every live tensor byte of the step (memsched.runtime.memory): CUDA's max_memory_allocated on a
GPU, the CPU allocator's events under the profiler on the CPU; one function, two sources. Step times are the
median of the timed steps (run without the profiler). The saved-tensor ledger (memsched.runtime.ledger) is
kept beside it for attribution: the live saved bytes of the traced layers, per stage. Its counterpart in the
cost model is the saved part of the simulator's stage memory (memsched.optimizer.saved_profile).

`measure_side_by_side` is the one measurement every front end uses (`memsched measure`, `memsched demo`,
bench/fidelity.py through memsched.service.measure): keep-all and the schedule in one process, their timed
steps interleaved, because on a shared machine the speed changes from minute to minute (by 10-20% on the
2-core machine of bench/results/fidelity.md) and only steps taken side by side give a slowdown that means
something. On the CPU it keeps freed memory in the process first (memsched.runtime.hostalloc): otherwise page
faults that depend on where blocks land, not on the schedule's work, change the step time.
"""

from __future__ import annotations

import logging
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from memsched.errors import MemschedError
from memsched.runtime.clock import cpu_clock_name, time_steps
from memsched.runtime.hostalloc import steady_host_allocator
from memsched.runtime.layers import find_layers
from memsched.runtime.ledger import SavedLedger
from memsched.runtime.memory import MemoryMeter, StepMemory, peak_source
from memsched.runtime.pool import HostBufferPool, PoolStats
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
    """A schedule that keeps everything (the unscheduled step, run under the replay, its layers bare)."""
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


KEEP_ALL = "keep-all"
SCHEDULED = "scheduled"


@dataclass
class SideBySide:
    """Keep-all and the schedule measured in one process, their timed steps interleaved (ABAB...)."""

    keep_all: Measurement | None
    """The in-core step under the replay (a keep-all schedule: its layers bare), or None when not measured."""
    scheduled: Measurement | None
    """The scheduled step, or None when only keep-all was measured."""
    order: list[str] = field(default_factory=list)
    """The side of every timed step, in the order they ran ('keep-all' / 'scheduled')."""

    @property
    def ratio(self) -> float | None:
        """Median scheduled step / median keep-all step (the measured slowdown, side by side)."""
        if self.keep_all is None or self.scheduled is None:
            return None
        return self.scheduled.step_s / self.keep_all.step_s

    @property
    def paired_ratio(self) -> float | None:
        """Median over rounds of (scheduled step / the keep-all step just before it): drift on a shared machine
        over the run cancels within each pair."""
        if self.keep_all is None or self.scheduled is None:
            return None
        pairs = zip(self.keep_all.step_times_s, self.scheduled.step_times_s, strict=False)
        return statistics.median(s / k for k, s in pairs)


def measure_side_by_side(
    model: nn.Module,
    step_fn: Callable[[Callable[..., Any]], Any],
    schedule: Schedule | None = None,
    *,
    baseline: bool = True,
    trace: Trace | None = None,
    layers: Sequence[str] | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    steps: int = 5,
    warmup: int = 2,
    predicted_saved_peak_bytes: int | None = None,
    keep_all_predicted_saved_peak_bytes: int | None = None,
    keep_all_memory: bool = True,
) -> SideBySide:
    """Measure keep-all (when `baseline`) and `schedule` (when given) on one model in one process.

    Step times: `warmup` rounds, then `steps` rounds, each round one keep-all step then one scheduled step
    (the schedule is applied and removed around each of its steps; its host buffer pool is kept), so both
    sides see the same machine at the same minutes and the slowdown is a ratio measured side by side; each
    side's step time is the median of its `steps` steps. Then one memory step per side (after a priming step
    on the CPU, see memsched.runtime.memory); `keep_all_memory` False skips keep-all's (its peak is then 0 and
    its ledger empty: for a caller that already measured it).

    step_fn receives the callable to run the forward with (the ScheduledModel) and does one whole step.
    """
    if steps < 1 or warmup < 0:
        raise MemschedError(f"steps must be >= 1 and warmup >= 0 (got steps={steps}, warmup={warmup})")
    if schedule is None and not baseline:
        raise MemschedError("nothing to measure: give a schedule, or measure the keep-all baseline")
    # The schedules are applied around every step, and each application would repeat the replay's warnings.
    once = _OncePerMessage()
    replay_log = logging.getLogger(ScheduledModel.__module__)
    replay_log.addFilter(once)
    try:
        return _measure_side_by_side(
            model,
            step_fn,
            schedule,
            baseline,
            trace,
            layers,
            optimizer,
            steps,
            warmup,
            predicted_saved_peak_bytes,
            keep_all_predicted_saved_peak_bytes,
            keep_all_memory,
        )
    finally:
        replay_log.removeFilter(once)


class _OncePerMessage(logging.Filter):
    """Passes each distinct message once: one measurement says each of the replay's warnings once."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        if msg in self.seen:
            return False
        self.seen.add(msg)
        return True


def _measure_side_by_side(
    model: nn.Module,
    step_fn: Callable[[Callable[..., Any]], Any],
    schedule: Schedule | None,
    baseline: bool,
    trace: Trace | None,
    layers: Sequence[str] | None,
    optimizer: torch.optim.Optimizer | None,
    steps: int,
    warmup: int,
    predicted_saved_peak_bytes: int | None,
    keep_all_predicted_saved_peak_bytes: int | None,
    keep_all_memory: bool,
) -> SideBySide:
    p0 = next(model.parameters(), None)
    device = p0.device if p0 is not None else torch.device("cpu")
    if device.type == "cpu":
        steady_host_allocator()  # page faults would depend on the schedule (memsched.runtime.hostalloc)
    sides: dict[str, Schedule] = {}
    if baseline:
        sides[KEEP_ALL] = keep_all_schedule([n for n, _ in find_layers(model, layers)])
    if schedule is not None:
        sides[SCHEDULED] = schedule
    ledgers = {k: SavedLedger() for k in sides}
    pools = {k: HostBufferPool(pin_memory=device.type == "cuda") for k in sides}

    def applied(side: str, ledger: SavedLedger | None = None) -> ScheduledModel:
        tr = trace if side == SCHEDULED else None
        return ScheduledModel(model, sides[side], trace=tr, layers=layers, ledger=ledger, pool=pools[side])

    # Timed steps run without the ledger: its per-tensor bookkeeping (a weakref finalizer per saved storage)
    # is the measurement's, not the user's training loop's, and it would inflate both sides.
    for _ in range(warmup):
        for side in sides:
            with applied(side) as sm:
                step_fn(sm)
    times: dict[str, list[float]] = {k: [] for k in sides}
    order: list[str] = []
    for _ in range(steps):
        for side in sides:
            with applied(side) as sm:
                times[side].append(_time_step(step_fn, sm, device))
            order.append(side)
    out: dict[str, Measurement] = {}
    for side, sched in sides.items():
        ledger = ledgers[side]
        with applied(side, ledger) as sm:
            if side == KEEP_ALL and not keep_all_memory:
                mem = StepMemory(source=peak_source(device), peak_bytes=0, start_bytes=0, end_bytes=0)
                ledger.reset()
            else:
                mem = _memory_step(sm, step_fn, ledger, optimizer, device, pools.values())
        predicted = side == SCHEDULED
        st = ledger.stats()
        out[side] = Measurement(
            device=device.type,
            step_s=statistics.median(times[side]),
            peak_bytes=mem.peak_bytes,
            peak_source=mem.source,
            host_bytes=mem.host_bytes,
            saved_peak_bytes=st.peak_bytes,
            stage_saved_peak_bytes=st.stage_peak_bytes,
            stage_peak_bytes=mem.stage_peak_bytes,
            static_bytes=trace.static.total if trace is not None else static_bytes(model, optimizer).total,
            predicted_peak_bytes=sched.prediction.peak_bytes if predicted else None,
            predicted_step_s=sched.prediction.step_s if predicted else None,
            predicted_saved_peak_bytes=(
                predicted_saved_peak_bytes if predicted else keep_all_predicted_saved_peak_bytes
            ),
            budget_bytes=sched.budget_bytes if predicted else None,
            pool=pools[side].stats(),
            step_times_s=times[side],
            threads=torch.get_num_threads(),
            clock="wall time" if device.type == "cuda" else cpu_clock_name(),
        )
        log.info("%s:\n%s", side if side == KEEP_ALL else sched.policy, out[side].summary())
    return SideBySide(keep_all=out.get(KEEP_ALL), scheduled=out.get(SCHEDULED), order=order)


def _time_step(step_fn: Callable[[Callable[..., Any]], Any], sm: ScheduledModel, device: torch.device) -> float:
    """Seconds of one step under the applied schedule, between device synchronisations."""
    return time_steps(lambda: step_fn(sm), device, 1)[0]


def _memory_step(
    sm: ScheduledModel,
    step_fn: Callable[[Callable[..., Any]], Any],
    ledger: SavedLedger,
    optimizer: torch.optim.Optimizer | None,
    device: torch.device,
    pools: Iterable[HostBufferPool],
) -> StepMemory:
    """One whole-step memory measurement under the applied schedule, with the ledger's stage marks.

    The host buffers of every pool of the run are host copies, never device bytes: the other side's pool is
    still alive (kept for its next step), and on the CPU its blocks would otherwise read as live tensors.
    The host bytes reported are this side's own pool's."""
    everyone = list(pools)
    meter = MemoryMeter(device, host_tensors=lambda: [b for p in everyone for b in p.buffers()])
    ledger.on_mark = meter.mark
    remove_hook = _mark_optimizer_step(optimizer, meter)
    try:
        ledger.reset()
        mem = meter.measure(lambda: step_fn(sm))
    finally:
        remove_hook()
        ledger.on_mark = None
    mem.host_bytes = sum(int(b.untyped_storage().nbytes()) for b in sm.pool.buffers())
    return mem


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
    """One side of `measure_side_by_side`: the schedule alone, or keep-all when `schedule` is None.

    The comparison is logged (INFO) and returned; `Measurement.summary()` formats it."""
    both = measure_side_by_side(
        model,
        step_fn,
        schedule,
        baseline=schedule is None,
        trace=trace,
        layers=layers,
        optimizer=optimizer,
        steps=steps,
        warmup=warmup,
        predicted_saved_peak_bytes=predicted_saved_peak_bytes,
        keep_all_predicted_saved_peak_bytes=predicted_saved_peak_bytes,
    )
    m = both.scheduled if schedule is not None else both.keep_all
    assert m is not None
    return m
