"""The exact optimizer: one MILP (model.py), solved by PuLP (CBC, HiGHS) or OR-Tools CP-SAT."""

from memsched.optimizer.ilp.model import MilpModel, build_model, default_window
from memsched.optimizer.ilp.outcome import Outcome
from memsched.optimizer.ilp.warm import complete, decode, hint, representable

__all__ = ["MilpModel", "Outcome", "build_model", "complete", "decode", "default_window", "hint", "representable"]
