"""Per-stage profiles derived from the simulator's memory model, for comparison with runtime measurements.

The runtime's saved-tensor ledger (memsched.runtime.ledger) measures the live saved bytes of the traced layers;
its counterpart here is the saved part of the simulator's stage memory: saved bytes plus checkpoint inputs,
without the static bytes and the per-stage transients (docs/cost-model.md, 'Measurement').
"""

from __future__ import annotations

from memsched.optimizer.decisions import Decision, decisions_from_schedule
from memsched.optimizer.simulate import backward_transient, forward_transient, stage_memory
from memsched.schema import Schedule, Trace


def saved_profile(trace: Trace, decisions: list[Decision]) -> list[int]:
    """Per stage (F_0..F_{n-1}, B_{n-1}..B_0): the simulator's non-static bytes minus the stage's transients,
    i.e. saved bytes plus checkpoint inputs: what the ledger measures."""
    n = trace.n
    mem = stage_memory(trace, decisions)
    return [
        mem[t] - (forward_transient(trace, t) if t < n else backward_transient(trace, 2 * n - 1 - t))
        for t in range(2 * n)
    ]


def predicted_saved_profile(trace: Trace, schedule: Schedule) -> list[int]:
    """`saved_profile` of a Schedule's decisions."""
    return saved_profile(trace, decisions_from_schedule(schedule))
