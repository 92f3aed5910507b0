"""`memsched demo`: the three steps end to end on a small real model, on the CPU, in about a minute.

1. trace a small GPT-2 (transformers, built from its config: nothing is downloaded) for a few steps;
2. solve for a budget of about half its activation memory (memsched.service, the same call as the CLI/API);
3. replay a few training steps under the schedule and print predicted against measured peak and step time,
   and write the simulated timeline plot.

On the CPU the measured memory is the saved-tensor ledger (see memsched.runtime.ledger), compared with the
simulator's saved part of stage memory (`predicted_saved_profile`): the same quantity, from the same
attribution rule. Step times are wall-clock medians; CPU "copies" are memcpy, so the offload overhead is real.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memsched.io import save_model
from memsched.optimizer.plan import Decision, decisions_from_schedule
from memsched.optimizer.simulate import backward_transient, forward_transient, stage_memory
from memsched.schema import Schedule, Trace

log = logging.getLogger(__name__)


def predicted_saved_profile(trace: Trace, schedule: Schedule) -> list[int]:
    """Per stage (F_0..F_{n-1}, B_{n-1}..B_0): the simulator's non-static bytes minus the stage's transients,
    i.e. saved bytes plus checkpoint inputs: what the CPU ledger measures."""
    return saved_profile(trace, decisions_from_schedule(schedule))


def saved_profile(trace: Trace, decisions: list[Decision]) -> list[int]:
    """`predicted_saved_profile` for decisions (e.g. a baseline's) rather than a Schedule."""
    n = trace.n
    mem = stage_memory(trace, decisions)
    return [
        mem[t] - (forward_transient(trace, t) if t < n else backward_transient(trace, 2 * n - 1 - t))
        for t in range(2 * n)
    ]


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
    steps: int = 3,
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


def _run_demo(
    out_dir: Path, model: str, num_layers: int, batch_size: int, seq_len: int, budget: str, steps: int, dtype: str
) -> DemoResult:
    import torch

    from memsched.optimizer.budget import resolve_budget
    from memsched.runtime import builtin_workload, measure, trace
    from memsched.service import solve_trace

    t0 = time.perf_counter()
    torch.manual_seed(0)
    w = builtin_workload(model, small=True, num_layers=num_layers, batch_size=batch_size, seq_len=seq_len, dtype=dtype)
    log.info("tracing %s (batch %d, seq %d, %s) on the CPU", w.model_id, batch_size, seq_len, dtype)
    tr = trace(
        w.model,
        w.step,
        steps=max(steps, 5),  # medians of a few more steps: the prediction is built on these
        warmup=2,
        model_id=w.model_id,
        batch_size=batch_size,
        seq_len=w.seq_len,
        optimizer=w.optimizer,
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    trace_path = out_dir / "trace.json"
    save_model(tr, trace_path)
    schedule = solve_trace(tr, budget)
    schedule_path = out_dir / "schedule.json"
    save_model(schedule, schedule_path)
    actions = schedule.action_counts()

    def step(m: Any) -> None:
        w.step(m)

    saved_profile = predicted_saved_profile(tr, schedule)
    # Keep-all and scheduled alternate, twice, and each keeps its faster round: on a shared machine the
    # load changes by the second, and the ratio of the two is the measured overhead.
    keeps, gots = [], []
    for _ in range(2):
        keeps.append(measure(w.model, step, None, optimizer=w.optimizer, steps=steps, warmup=1))
        gots.append(
            measure(
                w.model,
                step,
                schedule,
                trace=tr,
                optimizer=w.optimizer,
                steps=steps,
                warmup=1,
                predicted_saved_peak_bytes=max(saved_profile),
            )
        )
    keep = min(keeps, key=lambda m: m.step_s)
    got = min(gots, key=lambda m: m.step_s)
    plot_path = _plot(tr, schedule, out_dir / "timeline.png")
    static = tr.static.total
    keep_saved = max(predicted_saved_profile(tr, _keep_all(tr, schedule)))
    rows = [
        {
            "quantity": "saved activations, keep-all",
            "predicted": keep_saved,
            "measured": keep.saved_peak_bytes,
            "unit": "bytes",
        },
        {
            "quantity": "saved activations, scheduled",
            "predicted": got.predicted_saved_peak_bytes,
            "measured": got.saved_peak_bytes,
            "unit": "bytes",
        },
        {
            "quantity": "peak (static + saved)",
            "predicted": static + max(saved_profile),
            "measured": got.peak_bytes,
            "unit": "bytes",
        },
        {
            "quantity": "peak incl. transients (simulator)",
            "predicted": schedule.prediction.peak_bytes,
            "measured": None,
            "unit": "bytes",
        },
        {
            "quantity": "step time, keep-all",
            "predicted": schedule.prediction.keepall_step_s,
            "measured": keep.step_s,
            "unit": "s",
        },
        {
            "quantity": "step time, scheduled",
            "predicted": schedule.prediction.step_s,
            "measured": got.step_s,
            "unit": "s",
        },
        {
            "quantity": "overhead vs keep-all",
            "predicted": schedule.prediction.overhead_pct,
            "measured": 100.0 * (got.step_s / keep.step_s - 1.0),
            "unit": "%",
        },
    ]
    return DemoResult(
        model=tr.model,
        trace_path=trace_path,
        schedule_path=schedule_path,
        plot_path=plot_path,
        policy=f"{schedule.policy} ({schedule.solver.backend}, {schedule.solver.status.value})",
        actions=actions,
        budget_bytes=resolve_budget(budget, tr),
        static_bytes=static,
        rows=rows,
        seconds=time.perf_counter() - t0,
    )


def _keep_all(trace: Trace, schedule: Schedule) -> Schedule:
    from memsched.schema import Action, LayerAction

    return schedule.model_copy(
        update={"actions": [LayerAction(layer=n, action=Action.KEEP) for n in trace.layer_names]}
    )
