"""memsched: ILP-optimal keep / offload / recompute memory schedules for training under a memory budget."""

__version__ = "0.1.0"
