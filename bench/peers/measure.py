"""Measurement primitives: peak activation bytes of one step, median step time, gradient comparison.

Peak on CPU comes from the kineto profiler's memory events (the CPU allocator's real allocations and frees);
on CUDA from the caching allocator's max_memory_allocated. Both are measured relative to the bytes live at the
start of the step, so parameters, gradients (allocated by a warm-up step and zeroed in place) and the input
batch are excluded and what remains is activations + transients: the part a schedule can change.
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

log = logging.getLogger(__name__)

Step = Callable[[], None]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


BACKWARD_MARK = "bench.peers.backward"
"""A profiler range around loss.backward(): the live bytes when it starts are what the forward left behind."""
_cuda_forward_end: list[int] = []


def backward(loss: torch.Tensor) -> None:
    """loss.backward(), marked so the measurement can split the step into forward and backward."""
    if loss.device.type == "cuda":
        _cuda_forward_end.append(torch.cuda.memory_allocated(loss.device))
    with torch.profiler.record_function(BACKWARD_MARK):
        loss.backward()


@dataclass
class Peak:
    """Bytes above what was live when the step started."""

    peak_bytes: int
    """The step's peak."""
    forward_end_bytes: int | None
    """Live when backward starts: saved activations + the loss's inputs (None if the step has no mark)."""


def peak_activation_bytes(step: Step, device: torch.device) -> Peak:
    """Run `step` once and return its peak bytes above what was live when it started."""
    if device.type == "cuda":
        _sync(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        _cuda_forward_end.clear()
        step()
        _sync(device)
        fwd = _cuda_forward_end[-1] - before if _cuda_forward_end else None
        return Peak(int(torch.cuda.max_memory_allocated(device) - before), fwd)
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    all_events = list(prof.profiler.kineto_results.events())
    marks = [e.start_ns() for e in all_events if e.name() == BACKWARD_MARK]
    mark = min(marks) if marks else None
    events = [e for e in all_events if e.name() == "[memory]"]
    # Events only cover the profiled region, so the running sum starts at 0 = "live at step start".
    events.sort(key=lambda e: e.start_ns())
    live = peak = 0
    forward_end: int | None = None
    for e in events:
        if mark is not None and forward_end is None and e.start_ns() >= mark:
            forward_end = live
        live += e.nbytes()
        peak = max(peak, live)
    if mark is not None and forward_end is None:
        forward_end = live
    return Peak(int(peak), forward_end)


def step_times(step: Step, device: torch.device, n: int) -> tuple[list[float], list[float]]:
    """Wall and process-CPU time of `n` steps, each synchronised (the caller has warmed up).

    CPU time (all of this process's threads) does not count time spent waiting for a core, so on a shared
    machine it is the steadier measure of what a step costs; wall time is what a user waits for.
    """
    wall, cpu = [], []
    for _ in range(n):
        _sync(device)
        t0, c0 = time.perf_counter(), time.process_time()
        step()
        _sync(device)
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return wall, cpu


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else math.nan


def grads_of(model: nn.Module) -> dict[str, torch.Tensor]:
    """A CPU copy of every parameter's gradient (None grads are skipped, and so reported as missing)."""
    return {name: p.grad.detach().to("cpu", copy=True) for name, p in model.named_parameters() if p.grad is not None}


def zero_grads(model: nn.Module) -> None:
    """Zero in place, so gradient storage stays live across steps and is not counted as activation memory."""
    for p in model.parameters():
        if p.grad is not None:
            p.grad.zero_()


@dataclass
class GradCheck:
    """How one run's gradients compare to keep-all's on the same weights and batch."""

    ok: bool
    """All parameters present and every relative error <= tolerance."""
    bitwise: bool
    """Every gradient identical to the bit."""
    max_rel_err: float
    """max over parameters of ||g - g_ref|| / ||g_ref||."""
    worst_param: str
    """The parameter with the largest relative error."""
    missing: int
    """Parameters that have a reference gradient but none here (or the reverse)."""

    def to_json(self) -> dict[str, object]:
        return {
            "ok": self.ok,
            "bitwise": self.bitwise,
            "max_rel_err": self.max_rel_err,
            "worst_param": self.worst_param,
            "missing": self.missing,
        }


# Recompute replays the same kernels on the same inputs, so it is normally bitwise equal on CPU; compiled
# graphs decompose ops and may reassociate float sums, which moves fp32 results by ~1e-6 relative. 1e-4 passes
# both and still catches a dropped or doubled term (which is O(1) relative).
REL_TOL = 1e-4
# Some gradients are mathematically zero and numerically pure rounding noise — e.g. attention's key bias (adding
# a constant to every score of a row leaves the softmax unchanged). Relative to their own norm, two different
# noise patterns differ by ~100%. So each parameter's error is measured against at least this fraction of the
# typical per-element gradient scale of the whole model (times sqrt of its size).
SCALE_FLOOR = 1e-3


def compare_grads(got: dict[str, torch.Tensor], ref: dict[str, torch.Tensor], tol: float = REL_TOL) -> GradCheck:
    missing = len(set(ref) ^ set(got))
    bitwise = missing == 0
    total_sq = sum(float(r.double().pow(2).sum()) for r in ref.values())
    total_n = sum(r.numel() for r in ref.values()) or 1
    rms = math.sqrt(total_sq / total_n)
    worst, worst_name = 0.0, ""
    for name, r in ref.items():
        g = got.get(name)
        if g is None:
            continue
        if bitwise and not torch.equal(g, r):
            bitwise = False
        denom = max(float(r.double().norm()), SCALE_FLOOR * rms * math.sqrt(r.numel()))
        diff = float((g.double() - r.double()).norm())
        err = diff / denom if denom > 0 else (0.0 if diff == 0 else math.inf)
        if not math.isfinite(err):
            err = math.inf
        if err > worst:
            worst, worst_name = err, name
    return GradCheck(
        ok=missing == 0 and worst <= tol, bitwise=bitwise, max_rel_err=worst, worst_param=worst_name, missing=missing
    )
