"""Pooled host buffers for offloaded activations: allocated once, reused every step.

Pinned (page-locked) memory is expensive to allocate and to free, and a training loop offloads the same
sizes every step, so buffers are kept in free lists keyed by exact byte size. After the first step the pool
hands out only buffers it already has: host memory does not grow with the number of steps.

With a limit (the schedule's host budget, SolveOptions.host_budget) the pool never holds more than that many
bytes: a request it cannot serve within the limit first drops free buffers of other sizes, and if the buffers
lent out leave no room, raises HostBudgetExceeded naming the budget, the request, what is in use and the fix.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass
from typing import Any

import torch

from memsched.errors import MemschedError
from memsched.units import format_bytes


class HostBudgetExceeded(MemschedError):
    """The pinned pool was asked for more host bytes than its limit (the schedule's host budget) allows."""


@dataclass(frozen=True)
class PoolStats:
    """Host buffer pool counters."""

    allocated_bytes: int
    """Bytes of host buffers ever created (the pool's host footprint; flat once steps repeat)."""
    allocated_buffers: int
    """Number of host buffers ever created."""
    in_use_bytes: int
    """Bytes currently lent out (holding an offloaded activation)."""
    in_use_buffers: int
    """Buffers currently lent out."""
    reuses: int
    """Requests served from the free lists instead of a new allocation."""
    peak_in_use_bytes: int = 0
    """Most bytes lent out at once since the pool was made (the plan's host peak, as measured)."""
    limit_bytes: int | None = None
    """The most bytes the pool may hold (None: no limit)."""


class HostBufferPool:
    """Exact-size free lists of uint8 host buffers; pinned when the device is CUDA."""

    def __init__(self, pin_memory: bool, limit_bytes: int | None = None) -> None:
        if limit_bytes is not None and limit_bytes < 0:
            raise ValueError(f"host budget: must be >= 0 bytes, got {limit_bytes}")
        self.pin_memory = pin_memory
        self.limit_bytes = limit_bytes
        """The most bytes of host buffers the pool holds at once, free or lent out (None: no limit)."""
        self._free: dict[int, list[torch.Tensor]] = {}
        # Buffers given back while a copy may still read or write them (CUDA), with that copy's event.
        # Returning them without blocking keeps the host from waiting on the GPU inside backward.
        self._pending: list[tuple[torch.Tensor, Any]] = []
        self._lock = threading.Lock()
        self._allocated_bytes = 0
        self._allocated_buffers = 0
        self._in_use_bytes = 0
        self._in_use_buffers = 0
        self._reuses = 0
        self._peak_in_use_bytes = 0
        # Every buffer created and still alive (free or lent out): the host bytes a measurement leaves out.
        self._created: weakref.WeakValueDictionary[int, torch.Tensor] = weakref.WeakValueDictionary()

    def buffers(self) -> list[torch.Tensor]:
        """The pool's live host buffers, free or lent out."""
        with self._lock:
            return list(self._created.values())

    def acquire(self, nbytes: int) -> torch.Tensor:
        """A host buffer of exactly nbytes (uint8, 1-D)."""
        with self._lock:
            self._sweep(block_for=nbytes)
            free = self._free.get(nbytes)
            if free:
                buf = free.pop()
                self._reuses += 1
            else:
                if self.limit_bytes is not None and self._allocated_bytes + nbytes > self.limit_bytes:
                    self._make_room(nbytes)
                buf = torch.empty(nbytes, dtype=torch.uint8, pin_memory=self.pin_memory)
                self._created[id(buf)] = buf
                self._allocated_bytes += nbytes
                self._allocated_buffers += 1
            self._in_use_bytes += nbytes
            self._in_use_buffers += 1
            self._peak_in_use_bytes = max(self._peak_in_use_bytes, self._in_use_bytes)
            return buf

    def _make_room(self, nbytes: int) -> None:
        """Within the limit: drop free buffers (waiting for the copies of pending ones) until `nbytes` more fit,
        or raise HostBudgetExceeded when what is lent out leaves no room. Called with the lock held."""
        assert self.limit_bytes is not None
        for buf, ev in self._pending:
            ev.synchronize()
            self._free.setdefault(buf.numel(), []).append(buf)
        self._pending.clear()
        for size in sorted(self._free, reverse=True):
            while self._free[size] and self._allocated_bytes + nbytes > self.limit_bytes:
                self._free[size].pop()
                self._allocated_bytes -= size
                self._allocated_buffers -= 1
        if self._allocated_bytes + nbytes > self.limit_bytes:
            raise HostBudgetExceeded(
                f"host budget: the pinned pool needs {format_bytes(nbytes)} ({nbytes} bytes) more for an offloaded "
                f"activation, but {format_bytes(self._in_use_bytes)} ({self._in_use_bytes} bytes) of its limit of "
                f"{format_bytes(self.limit_bytes)} ({self.limit_bytes} bytes) are in use. Raise the host budget "
                "(apply_schedule(..., host_budget=BYTES)), or re-solve with --host-budget for this host; a plan "
                "solved under it predicts its host peak (prediction.host_peak_bytes)"
            )

    def release(self, buf: torch.Tensor, event: Any = None) -> None:
        """Give a buffer back; `event` (a CUDA event) marks the end of the last copy that uses it, and the
        buffer is reused only once that event has completed."""
        nbytes = buf.numel()
        with self._lock:
            if event is not None and not event.query():
                self._pending.append((buf, event))
            else:
                self._free.setdefault(nbytes, []).append(buf)
            self._in_use_bytes -= nbytes
            self._in_use_buffers -= 1
            assert self._in_use_buffers >= 0, "a host buffer was released twice"

    def _sweep(self, block_for: int | None = None) -> None:
        """Move pending buffers whose copies are done to the free lists. If none of size `block_for` is free
        but one is pending, wait for the oldest such copy rather than allocating: the pool never grows
        because the GPU is behind."""
        still = []
        for buf, ev in self._pending:
            if ev.query():
                self._free.setdefault(buf.numel(), []).append(buf)
            else:
                still.append((buf, ev))
        self._pending = still
        if block_for is not None and not self._free.get(block_for):
            for k, (buf, ev) in enumerate(self._pending):
                if buf.numel() == block_for:
                    ev.synchronize()
                    del self._pending[k]
                    self._free.setdefault(block_for, []).append(buf)
                    break

    def clear(self) -> None:
        """Drop the free buffers (those lent out stay with their holders)."""
        with self._lock:
            for buf, ev in self._pending:
                ev.synchronize()
                self._free.setdefault(buf.numel(), []).append(buf)
            self._pending.clear()
            for bufs in self._free.values():
                for b in bufs:
                    self._allocated_bytes -= b.numel()
                    self._allocated_buffers -= 1
            self._free.clear()

    def stats(self) -> PoolStats:
        with self._lock:
            return PoolStats(
                self._allocated_bytes,
                self._allocated_buffers,
                self._in_use_bytes,
                self._in_use_buffers,
                self._reuses,
                self._peak_in_use_bytes,
                self.limit_bytes,
            )
