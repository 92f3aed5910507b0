"""memsched.runtime: the tracer (model -> Trace) and the replay (Schedule -> the model's own eager loop).

Needs torch (and transformers for the built-in models); never imports the optimizer.
"""

from memsched.runtime.layers import default_layers, find_layers
from memsched.runtime.ledger import LedgerStats, SavedLedger
from memsched.runtime.measure import Measurement, keep_all_schedule, measure
from memsched.runtime.memory import MemoryMeter, StepMemory, measure_step_memory
from memsched.runtime.models import BUILTIN_MODELS, Workload, builtin_workload, load_factory, workload
from memsched.runtime.pool import HostBudgetExceeded, HostBufferPool, PoolStats
from memsched.runtime.replay import ScheduledModel, apply_schedule
from memsched.runtime.tracer import static_bytes, trace, trace_workload

__all__ = [
    "BUILTIN_MODELS",
    "HostBudgetExceeded",
    "HostBufferPool",
    "LedgerStats",
    "Measurement",
    "MemoryMeter",
    "PoolStats",
    "SavedLedger",
    "ScheduledModel",
    "StepMemory",
    "Workload",
    "apply_schedule",
    "builtin_workload",
    "default_layers",
    "find_layers",
    "keep_all_schedule",
    "load_factory",
    "measure",
    "measure_step_memory",
    "static_bytes",
    "trace",
    "trace_workload",
    "workload",
]
