"""A steady CPU allocator for timing: freed memory stays with the process, as CUDA's caching allocator keeps it.

PyTorch's CPU tensors come from glibc's malloc. By default glibc gives memory back to the kernel (it trims the
heap top once more than a dynamically chosen threshold is free, and serves large requests with mmap/munmap),
and the next step faults the same pages in again, a page at a time, zeroed by the kernel. How much a step
faults depends on where its blocks happen to land, which depends on everything else the step holds, so it
changes with the schedule. Measured on the demo (GPT-2 small, 6 blocks, batch 8, one thread): keep-all steps
faulted 0-8,400 pages each (0-31 ms of system time on a 160 ms step), the scheduled step of the same model
about none (its pooled host buffers pin the heap), so keep-all could measure slower than a plan that offloads
half its activations. Neither the cost model nor a GPU pays this: the CUDA caching allocator keeps freed
blocks. With the heap kept (`steady_host_allocator`) both sides fault nothing after warm-up.

Blocks above glibc's largest mmap threshold (32 MiB on 64-bit) used to be mapped and unmapped per use: the
optimizer step's temporaries, embedding gradients, logits. On GPT-2 (seq 512, one thread) that was 200,000-
300,000 page faults and 0.5-1.3 s of system time in every 6.0-6.8 s step, varying from step to step by more
than the overheads being measured. So mmap is now off altogether (M_MMAP_MAX 0): every block comes from the
heap, which is never trimmed, and after warm-up a step faults nothing (the same steps: 5.52-5.59 s, no system
time). The cost is that the process keeps its peak heap, as the CUDA caching allocator keeps its peak.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import platform

log = logging.getLogger(__name__)

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_MMAP_MAX = -4
MMAP_THRESHOLD_BYTES = 32 << 20
"""glibc's largest accepted M_MMAP_THRESHOLD on 64-bit (4 * 1024 * 1024 * sizeof(long))."""
TRIM_THRESHOLD_BYTES = 2**31 - 1
"""Never trim the heap top (mallopt takes an int)."""

_state: dict[str, bool] = {}
"""'applied': whether the settings are in effect, once tried (mallopt is process-wide: tried once)."""


def steady_host_allocator() -> bool:
    """Keep freed host memory in the process (glibc: no heap trimming, no mmap). Idempotent;
    process-wide and not undone (it only changes when pages return to the kernel, never what is allocated).

    Returns whether it is in effect: False on a C library other than glibc (then step times on the CPU
    include page faults that depend on the schedule; logged once)."""
    if "applied" in _state:
        return _state["applied"]
    _state["applied"] = False
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        log.info("steady host allocator: not glibc (%s); CPU step times include page faults", platform.libc_ver())
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        ok = libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1
        ok = libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES) == 1 and ok
        ok = libc.mallopt(_M_MMAP_MAX, 0) == 1 and ok
    except (OSError, AttributeError) as e:
        log.info("steady host allocator: mallopt unavailable (%s); CPU step times include page faults", e)
        return False
    if not ok:
        log.warning("steady host allocator: glibc refused mallopt; CPU step times include page faults")
    _state["applied"] = ok
    return ok
