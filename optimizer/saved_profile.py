"""Per-stage profiles derived from the simulator's memory model, for comparison with runtime measurements.

The runtime's saved-tensor ledger (memsched.runtime.ledger) measures the live saved bytes of the traced layers;
its counterpart here is the saved part of the simulator's stage memory: saved bytes plus checkpoint inputs,
without the static bytes and the per-stage transients (docs/cost-model.md, 'Measurement'). The simulator
computes it (`simulate.stage_saved_bytes`), with the same rules as its stage memory, the loss point's fold
into F_{n-1} included: subtracting a stage's transient from `stage_memory` is wrong where the loss point is
the larger moment of F_{n-1}'s stage (issue 25: it read 426,240 bytes high on a tiny GPT-2's keep-all).
"""

from __future__ import annotations

from memsched.optimizer.decisions import Decision, decisions_from_schedule
from memsched.optimizer.simulate import stage_saved_bytes
from memsched.schema import Schedule, Trace


def saved_profile(trace: Trace, decisions: list[Decision]) -> list[int]:
    """Per stage (F_0..F_{n-1}, B_{n-1}..B_0): the saved part of the simulator's stage memory (saved bytes
    plus checkpoint inputs): what the ledger measures."""
    return stage_saved_bytes(trace, decisions)


def predicted_saved_profile(trace: Trace, schedule: Schedule) -> list[int]:
    """`saved_profile` of a Schedule's decisions."""
    return saved_profile(trace, decisions_from_schedule(schedule))
