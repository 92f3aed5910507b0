"""Copies between device and host on side streams (CUDA) or synchronously (CPU), behind one interface.

On CUDA an offload is issued on a device->host stream after an event recorded on the compute stream (so it
reads the tensor only once the producing kernels are done), and a prefetch on a host->device stream. The
compute stream later waits on the one event of the copy it needs, never on the whole side stream. On the
CPU the same calls copy synchronously and return no event, so the replay logic is one code path.
"""

from __future__ import annotations

from typing import Any

import torch


def _as_bytes(storage: torch.UntypedStorage, device: torch.device) -> torch.Tensor:
    """A 1-D uint8 view of a whole storage (any dtype), so copies move storages, not shapes."""
    return torch.empty(0, dtype=torch.uint8, device=device).set_(storage)


class Copier:
    """Issues offload (D2H) and prefetch (H2D) copies; returns an event to wait on, or None when done."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.is_cuda = device.type == "cuda"
        self.d2h: Any = torch.cuda.Stream(device) if self.is_cuda else None
        self.h2d: Any = torch.cuda.Stream(device) if self.is_cuda else None

    def offload(self, storage: torch.UntypedStorage, host: torch.Tensor) -> Any:
        """Start copying the storage into the host buffer; the storage must stay alive until the event."""
        src = _as_bytes(storage, self.device)
        if not self.is_cuda:
            host.copy_(src)
            return None
        ready = torch.cuda.current_stream(self.device).record_event()
        with torch.cuda.stream(self.d2h):
            self.d2h.wait_event(ready)
            host.copy_(src, non_blocking=True)
            return self.d2h.record_event()

    def prefetch(self, host: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """Allocate the device copy now (on the compute stream: the cost model counts it from issue) and
        start filling it from the host buffer."""
        dst = torch.empty(host.numel(), dtype=torch.uint8, device=self.device)
        if not self.is_cuda:
            dst.copy_(host)
            return dst, None
        # The H2D stream may only write once the compute stream is past everything queued before the
        # allocation: the caching allocator may hand us memory that earlier compute kernels still use.
        ready = torch.cuda.current_stream(self.device).record_event()
        with torch.cuda.stream(self.h2d):
            self.h2d.wait_event(ready)
            dst.copy_(host, non_blocking=True)
            return dst, self.h2d.record_event()

    def wait(self, event: Any) -> None:
        """Make the current (compute) stream wait for one copy; a no-op for synchronous copies."""
        if event is not None:
            torch.cuda.current_stream(self.device).wait_event(event)
