"""Timestamps: CUDA events on the GPU (read after one synchronize); on the CPU, `cpu_now`.

On the CPU with one torch thread, time is the process's CPU time (`time.process_time`): a step's compute does
not wait for the GPU, only for a core, and on a machine shared with other jobs the wait for a core is noise
that neither the trace nor the replay should price. Trace, replay and copy timings use the same clock, so
predictions and measurements compare like with like. With more torch threads the CPU time would add the
threads up, so the clock is wall time (`time.perf_counter`) instead; `cpu_clock_name` says which.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch


class Clock:
    """mark() returns a token; seconds(a, b) the time between two tokens (call after finish())."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.device = device

    def mark(self) -> Any:
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record(torch.cuda.current_stream(self.device))
            return ev
        return cpu_now()

    def finish(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def seconds(self, a: Any, b: Any) -> float:
        if self.cuda:
            return float(a.elapsed_time(b)) / 1e3
        return float(b - a)


def cpu_now() -> float:
    """Seconds on the CPU clock (see the module docstring)."""
    return time.process_time() if torch.get_num_threads() == 1 else time.perf_counter()


def cpu_clock_name() -> str:
    """'process CPU time' (one torch thread) or 'wall time'."""
    return "process CPU time" if torch.get_num_threads() == 1 else "wall time"


def step_now(device: torch.device) -> float:
    """Seconds for timing whole steps between synchronisations: wall time on CUDA, `cpu_now` on the CPU."""
    return time.perf_counter() if device.type == "cuda" else cpu_now()


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_steps(run: Callable[[], Any], device: torch.device, steps: int) -> list[float]:
    """Seconds of each of `steps` calls of `run`, each between device synchronisations (`step_now`)."""
    times = []
    for _ in range(steps):
        sync(device)
        t0 = step_now(device)
        run()
        sync(device)
        times.append(step_now(device) - t0)
    return times
