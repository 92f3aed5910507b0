"""The exact optimizer: one MILP (model.py), solved by PuLP (CBC, HiGHS) or OR-Tools CP-SAT."""

from memsched.optimizer.ilp.model import MilpModel, build_model, decode, default_window, hint, representable
from memsched.optimizer.ilp.outcome import Found, Outcome

__all__ = ["Found", "MilpModel", "Outcome", "build_model", "decode", "default_window", "hint", "representable"]
