"""memsched.optimizer: trace -> schedule. Pure Python plus solver libraries; never imports torch."""

from memsched.optimizer.decisions import Decision, decisions_from_schedule
from memsched.optimizer.simulate import SimResult, default_timing, make_schedule, simulate, stage_memory

__all__ = [
    "Decision",
    "SimResult",
    "decisions_from_schedule",
    "default_timing",
    "make_schedule",
    "simulate",
    "stage_memory",
]
