"""Timestamps for layer timing: CUDA events on the GPU (read after one synchronize), perf_counter on the CPU."""

from __future__ import annotations

import time
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
        return time.perf_counter()

    def finish(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def seconds(self, a: Any, b: Any) -> float:
        if self.cuda:
            return float(a.elapsed_time(b)) / 1e3
        return float(b - a)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
