"""Helpers the tests import (`from helpers import ...`; pytest's `pythonpath` puts tests/ on the path): tiny
hand-built traces whose numbers are easy to compute by hand, and the shared PipeDream profiles."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import pytest

from memsched.schema import Baseline, DeviceInfo, Layer, StaticBytes, Trace

SHARED = Path(os.environ.get("MEMSCHED_SHARED", Path(__file__).resolve().parents[3] / "shared"))
PIPEDREAM = SHARED / "data" / "pipedream"


def tiny_trace(
    forward: Sequence[float],
    backward: Sequence[float],
    saved: Sequence[int | Sequence[int]],
    output: Sequence[int] | None = None,
    inputs: Sequence[int] | None = None,
    workspace: Sequence[int] | None = None,
    deps: Sequence[Sequence[int]] | None = None,
    static: int = 0,
    bandwidth: float = 100.0,
    latency: float = 0.0,
    other_s: float = 0.0,
) -> Trace:
    """A trace of len(forward) layers; a chain unless deps are given. Copies move `bandwidth` bytes/s."""
    n = len(forward)
    layers = []
    for i in range(n):
        s = saved[i]
        tensors = [int(s)] if isinstance(s, int) else [int(x) for x in s]
        layers.append(
            Layer(
                name=f"layer{i}",
                kind="Test",
                forward_s=forward[i],
                backward_s=backward[i],
                saved_bytes=sum(tensors),
                saved_tensor_bytes=tensors if len(tensors) > 1 else [],
                output_bytes=output[i] if output else 0,
                input_bytes=inputs[i] if inputs else 0,
                workspace_bytes=workspace[i] if workspace else 0,
                deps=list(deps[i]) if deps is not None else ([i - 1] if i else []),
            )
        )
    return Trace(
        model="tiny",
        batch_size=1,
        device=DeviceInfo(
            name="test",
            memory_bytes=10**9,
            h2d_bytes_per_s=bandwidth,
            d2h_bytes_per_s=bandwidth,
            copy_latency_s=latency,
        ),
        static=StaticBytes(params=static),
        baseline=Baseline(step_s=sum(forward) + sum(backward) + other_s, peak_bytes=0),
        layers=layers,
    )


def require_pipedream() -> Path:
    if not PIPEDREAM.is_dir():
        pytest.skip(f"the shared PipeDream profiles are not at {PIPEDREAM} (set MEMSCHED_SHARED to the shared/ folder)")
    return PIPEDREAM
