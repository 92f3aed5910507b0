"""Service functions shared by the CLI and the REST API: no logic lives in only one front end."""

from __future__ import annotations

import math
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict

from memsched.errors import MemschedError, TraceFormatError
from memsched.hardware import LinkPreset, for_planned_trace, planned_trace, what_if_device
from memsched.optimizer.baselines import evaluate_baselines
from memsched.optimizer.budget import check_budget_feasible, keepall_step_activations
from memsched.optimizer.budget import keepall_activation_peak as keepall_activation_peak  # api.examples
from memsched.optimizer.budget import resolve_budget as budget_bytes
from memsched.optimizer.simulate import SimResult, simulate
from memsched.optimizer.solve import solve
from memsched.options import SolveOptions, SolveResources
from memsched.schema import MAX_DEVICE_BYTES, Schedule, Trace
from memsched.units import BudgetSpec


class CompareRow(BaseModel):
    """One policy in the comparison table (the CLI's `memsched compare` and the API's POST /v1/compare)."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    policy: str
    """Policy name."""
    feasible: bool
    """Whether its predicted peak fits the budget (and its host peak the host budget, where one is given)."""
    peak_bytes: int
    """Predicted peak bytes."""
    host_peak_bytes: int = 0
    """Predicted host peak: the offloaded bytes the host holds at once."""
    step_s: float
    """Predicted step time, seconds."""
    overhead_pct: float
    """Predicted overhead vs. keep-all, percent."""

    def to_json(self) -> dict[str, object]:
        return self.model_dump()


@dataclass
class Comparison:
    """The baseline table for one trace and budget."""

    budget_bytes: int
    """Resolved budget in bytes."""
    static_bytes: int
    """What the device holds when the step begins (StaticBytes.resident: static bytes without those the step
    saves before its layers)."""
    keepall_activation_bytes: int
    """Keep-all peak bytes beyond static_bytes (what 100% means: budget.keepall_step_activations)."""
    rows: list[CompareRow]
    """One row per policy."""

    def to_json(self) -> dict[str, object]:
        return {
            "budget_bytes": self.budget_bytes,
            "static_bytes": self.static_bytes,
            "keepall_activation_bytes": self.keepall_activation_bytes,
            "rows": [r.to_json() for r in self.rows],
        }


MAX_STEP_S = 1e15
"""The longest step the cost model computes with: more (~30 million years) is a unit mistake, and the solvers'
arithmetic overflows on it."""


class IncomputableTraceError(TraceFormatError):
    """A trace (on the link a plan is made for) whose step or copy times add up past MAX_STEP_S."""

    def __init__(self, message: str, where: str) -> None:
        super().__init__(message)
        self.where = where
        """The trace's field at fault: 'layers' or 'device'."""


def check_computable(trace: Trace, link: LinkPreset | float | None = None, ranks_per_link: int | None = None) -> None:
    """Raise IncomputableTraceError where the trace's layer times, or its copy times on the link a plan is made
    for (`link`, `ranks_per_link`: what-if hardware), add up to more than MAX_STEP_S: the CLI, the API and the
    workers refuse them alike, naming the units (`compare --link 1e-300` printed Infinity as JSON)."""
    compute_s = sum(layer.forward_s + layer.backward_s for layer in trace.layers) + trace.baseline.step_s
    planned = what_if_device(trace, link, ranks_per_link)
    bandwidth = min(planned.h2d_bytes_per_s, planned.d2h_bytes_per_s)
    copy_s = sum(layer.saved_bytes for layer in trace.layers) / bandwidth + 2 * trace.n * trace.device.copy_latency_s
    what_if = link is not None or ranks_per_link is not None
    on = f" on the link planned for ({planned.link}, 1/{planned.ranks_per_link} of it)" if what_if else ""
    for what, total, where in (
        ("layer times", compute_s, "layers"),
        (f"copy times (saved bytes / bandwidth{on})", copy_s, "device"),
    ):
        if not total < MAX_STEP_S:
            raise IncomputableTraceError(
                f"the trace's {what} add up to {total:.3g} s, more than {MAX_STEP_S:.0e} s; check the units "
                "(seconds, bytes, bytes per second)" + (" and the link's rate" if on and where == "device" else ""),
                where,
            )


