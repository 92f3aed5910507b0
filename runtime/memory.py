"""Whole-step device memory: the peak of every live tensor byte, with one meaning on CUDA and on the CPU.

`measure_step_memory` answers what CUDA's `max_memory_allocated` answers (after `reset_peak_memory_stats`):
the largest number of bytes held by tensors at any moment of the step. Parameters, gradients, optimizer
state, saved activations, transients, logits and the loss are all in it. Two sources, one function:

- ``cuda-allocator``: the caching allocator's counters (`memory_allocated`, `max_memory_allocated`); stage
  peaks reset the peak counter at each stage mark and keep the running maximum.
- ``cpu-all-tensors``: the CPU has no allocator statistics, so the step runs under `torch.profiler` with
  `profile_memory=True`, which reports every allocation and free of the CPU allocator with its address and
  size (the same events the profiler's memory timeline is built from). The profiler only reports the free of
  a block it saw allocated, so the window opens one step early (a priming step, also profiled): every
  per-step tensor of the measured step was then allocated under the profiler, and what was live before the
  priming step and is still live is persistent state (parameters, optimizer state, the batch). The bytes
  live when the measured step starts are counted by walking every tensor the garbage collector knows
  (plus parameters' `.grad`), deduplicated by storage; the profiler's running sum adds the step on top.

Why this and not the alternatives (docs/cost-model.md, 'Measurement'): a TorchDispatchMode tracker
(`torch.distributed._tools.mem_tracker`) sees only tensors returned by operators, not the scratch buffers a
kernel allocates inside itself (embedding backward, sorting, reductions), so it reads low on real steps; the
allocator events are what CUDA's counter sees.

Host copies made by offloading are not device bytes: on CUDA they live in pinned host memory the CUDA
allocator never sees; on the CPU they are the host buffer pool's blocks, recognised by address and reported
separately (`host_bytes`).
"""

from __future__ import annotations

import contextlib
import gc
import os
import re
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from memsched.runtime.clock import sync

CUDA_SOURCE = "cuda-allocator"
CPU_SOURCE = "cpu-all-tensors"
PEAK_SOURCES = (CUDA_SOURCE, CPU_SOURCE)

WINDOW = "memsched::measured_step"
"""Profiler range around the measured step (CPU)."""
STAGE_PREFIX = "memsched::stage::"
"""Profiler ranges marking stage entries (CPU)."""
PRE = "pre"
"""The stage name of the part of the step before the first mark (zero_grad, embeddings)."""


def peak_source(device: torch.device) -> str:
    """The source `measure_step_memory` uses on this device."""
    return CUDA_SOURCE if device.type == "cuda" else CPU_SOURCE


@dataclass
class StepMemory:
    """Device memory of one measured step."""

    source: str
    """'cuda-allocator' or 'cpu-all-tensors'."""
    peak_bytes: int
    """Largest number of device bytes live at any moment of the step (max_memory_allocated's meaning)."""
    start_bytes: int
    """Device bytes live when the step started."""
    end_bytes: int
    """Device bytes live when the step ended."""
    host_bytes: int = 0
    """Host copies made by offloading (the buffer pool's resident bytes); not device bytes, not in the peak."""
    stage_peak_bytes: dict[str, int] = field(default_factory=dict)
    """Peak within each marked stage ('pre' before the first mark, then the marks' names, e.g. 'F3', 'B3')."""
    stage_order: list[str] = field(default_factory=list)
    """The stages in the order they were entered (a name entered twice is one stage)."""


