"""A small synthetic trace: the OpenAPI examples show it, and the tests and docs post it."""

from __future__ import annotations

from typing import Any

from memsched.schema import Baseline, DeviceInfo, Layer, StaticBytes, Trace


def synthetic_trace(n_layers: int = 3, model: str = "synthetic/mlp", scale: int = 1) -> Trace:
    """A chain of `n_layers` linear layers with growing costs; `scale` multiplies every byte count, so
    different scales give different traces (and content hashes) of the same shape."""
    layers = [
        Layer(
            name=f"layers.{i}",
            kind="Linear",
            forward_s=0.001 * (i + 1),
            backward_s=0.002 * (i + 1),
            saved_bytes=1_000_000 * (i + 1) * scale,
            saved_tensor_bytes=[500_000 * (i + 1) * scale] * 2,
            input_bytes=100_000 * scale,
            output_bytes=100_000 * scale,
            workspace_bytes=10_000 * scale,
            deps=[i - 1] if i else [],
        )
        for i in range(n_layers)
    ]
    trace = Trace(
        model=model,
        batch_size=8,
        source="synthetic",
        # A stand-in accelerator (copies beside compute at 10 GB/s), not the CPU: every action is open to it.
        device=DeviceInfo(name="synthetic accelerator", memory_bytes=2**30, h2d_bytes_per_s=1e10, d2h_bytes_per_s=1e10),
        static=StaticBytes(params=10_000_000),
        # At least the layers' own time (the schema checks it), with room for a head and an optimizer step.
        baseline=Baseline(step_s=max(0.05, 1.25 * sum(x.forward_s + x.backward_s for x in layers)), peak_bytes=0),
        layers=layers,
    )
    # Synthetic: nothing was measured, so the in-core peak is the cost model's own (a measured peak above it
    # would be read as unattributed memory at the loss; see docs/cost-model.md).
    from memsched.service import keepall_activation_peak

    trace.baseline.peak_bytes = trace.static.total + keepall_activation_peak(trace)
    return trace


EXAMPLE_TRACE: dict[str, Any] = synthetic_trace(3).model_dump(mode="json")
