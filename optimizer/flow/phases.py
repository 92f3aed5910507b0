"""Flow: one solve's state and every phase it can run."""

from __future__ import annotations

from memsched.optimizer.flow.answers import AnswerPhases
from memsched.optimizer.flow.bounds import BoundPhases


class Flow(AnswerPhases, BoundPhases):
    """One solve: its state (FlowState) and every phase that plan_for (optimizer/solve.py) can run."""