class MemoryMeter:
    """Measure the whole-step device memory of steps on `device`; `mark(stage)` opens a named stage.

    host_tensors: returns the host-copy buffers (the offload pool's); they are excluded from device bytes
    and their resident size is `StepMemory.host_bytes`.
    """

    def __init__(self, device: torch.device, host_tensors: Callable[[], Iterable[torch.Tensor]] | None = None) -> None:
        self.device = device
        self.host_tensors = host_tensors or (lambda: ())
        self._active = False
        self._order: list[str] = []
        # CUDA stage bookkeeping.
        self._stage = PRE
        self._stage_peak: dict[str, int] = {}

    @property
    def source(self) -> str:
        return peak_source(self.device)

    def mark(self, stage: str) -> None:
        """The step enters `stage` (no-op outside a measured step)."""
        if not self._active:
            return
        if stage not in self._order:
            self._order.append(stage)
        if self.device.type == "cuda":
            self._close_cuda_stage()
            self._stage = stage
        else:
            with torch.profiler.record_function(STAGE_PREFIX + stage):
                pass

    def measure(self, step: Callable[[], Any], prime: Callable[[], Any] | None = None) -> StepMemory:
        """Run `prime()` (default: `step`; CPU only) then `step()` and return the second one's memory.

        Call it at a step boundary (no autograd graph alive), after the warm-up steps."""
        if self.device.type == "cuda":
            return self._measure_cuda(step)
        return self._measure_cpu(step, step if prime is None else prime)

    # -- CUDA ---------------------------------------------------------------------------------------------

    def _close_cuda_stage(self) -> None:
        peak = int(torch.cuda.max_memory_allocated(self.device))
        self._stage_peak[self._stage] = max(self._stage_peak.get(self._stage, 0), peak)
        torch.cuda.reset_peak_memory_stats(self.device)

    def _measure_cuda(self, step: Callable[[], Any]) -> StepMemory:
        sync(self.device)
        start = int(torch.cuda.memory_allocated(self.device))
        torch.cuda.reset_peak_memory_stats(self.device)
        self._stage, self._stage_peak, self._order = PRE, {}, [PRE]
        self._active = True
        try:
            step()
            sync(self.device)
        finally:
            self._active = False
        self._close_cuda_stage()
        return StepMemory(
            source=CUDA_SOURCE,
            peak_bytes=max(self._stage_peak.values()),
            start_bytes=start,
            end_bytes=int(torch.cuda.memory_allocated(self.device)),
            host_bytes=_bytes_of(self.host_tensors()),
            stage_peak_bytes=dict(self._stage_peak),
            stage_order=list(self._order),
        )

    # -- CPU ----------------------------------------------------------------------------------------------

    def _measure_cpu(self, step: Callable[[], Any], prime: Callable[[], Any]) -> StepMemory:
        from torch.profiler import ProfilerActivity, profile, record_function

        prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
        with kineto_markers_dropped():
            prof.start()
        try:
            prime()
            gc.collect()
            host = {_storage_ptr(t) for t in self.host_tensors()}
            start = live_tensor_bytes(self.device, exclude=host)
            self._order = [PRE]
            self._active = True
            try:
                with record_function(WINDOW):
                    step()
            finally:
                self._active = False
        finally:
            with kineto_markers_dropped():
                prof.stop()
        host_list = list(self.host_tensors())
        host_ptrs = host | {_storage_ptr(t) for t in host_list}
        return _replay_events(prof, start, host_ptrs, _bytes_of(host_list), list(self._order))


KINETO_MARKER = re.compile(r"^USDT:.*\] profiler_(start|stop)\s*$")
"""The line Kineto writes to stderr at every profiler start and stop (its tracepoint markers, at a log level
above ERROR, so KINETO_LOG_LEVEL cannot drop them without dropping errors too)."""


