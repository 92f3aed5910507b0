"""Synthetic traces for tests and benchmarks: random chains and DAGs of n layers, reproducible from a seed.

The numbers are shaped like a CNN/transformer step on a PCIe-attached GPU: forward 0.2-3 ms per layer,
backward about twice the forward, saved bytes 1-64 MiB split into 1-3 tensors, copies at 12 GB/s, so that
an offload takes about as long as a few layers of compute and the choice between hiding a copy and
recomputing is a real one.
"""

from __future__ import annotations

import random

from memsched.schema import Baseline, DeviceInfo, Layer, StaticBytes, Trace

MIB = 2**20


def make_trace(
    n: int,
    seed: int,
    dag: bool = False,
    max_tensors: int = 3,
    bandwidth: float = 12e9,
    copy_latency_s: float = 10e-6,
    static_bytes: int = 512 * MIB,
    unit_bytes: int = MIB,
) -> Trace:
    """A random trace of `n` layers.

    `dag=True` adds skip connections (each layer after the second consumes, with probability 0.3, one
    earlier output besides its predecessor's), so that one output can feed several later layers.
    Sizes are whole multiples of `unit_bytes` (MiB by default), which keeps hand-checkable numbers and lets
    the integer-scaled CP-SAT model represent bytes exactly.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    rng = random.Random(seed)
    layers: list[Layer] = []
    for i in range(n):
        fwd = rng.uniform(0.2e-3, 3e-3)
        bwd = fwd * rng.uniform(1.5, 2.5)
        k = rng.randint(1, max_tensors)
        tensors = [rng.randint(1, 64 // k + 1) * unit_bytes for _ in range(k)]
        if rng.random() < 0.1:
            tensors = []  # a layer that saves nothing (an add, a view)
        out = rng.randint(1, 32) * unit_bytes
        deps: list[int] = [i - 1] if i > 0 else []
        if dag and i >= 2 and rng.random() < 0.3:
            deps.insert(0, rng.randrange(0, i - 1))
        layers.append(
            Layer(
                name=f"layer{i}",
                kind="synthetic",
                forward_s=fwd,
                backward_s=bwd,
                saved_bytes=sum(tensors),
                saved_tensor_bytes=tensors,
                input_bytes=sum(layers[d].output_bytes for d in deps) if deps else out,
                output_bytes=out,
                workspace_bytes=rng.randint(0, 8) * unit_bytes,
                deps=deps,
            )
        )
    step = sum(x.forward_s + x.backward_s for x in layers) * 1.05
    return Trace(
        model=f"synthetic/{'dag' if dag else 'chain'}-{n}-s{seed}",
        batch_size=1,
        source="synthetic",
        device=DeviceInfo(
            name="synthetic",
            memory_bytes=80 * 2**30,
            h2d_bytes_per_s=bandwidth,
            d2h_bytes_per_s=bandwidth,
            copy_latency_s=copy_latency_s,
        ),
        static=StaticBytes(params=static_bytes),
        baseline=Baseline(step_s=step, peak_bytes=0),
        layers=layers,
    )


__all__ = ["make_trace"]
