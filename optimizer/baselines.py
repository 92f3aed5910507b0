"""The policies a user would otherwise pick, expressed as schedules so that one simulator judges them all."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from memsched.errors import InfeasibleBudgetError
from memsched.optimizer.budget import min_feasible_budget
from memsched.optimizer.decisions import KEEP, Decision, offload_all, recompute
from memsched.optimizer.simulate import SimResult, make_schedule, simulate
from memsched.schema import Schedule, SolverRecord, SolverStatus, Trace


def keep_all(trace: Trace) -> list[Decision]:
    """In-core: keep every saved tensor on the device."""
    return [KEEP] * trace.n


def checkpoint_all(trace: Trace) -> list[Decision]:
    """torch.utils.checkpoint on every layer: keep only each layer's inputs, recompute every forward."""
    return [recompute() for _ in range(trace.n)]


def sqrt_segments(trace: Trace) -> list[Decision]:
    """checkpoint_sequential with round(sqrt(n)) segments: every segment but the last is checkpointed."""
    n = trace.n
    segments = max(1, round(math.sqrt(n)))
    size = n // segments
    out: list[Decision] = [KEEP] * n
    for start in range(0, size * (segments - 1), size):
        for i in range(start, start + size):
            out[i] = recompute(group=start)
    return out


def offload_all_sync(trace: Trace) -> list[Decision]:
    """save_on_cpu: copy every saved tensor out right after its forward and back right before its backward,
    waiting for each copy."""
    return [offload_all(trace, i, done_by=i, prefetch_at=i) for i in range(trace.n)]


def offload_all_overlapped(trace: Trace) -> list[Decision]:
    """vDNN-like: offload every saved tensor, wait for the copy one layer later, prefetch one layer ahead."""
    n = trace.n
    return [offload_all(trace, i, done_by=min(i + 1, n - 1), prefetch_at=min(i + 1, n - 1)) for i in range(n)]


BASELINES: dict[str, Callable[[Trace], list[Decision]]] = {
    "keep-all": keep_all,
    "checkpoint-all": checkpoint_all,
    "sqrt-segments": sqrt_segments,
    "offload-all-sync": offload_all_sync,
    "offload-all-overlapped": offload_all_overlapped,
}


@dataclass
class PolicyResult:
    """One policy evaluated on one trace under one budget."""

    policy: str
    """Policy name."""
    decisions: list[Decision]
    """Its per-layer decisions (timing filled in)."""
    sim: SimResult
    """The simulator's verdict."""

    @property
    def feasible(self) -> bool:
        return self.sim.feasible


def evaluate_baselines(trace: Trace, budget_bytes: int) -> list[PolicyResult]:
    out = []
    for name, build in BASELINES.items():
        sim = simulate(trace, build(trace), budget_bytes, with_events=False)
        out.append(PolicyResult(name, sim.decisions, sim))
    return out


def best_baseline(trace: Trace, budget_bytes: int) -> Schedule:
    """The feasible baseline with the least predicted overhead; InfeasibleBudgetError if none fits."""
    results = [r for r in evaluate_baselines(trace, budget_bytes) if r.feasible]
    if not results:
        raise InfeasibleBudgetError(budget_bytes, min_feasible_budget(trace), "no baseline fits")
    best = min(results, key=lambda r: (r.sim.overhead_s, r.sim.peak_bytes))
    record = SolverRecord(
        backend=best.policy,
        status=SolverStatus.HEURISTIC,
        objective_s=best.sim.overhead_s,
        message=f"best feasible baseline ({best.policy})",
    )
    return make_schedule(trace, best.decisions, budget_bytes, best.policy, record)