MAX_BUDGET_BYTES = MAX_DEVICE_BYTES
"""The largest budget accepted: far beyond any device, and what a 64-bit database column (BIGINT) holds."""


def resolve_budget(budget: BudgetSpec | str | int, trace: Trace, check_feasible: bool = False) -> int:
    """The one budget resolver of the CLI, the API and the workers: a budget as the user wrote it ('8GiB',
    '500MB', bytes, 'N%': static + N% of the keep-all activation peak) in bytes for this trace.

    Raises MemschedError naming the problem (unreadable, not positive, beyond any device) and, with
    `check_feasible`, InfeasibleBudgetError carrying the smallest feasible budget (one simulation). That budget
    is offload-all's: ask for the check only where the options' plans reach it (SolveOptions.least_budget_is_
    offloads; a 422 quoted offload's 24.49 MiB for a CPU trace whose job then failed at it, naming 25.77 MiB)."""
    try:
        b = budget_bytes(budget, trace)
    except (ArithmeticError, ValueError) as e:
        if isinstance(e, MemschedError):
            raise
        # Finite but astronomically large numbers in a trace or budget overflow the cost model's floats.
        raise MemschedError(f"budget: cannot compute with {budget!r} and this trace ({e}); check both") from None
    if b > MAX_BUDGET_BYTES:
        raise MemschedError(
            f"budget: {b} bytes is larger than any device ({MAX_BUDGET_BYTES} bytes at most); give a real "
            "device-memory budget such as 8GiB"
        )
    if check_feasible:
        check_budget_feasible(trace, b)
    return b


def compare_policies(
    trace: Trace,
    budget: BudgetSpec | str | int,
    link: LinkPreset | float | None = None,
    ranks_per_link: int | None = None,
    host_budget: int | None = None,
) -> Comparison:
    """Every baseline under one budget, judged by the simulator (on another link, or a share of one, if asked;
    within a host budget, if given)."""
    check_computable(trace, link, ranks_per_link)
    b = resolve_budget(budget, trace)
    trace = planned_trace(trace, what_if_device(trace, link, ranks_per_link))
    rows = [
        CompareRow(
            policy=r.policy,
            feasible=r.feasible and (host_budget is None or r.sim.host_peak_bytes <= host_budget),
            peak_bytes=r.sim.peak_bytes,
            host_peak_bytes=r.sim.host_peak_bytes,
            step_s=r.sim.step_s,
            overhead_pct=r.sim.overhead_pct,
        )
        for r in evaluate_baselines(trace, b)
    ]
    if not all(math.isfinite(r.step_s) and math.isfinite(r.overhead_pct) for r in rows):
        raise IncomputableTraceError(
            "the predicted step times overflow for this trace; check its units (seconds, bytes)", "layers"
        )
    return Comparison(b, trace.static.resident, keepall_step_activations(trace), rows)


def solve_trace(
    trace: Trace,
    budget: BudgetSpec | str | int,
    options: SolveOptions | None = None,
    resources: SolveResources | None = None,
    start: Schedule | None = None,
) -> Schedule:
    """Resolve the budget and solve, for the device and link the options name (what-if hardware: the trace's
    copy rates replaced; the schedule records them in `planned_for` and still names the trace's own hash).
    `start`: an earlier answer of the same solve to start from (a sweep's point solved again).
    Raises InfeasibleBudgetError with the smallest feasible budget."""
    options = options or SolveOptions()
    check_computable(trace, options.link, options.ranks_per_link)
    planned = what_if_device(trace, options.link, options.ranks_per_link)
    sched = solve(planned_trace(trace, planned), resolve_budget(budget, trace), options, resources, start)
    return sched.model_copy(update={"trace_hash": trace.content_hash(), "planned_for": planned})


def prepare_solver() -> float:
    """Compile or load the solver's kernels in this process (seconds taken): workers call it before their first
    job, so that no job's time limit pays for it and no time-limit signal lands mid-compile."""
    from memsched.optimizer.jit import prepare_kernels  # numba loads here, not on every CLI start

    return prepare_kernels()


def simulate_schedule(trace: Trace, schedule: Schedule) -> SimResult:
    """Check that the schedule belongs to the trace and simulate it under its own budget, on the link it was
    planned for."""
    return simulate(*for_planned_trace(trace, schedule))
