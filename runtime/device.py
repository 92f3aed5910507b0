"""Device facts for a trace: name, capacity, and measured copy bandwidth and latency."""

from __future__ import annotations

import os
import platform
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from memsched.runtime.clock import step_now, sync


@dataclass(frozen=True)
class CopySpeed:
    """Measured copy engine speeds."""

    h2d_bytes_per_s: float
    """Pinned host->device bandwidth, into a freshly allocated destination (memcpy on the CPU)."""
    d2h_bytes_per_s: float
    """Device->pinned host bandwidth (memcpy on the CPU)."""
    latency_s: float
    """Fixed cost of one copy (a tiny copy's time)."""


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return str(torch.cuda.get_device_name(device))
    # The torch thread count is part of what the CPU timings mean, so it is named with the device.
    arch = platform.processor() or platform.machine()
    n = torch.get_num_threads()
    return f"cpu ({arch}, {os.cpu_count()} cores, {n} torch thread{'' if n == 1 else 's'})"


def device_memory(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 1 << 34


def _time_copy(dst: Callable[[], torch.Tensor], src: torch.Tensor, device: torch.device, repeats: int) -> float:
    """Median time of `dst().copy_(src)`; dst() runs inside the timed region (see `measure_copy_speed`)."""
    times = []
    for _ in range(repeats):
        sync(device)
        t0 = step_now(device)
        dst().copy_(src, non_blocking=True)
        sync(device)
        times.append(step_now(device) - t0)
    return statistics.median(times)


def measure_copy_speed(device: torch.device, nbytes: int = 32 << 20, repeats: int = 7) -> CopySpeed:
    """Median timings of one large and one tiny copy in each direction, priced as the runtime does them: an
    offload copies into a pooled host buffer that already exists (pinned on CUDA, plain memory on the CPU);
    a prefetch allocates its device destination first. On the CPU that allocation is fresh memory the kernel
    must fault in page by page, which costs about as much as the copy itself, so it is part of the price."""
    pin = device.type == "cuda"
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pin)
    dev = torch.empty(nbytes, dtype=torch.uint8, device=device)
    host_small = torch.empty(64, dtype=torch.uint8, pin_memory=pin)
    dev_small = torch.empty(64, dtype=torch.uint8, device=device)
    host.fill_(1)
    dev.fill_(2)

    def fresh(n: int) -> Callable[[], torch.Tensor]:
        return lambda: torch.empty(n, dtype=torch.uint8, device=device)

    _time_copy(fresh(nbytes), host, device, 2)  # warm the copy path (page faults, driver)
    latency = min(
        _time_copy(fresh(64), host_small, device, repeats), _time_copy(lambda: host_small, dev_small, device, repeats)
    )
    h2d = _time_copy(fresh(nbytes), host, device, repeats)
    d2h = _time_copy(lambda: host, dev, device, repeats)
    # The bandwidth is what is left after the fixed cost; a floor keeps a noisy tiny copy from dividing by ~0.
    return CopySpeed(
        h2d_bytes_per_s=nbytes / max(h2d - latency, h2d * 0.5),
        d2h_bytes_per_s=nbytes / max(d2h - latency, d2h * 0.5),
        latency_s=latency,
    )


def _round_trip(device: torch.device, sizes: Sequence[int], repeats: int) -> tuple[float, float]:
    """Median seconds to offload, then to bring back, tensors of `sizes` bytes through the runtime's own path
    (memsched.runtime.offload: one record per storage, pooled host buffers, a fresh device destination)."""
    from memsched.runtime.copier import Copier
    from memsched.runtime.offload import OffloadRecord
    from memsched.runtime.pool import HostBufferPool

    copier = Copier(device)
    pool = HostBufferPool(pin_memory=device.type == "cuda")
    d2h, h2d = [], []
    for _ in range(repeats + 1):  # the first round fills the pool, as a training loop's first step does
        xs = [torch.ones(n, dtype=torch.uint8, device=device) for n in sizes]
        sync(device)
        t0 = step_now(device)
        recs = [OffloadRecord(0, x.untyped_storage(), copier, pool, None) for x in xs]
        handles = [r.handle(x) for r, x in zip(recs, xs, strict=True)]
        xs.clear()
        for r in recs:
            r.release_device()
        sync(device)
        t1 = step_now(device)
        back = [h.unpack() for h in handles]
        sync(device)
        t2 = step_now(device)
        d2h.append(t1 - t0)
        h2d.append(t2 - t1)
        del back, handles, recs
    return statistics.median(d2h[1:]), statistics.median(h2d[1:])


def measure_runtime_copy_speed(device: torch.device, sizes: Sequence[int], repeats: int = 15) -> CopySpeed:
    """Copy speed as the runtime moves one layer's saved tensors (`sizes`, bytes per storage): the fixed cost
    is that of as many tiny storages (bookkeeping, pool, one copy each), the bandwidth what the real sizes add
    on top. On the CPU this prices the prefetch's fresh allocation and the per-tensor work at the sizes the
    schedule moves, which a single large memcpy does not.

    Medians of 15 round trips (5 before): one round trip of a layer takes milliseconds, so a handful of them
    sees one moment of a shared machine. Traces of the demo's model measured 5.6-9.9 GB/s within an hour,
    moving its predicted offload overhead by ~3 points; more round trips damp the part of that which is
    noise from one step to the next (not a slower minute). The calibration still costs well under a step."""
    sizes = [n for n in sizes if n > 0]
    if not sizes:
        return measure_copy_speed(device)
    tiny_d2h, tiny_h2d = _round_trip(device, [64] * len(sizes), repeats)
    d2h, h2d = _round_trip(device, sizes, repeats)
    total = sum(sizes)
    latency = (tiny_d2h + tiny_h2d) / 2
    return CopySpeed(
        h2d_bytes_per_s=total / max(h2d - latency, h2d * 0.5),
        d2h_bytes_per_s=total / max(d2h - latency, d2h * 0.5),
        latency_s=latency,
    )


def framework_versions() -> dict[str, str]:
    import memsched

    out = {"torch": str(torch.__version__), "python": platform.python_version(), "memsched": memsched.__version__}
    tf = sys.modules.get("transformers")
    if tf is not None:
        out["transformers"] = str(getattr(tf, "__version__", "unknown"))
    if torch.version.cuda and torch.cuda.is_available():
        out["cuda"] = str(torch.version.cuda)
    return out
