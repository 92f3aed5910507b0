"""Trace a model: the use case behind `memsched trace` (the runtime's tracer over a built-in model or a
factory, docs/factory.md), so that the CLI imports only the service layer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from memsched.errors import MemschedError

if TYPE_CHECKING:
    from memsched.schema import Trace


@dataclass
class TraceRun:
    """A trace and what the tracer noticed while recording it."""

    trace: Trace
    """The recorded trace."""
    model_id: str
    """The workload's model id (the default file name)."""
    warnings: list[str]
    """The tracer's warnings (times that do not add up, bytes no layer owns, ...)."""
    unowned_bytes: int
    """Bytes saved between the traced layers, which no schedule moves."""


def trace_model(
    model: str,
    *,
    layer_pattern: list[str] | None = None,
    steps: int = 5,
    warmup: int = 2,
    threads: int | None = None,
    device: str | None = None,
    **workload_flags: Any,
) -> TraceRun:
    """Build the workload (`model`: a built-in name or package.module:factory; `workload_flags` only those the
    user gave: a factory gets no CLI default), check the run's settings, and trace `steps` training steps."""
    import torch

    from memsched.runtime import workload
    from memsched.runtime.tracer import trace_workload

    if steps < 1 or warmup < 0:
        raise MemschedError(f"--steps must be >= 1 and --warmup >= 0 (got {steps}, {warmup})")
    if threads is not None:
        if threads < 1:
            raise MemschedError(f"--threads must be >= 1, got {threads}")
        torch.set_num_threads(threads)
    if device is not None and device.startswith("cuda") and not torch.cuda.is_available():
        raise MemschedError(f"--device {device}: CUDA is not available on this machine; use --device cpu")
    try:
        torch.device(device or "cpu")
    except RuntimeError:
        raise MemschedError(f"--device {device!r} is not a device; use cpu or cuda[:N]") from None
    w = workload(model, strict=True, device=device, **workload_flags)
    tr, report = trace_workload(w, layers=layer_pattern, steps=steps, warmup=warmup)
    return TraceRun(tr, w.model_id, list(report.warnings), report.unowned_bytes)


def dtype_name(dtype: str) -> str:
    """The canonical name of a dtype flag (bf16 -> bfloat16); MemschedError for one that is not supported."""
    from memsched.runtime.models import parse_dtype

    return str(parse_dtype(dtype)).removeprefix("torch.")
