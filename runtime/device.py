"""Device facts for a trace: name, capacity, and measured copy bandwidth and latency."""

from __future__ import annotations

import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass

import torch

from memsched.runtime.clock import sync


@dataclass(frozen=True)
class CopySpeed:
    """Measured copy engine speeds."""

    h2d_bytes_per_s: float
    """Pinned host->device bandwidth (memcpy on the CPU)."""
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


def _time_copy(dst: torch.Tensor, src: torch.Tensor, device: torch.device, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        sync(device)
        t0 = time.perf_counter()
        dst.copy_(src, non_blocking=True)
        sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure_copy_speed(device: torch.device, nbytes: int = 32 << 20, repeats: int = 7) -> CopySpeed:
    """Median timings of one large and one tiny copy in each direction, through pinned host memory on CUDA
    (what the runtime's pool uses) and plain memcpy on the CPU."""
    pin = device.type == "cuda"
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pin)
    dev = torch.empty(nbytes, dtype=torch.uint8, device=device)
    host_small = torch.empty(64, dtype=torch.uint8, pin_memory=pin)
    dev_small = torch.empty(64, dtype=torch.uint8, device=device)
    host.fill_(1)
    dev.fill_(2)
    _time_copy(dev, host, device, 2)  # warm the copy path (page faults, driver)
    latency = min(
        _time_copy(dev_small, host_small, device, repeats), _time_copy(host_small, dev_small, device, repeats)
    )
    h2d = _time_copy(dev, host, device, repeats)
    d2h = _time_copy(host, dev, device, repeats)
    # The bandwidth is what is left after the fixed cost; a floor keeps a noisy tiny copy from dividing by ~0.
    return CopySpeed(
        h2d_bytes_per_s=nbytes / max(h2d - latency, h2d * 0.5),
        d2h_bytes_per_s=nbytes / max(d2h - latency, d2h * 0.5),
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
