"""Budgets: resolve 'N%' against a trace, and the smallest feasible budget (computed, not guessed)."""

from __future__ import annotations

from memsched.errors import InfeasibleBudgetError, MemschedError
from memsched.optimizer.decisions import KEEP, Decision, offload_all
from memsched.optimizer.simulate import simulate, stage_memory
from memsched.schema import Trace
from memsched.units import BudgetSpec, format_bytes, parse_budget


def keepall_activation_peak(trace: Trace) -> int:
    """Peak non-static bytes of the in-core step (what a schedule can act on)."""
    return max(stage_memory(trace, [KEEP] * trace.n))


def keepall_step_activations(trace: Trace) -> int:
    """What the in-core step allocates at its peak beyond what the device held when it began: the '100%' of a
    percentage budget, as a user measures it (peak minus the memory at the step's start). It includes what the
    step saves that no schedule moves (StaticBytes.saved_static: before the first traced layer, or held by the
    model's code)."""
    return keepall_activation_peak(trace) + trace.static.saved_static


def resolve_budget(spec: BudgetSpec | str | int, trace: Trace) -> int:
    """Budget in bytes: absolute as given, or what the device holds at the step's start + N% of the keep-all
    step's activations (`keepall_step_activations`)."""
    if not isinstance(spec, BudgetSpec):
        spec = parse_budget(spec)
    if spec.percent is None:
        assert spec.bytes is not None
        return spec.bytes
    value = trace.static.resident + round(keepall_step_activations(trace) * spec.percent / 100.0)
    if value <= 0:
        raise MemschedError(f"budget: {spec.describe()} of this trace is 0 bytes; give a larger percentage")
    return value


def min_feasible_decisions(trace: Trace) -> list[Decision]:
    """The schedule that minimises every stage's memory at once: offload every saved tensor and copy it
    synchronously (done by the end of its own forward, prefetched at the start of its own backward).
    In the cost model every layer then holds its saved bytes only during its own two stages, the pointwise
    minimum over all actions at every backward stage and at the loss point, and transients do not depend on
    the schedule. At F_i a recomputed layer holds less (simulate.forward_cuts), but here F_i is
    never above B_i (same saved bytes; the forward's transient, forward workspace + output, is at most the
    backward's, workspace + output + input gradient), and every plan holds at least this B_i: so its peak
    is still the exact smallest feasible budget."""
    out = []
    for i in range(trace.n):
        d = offload_all(trace, i, done_by=i, prefetch_at=i)
        out.append(d)
    return out


def min_feasible_budget(trace: Trace) -> int:
    return simulate(trace, min_feasible_decisions(trace), with_events=False).peak_bytes


def budget_between(trace: Trace, frac: float) -> int:
    """The budget `frac` of the way from the smallest feasible one (0) to the keep-all peak (1): a scale
    on which every value is feasible, used by tests and benchmarks."""
    if not 0.0 <= frac <= 1.0:
        raise ValueError(f"frac must be in [0, 1], got {frac}")
    lo = min_feasible_budget(trace)
    hi = trace.static.total + keepall_activation_peak(trace)
    return lo + int((hi - lo) * frac)


def check_budget_feasible(trace: Trace, budget_bytes: int) -> None:
    """Raise InfeasibleBudgetError (with the computed minimum) if no schedule can fit the budget."""
    if budget_bytes <= 0:
        raise MemschedError(f"budget: must be > 0 bytes, got {budget_bytes}; give a positive size such as 8GiB")
    minimum = min_feasible_budget(trace)
    if budget_bytes < minimum:
        static = trace.static.total
        detail = (
            f"static memory alone is {format_bytes(static)}"
            if budget_bytes < static
            else "even offloading every saved tensor synchronously peaks higher"
        )
        raise InfeasibleBudgetError(budget_bytes, minimum, detail)
