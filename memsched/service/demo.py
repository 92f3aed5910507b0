"""`memsched demo`: the three steps end to end on a small real model, on the CPU, in about a minute.

1. trace a small GPT-2 (transformers, built from its config: nothing is downloaded) for a few steps;
2. solve for a budget of about half its activation memory (memsched.service, the same call as the CLI/API);
3. replay training steps under the schedule with `memsched measure`'s code (memsched.service.measure) and print
   predicted against measured whole-step peak and step time, and write the simulated timeline plot.

The measured peak is every live tensor byte of the step (memsched.runtime.memory, `cpu-all-tensors`), the
same quantity as CUDA's max_memory_allocated; step times are medians of keep-all and scheduled steps taken
alternately in one process, with one torch thread. CPU "copies" are memcpy on the compute thread, so the
offload overhead is real and the cost model prices it that way.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memsched.io import save_model
from memsched.schema import Schedule, Trace

if TYPE_CHECKING:
    from memsched.service.measure import MeasureReport

log = logging.getLogger(__name__)


@dataclass
class DemoResult:
    """What the demo measured and where it wrote its files."""

    model: str
    """Model id."""
    trace_path: Path
    """The trace written."""
    schedule_path: Path
    """The schedule written."""
    plot_path: Path | None
    """The timeline plot, or None when the plot module is unavailable."""
    policy: str
    """The schedule's policy / solver backend."""
    actions: dict[str, int]
    """How many layers keep / offload / recompute."""
    budget_bytes: int
    """Resolved budget."""
    static_bytes: int
    """Static bytes of the trace."""
    rows: list[dict[str, Any]] = field(default_factory=list)
    """(quantity, predicted, measured, unit) rows."""
    seconds: float = 0.0
    """Wall time of the whole demo."""
    steps: int = 0
    """Timed steps per side (keep-all and scheduled alternating; the step times are their medians)."""
    threads: int = 1
    """torch's intra-op thread count during the run."""
    step_ratio_paired: float | None = None
    """Median over rounds of scheduled step / the keep-all step beside it."""

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "trace": str(self.trace_path),
            "schedule": str(self.schedule_path),
            "plot": None if self.plot_path is None else str(self.plot_path),
            "policy": self.policy,
            "actions": self.actions,
            "budget_bytes": self.budget_bytes,
            "static_bytes": self.static_bytes,
            "rows": self.rows,
            "seconds": self.seconds,
            "steps": self.steps,
            "threads": self.threads,
            "step_ratio_paired": self.step_ratio_paired,
        }


def _plot(trace: Trace, schedule: Schedule, path: Path) -> Path | None:
    try:
        from memsched.service.plot import plot_timeline
    except ImportError as e:
        log.info("timeline plot skipped: memsched.service.plot is unavailable (%s)", e)
        return None
    return plot_timeline(trace, schedule, path)


def run_demo(
    out_dir: Path = Path("out/demo"),
    *,
    model: str = "gpt2",
    num_layers: int = 6,
    batch_size: int = 8,
    seq_len: int = 128,
    budget: str = "50%",
    steps: int = 20,
    threads: int | None = 1,
    dtype: str = "float32",
) -> DemoResult:
    """Trace, solve and replay a small model on the CPU; see the module docstring.

    threads: torch's CPU threads for the run (restored after). One by default: on a machine shared with
    other jobs, a second intra-op thread makes every op wait for the slower core, and step times become
    several times slower and erratic; with one thread the trace and the replay see comparable conditions.
    """
    import torch

    previous = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        return _run_demo(out_dir, model, num_layers, batch_size, seq_len, budget, steps, dtype)
    finally:
        torch.set_num_threads(previous)


def _trace(model: str, num_layers: int, batch_size: int, seq_len: int, steps: int, dtype: str) -> Trace:
    """Step 1: trace the small model on the CPU."""
    import torch

    from memsched.runtime import builtin_workload, trace

    torch.manual_seed(0)
    w = builtin_workload(model, small=True, num_layers=num_layers, batch_size=batch_size, seq_len=seq_len, dtype=dtype)
    log.info("tracing %s (batch %d, seq %d, %s) on the CPU", w.model_id, batch_size, seq_len, dtype)
    return trace(
        w.model,
        w.step,
        steps=max(steps, 5),  # medians of a few more steps: the prediction is built on these
        warmup=2,
        model_id=w.model_id,
        batch_size=batch_size,
        seq_len=w.seq_len,
        optimizer=w.optimizer,
    )


def _rows(rep: MeasureReport, schedule: Schedule) -> list[dict[str, Any]]:
    """The demo's table: `memsched measure`'s headline rows, for keep-all and the schedule."""
    k, s = rep.keep_all, rep.scheduled
    assert k is not None and s is not None
    h = rep.headline()

    def row(quantity: str, predicted: Any, measured: Any, unit: str) -> dict[str, Any]:
        return {"quantity": quantity, "predicted": predicted, "measured": measured, "unit": unit}

    return [
        row(f"peak, whole step, keep-all ({h['peak_source']})", k.predicted_peak_bytes, k.measured_peak_bytes, "bytes"),
        row(
            f"peak, whole step, scheduled ({h['peak_source']})",
            h["predicted_peak_bytes"],
            h["measured_peak_bytes"],
            "bytes",
        ),
        row("budget", h["budget_bytes"], None, "bytes"),
        row("saved activations, scheduled (ledger)", s.predicted_saved_peak_bytes, s.saved_peak_bytes, "bytes"),
        row("step time, keep-all", k.predicted_step_s, k.measured_step_s, "s"),
        row("step time, scheduled", h["predicted_step_s"], h["measured_step_s"], "s"),
        row("overhead vs keep-all", h["predicted_overhead_pct"], h["measured_overhead_pct"], "%"),
    ]


def _run_demo(
    out_dir: Path, model: str, num_layers: int, batch_size: int, seq_len: int, budget: str, steps: int, dtype: str
) -> DemoResult:
    from memsched.service import resolve_budget, solve_trace
    from memsched.service.measure import WorkloadArgs, run_measure

    t0 = time.perf_counter()
    tr = _trace(model, num_layers, batch_size, seq_len, steps, dtype)
    out_dir.mkdir(parents=True, exist_ok=True)
    trace_path = out_dir / "trace.json"
    save_model(tr, trace_path)
    schedule = solve_trace(tr, budget)
    schedule_path = out_dir / "schedule.json"
    save_model(schedule, schedule_path)
    args = WorkloadArgs(model, batch_size=batch_size, seq_len=seq_len, num_layers=num_layers, small=True, dtype=dtype)
    # Keep-all and scheduled steps alternate in one process (measure_side_by_side): on a shared machine the
    # speed changes from minute to minute, and only steps taken side by side give a meaningful overhead.
    rep = run_measure(args, schedule, tr, steps=steps, warmup=2)
    return DemoResult(
        model=tr.model,
        trace_path=trace_path,
        schedule_path=schedule_path,
        plot_path=_plot(tr, schedule, out_dir / "timeline.png"),
        policy=f"{schedule.policy} ({schedule.solver.backend}, {schedule.solver.status.value})",
        actions=rep.actions,
        budget_bytes=resolve_budget(budget, tr),
        static_bytes=tr.static.total,
        rows=_rows(rep, schedule),
        seconds=time.perf_counter() - t0,
        steps=steps,
        threads=rep.threads,
        step_ratio_paired=rep.paired_ratio,
    )