@contextlib.contextmanager
def kineto_markers_dropped() -> Iterator[None]:
    """Around the profiler's start or stop: capture file descriptor 2 (Kineto writes there from C++, not
    through Python), then write back every line except Kineto's start/stop markers, so errors and warnings
    still reach stderr (after the call instead of during it)."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):  # no usable fd 2 (an embedded interpreter): leave it be
        yield
        return
    with tempfile.TemporaryFile() as tmp:
        try:
            os.dup2(tmp.fileno(), 2)
            yield
        finally:
            with contextlib.suppress(OSError, ValueError):
                sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            lines = tmp.read().splitlines(keepends=True)
            kept = [ln for ln in lines if not KINETO_MARKER.match(ln.decode(errors="replace"))]
            if kept:
                os.write(2, b"".join(kept))


def _storage_ptr(t: torch.Tensor) -> int:
    return int(t.untyped_storage().data_ptr())


def _bytes_of(tensors: Iterable[torch.Tensor]) -> int:
    seen: dict[int, int] = {}
    for t in tensors:
        seen[_storage_ptr(t)] = int(t.untyped_storage().nbytes())
    return sum(seen.values())


def live_tensor_bytes(device: torch.device, exclude: set[int] | None = None) -> int:
    """Bytes of every live storage on `device` reachable from Python (every tensor the garbage collector
    tracks, and parameters' gradients), each storage once; storages whose data pointer is in `exclude` are
    left out. At a step boundary this is everything the step starts with: no autograd graph holds tensors
    that Python cannot reach."""
    from torch._subclasses.fake_tensor import is_fake

    skip = exclude or set()
    seen: dict[int, int] = {}

    def add(t: torch.Tensor) -> None:
        if t.device != device or t.is_sparse or t.is_meta:
            return
        if is_fake(t):  # torch.compile keeps fake tensors alive in its caches: a storage without data
            return
        try:
            s = t.untyped_storage()
        except (RuntimeError, NotImplementedError):  # tensors without a storage (functional wrappers)
            return
        ptr = s.data_ptr()
        if ptr and ptr not in skip:
            seen[ptr] = max(seen.get(ptr, 0), int(s.nbytes()))

    for obj in gc.get_objects():
        # type() rather than isinstance: isinstance would ask lazy module proxies for __class__ (warnings).
        if issubclass(type(obj), torch.Tensor):
            add(obj)
            if obj.requires_grad and obj.is_leaf and obj.grad is not None:
                add(obj.grad)
    return sum(seen.values())


def _walk(events: Iterable[Any]) -> Iterable[Any]:
    stack = list(events)
    while stack:
        e = stack.pop()
        yield e
        stack.extend(e.children)


def _replay_events(prof: Any, start: int, host_ptrs: set[int], host_bytes: int, order: list[str]) -> StepMemory:
    """Running sum of the profiler's allocation events from the measured window's start."""
    from torch._C._profiler import _EventType

    allocs: list[tuple[int, int, int]] = []  # (time, bytes, ptr)
    marks: list[tuple[int, str]] = []
    window: tuple[int, int] | None = None
    for e in _walk(prof.profiler.kineto_results.experimental_event_tree()):
        if e.tag == _EventType.Allocation:
            f = e.extra_fields
            if f.device.type == "cpu":
                allocs.append((e.start_time_ns, int(f.alloc_size), int(f.ptr)))
        elif e.name == WINDOW:
            window = (e.start_time_ns, e.end_time_ns)
        elif e.name.startswith(STAGE_PREFIX):
            marks.append((e.start_time_ns, e.name[len(STAGE_PREFIX) :]))
    assert window is not None, "the profiler recorded no measured-step range"
    allocs.sort()
    marks.sort()
    lo, hi = window
    live = peak = end = start
    stage_peak: dict[str, int] = {PRE: start}
    stage = PRE
    k = 0
    for t, nbytes, ptr in allocs:
        if t < lo or ptr in host_ptrs:
            continue
        if t > hi:
            break
        while k < len(marks) and marks[k][0] <= t:
            stage = marks[k][1]
            stage_peak[stage] = max(stage_peak.get(stage, 0), live)
            k += 1
        live += nbytes
        peak = max(peak, live)
        stage_peak[stage] = max(stage_peak.get(stage, 0), live)
        end = live
    for _, name in marks[k:]:
        stage_peak[name] = max(stage_peak.get(name, 0), live)
    return StepMemory(
        source=CPU_SOURCE,
        peak_bytes=peak,
        start_bytes=start,
        end_bytes=end,
        host_bytes=host_bytes,
        stage_peak_bytes=stage_peak,
        stage_order=order,
    )


def measure_step_memory(
    step: Callable[[], Any],
    device: torch.device,
    *,
    prime: Callable[[], Any] | None = None,
    host_tensors: Callable[[], Iterable[torch.Tensor]] | None = None,
) -> StepMemory:
    """Whole-step device memory of `step()` on `device` (see the module docstring); one function, two sources."""
    return MemoryMeter(device, host_tensors).measure(step, prime)
