"""The whole-step measurement (memsched.runtime.memory) is exact on a hand-built step whose peak is known."""

from __future__ import annotations

import gc

import pytest
import torch

from memsched.runtime.memory import (
    CPU_SOURCE,
    CUDA_SOURCE,
    MemoryMeter,
    live_tensor_bytes,
    measure_step_memory,
    peak_source,
)

MiB = 1 << 20
CPU = torch.device("cpu")


def _elsewhere() -> int:
    """CPU bytes the rest of the process holds before a test builds its step (other tests' caches: Dynamo's
    keeps some of its compiled code's tensors). The meter counts every live tensor, so the tests add these."""
    gc.collect()
    return live_tensor_bytes(CPU)


class _HandBuilt:
    """A 'training step' that is a known sequence of allocations and frees (sizes in MiB):

    live at the step boundary: w 1 + w.grad 1 + persistent 2 = 4
    zero_grad (set_to_none)     -1  -> 3   (a free of a tensor allocated before the measured step)
    stage A: a +3, b +5         -> 11
    del a                       -> 8
    stage B: c +4               -> 12      <- the peak
    del b, c                    -> 3
    new grad +1                 -> 4
    """

    def __init__(self) -> None:
        self.w = torch.zeros(MiB // 4, requires_grad=True)
        self.w.grad = torch.zeros(MiB // 4)
        self.persistent = torch.zeros(2 * MiB, dtype=torch.uint8)
        self.meter: MemoryMeter | None = None

    def mark(self, stage: str) -> None:
        if self.meter is not None:
            self.meter.mark(stage)

    def step(self) -> None:
        self.w.grad = None
        self.mark("A")
        a = torch.empty(3 * MiB, dtype=torch.uint8)
        b = torch.empty(5 * MiB, dtype=torch.uint8)
        del a
        self.mark("B")
        c = torch.empty(4 * MiB, dtype=torch.uint8)
        del b, c
        self.w.grad = torch.ones(MiB // 4)


def test_cpu_measurement_is_exact_on_a_hand_built_step() -> None:
    base = _elsewhere()
    model = _HandBuilt()
    model.step()  # warm-up
    meter = MemoryMeter(CPU)
    model.meter = meter
    m = meter.measure(model.step)
    assert m.source == CPU_SOURCE
    assert m.start_bytes == base + 4 * MiB  # w, its gradient, the persistent buffer (every tensor Python holds)
    assert m.peak_bytes == base + 12 * MiB
    assert m.end_bytes == base + 4 * MiB
    assert m.stage_peak_bytes == {"pre": base + 4 * MiB, "A": base + 11 * MiB, "B": base + 12 * MiB}
    assert m.stage_order == ["pre", "A", "B"]


def test_the_measurement_repeats_exactly() -> None:
    base = _elsewhere()
    model = _HandBuilt()
    model.step()
    peaks = {measure_step_memory(model.step, CPU).peak_bytes for _ in range(3)}
    assert peaks == {base + 12 * MiB}


def test_host_copies_are_reported_apart() -> None:
    """Host buffers (the offload pool's) are not device bytes: neither those alive at the start nor one the
    step allocates count toward the peak; their resident size is host_bytes."""
    base = _elsewhere()
    held: list[torch.Tensor] = [torch.zeros(3 * MiB, dtype=torch.uint8)]
    dev = torch.zeros(MiB, dtype=torch.uint8)

    def step() -> None:
        if len(held) < 2:
            held.append(torch.zeros(2 * MiB, dtype=torch.uint8))  # the pool grows during the step
        x = torch.empty(4 * MiB, dtype=torch.uint8)
        del x

    m = measure_step_memory(step, CPU, prime=lambda: None, host_tensors=lambda: list(held))
    assert m.host_bytes == 5 * MiB
    assert m.start_bytes == base + dev.untyped_storage().nbytes()
    assert m.peak_bytes == base + 5 * MiB  # dev 1 + x 4


def test_one_function_two_sources() -> None:
    assert peak_source(CPU) == CPU_SOURCE
    assert peak_source(torch.device("cuda")) == CUDA_SOURCE


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_source_agrees_with_the_hand_built_peak() -> None:
    dev = torch.device("cuda")
    meter = MemoryMeter(dev)
    keep = torch.zeros(MiB, dtype=torch.uint8, device=dev)

    def step() -> None:
        meter.mark("A")
        a = torch.empty(3 * MiB, dtype=torch.uint8, device=dev)
        meter.mark("B")
        b = torch.empty(5 * MiB, dtype=torch.uint8, device=dev)
        del a, b

    m = meter.measure(step)
    assert m.source == CUDA_SOURCE and keep.numel() == MiB
    assert m.peak_bytes - m.start_bytes == 8 * MiB
    assert m.stage_peak_bytes["B"] - m.start_bytes == 8 * MiB
