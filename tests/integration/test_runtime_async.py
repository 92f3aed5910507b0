"""The stream/event protocol of the CUDA path, checked on the CPU: copies run late on worker threads (one per
direction, FIFO like a stream) and complete only when their event says so. If the runtime read a host buffer
before its offload finished, dropped device memory before its copy, reused a pooled buffer too early or let an
unpack skip its own event, gradients would differ."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch
from test_runtime_support import assert_bitwise, grads, schedule_of, tiny

from memsched.optimizer.baselines import offload_all_overlapped
from memsched.optimizer.decisions import offload_all
from memsched.runtime import apply_schedule, trace
from memsched.runtime.copier import Copier, _as_bytes


class ThreadEvent:
    """A CUDA-event stand-in: query() without blocking, synchronize() blocks."""

    def __init__(self) -> None:
        self._done = threading.Event()

    def set(self) -> None:
        self._done.set()

    def query(self) -> bool:
        return self._done.is_set()

    def synchronize(self) -> None:
        self._done.wait()


class LateCopier(Copier):
    """Every copy starts after `delay_s` on its direction's single worker thread."""

    def __init__(self, delay_s: float = 0.002) -> None:
        super().__init__(torch.device("cpu"))
        self.delay_s = delay_s
        self.d2h_q = ThreadPoolExecutor(1)
        self.h2d_q = ThreadPoolExecutor(1)
        self.waits = 0

    def _later(self, q: ThreadPoolExecutor, dst: torch.Tensor, src: torch.Tensor) -> ThreadEvent:
        ev = ThreadEvent()

        def run() -> None:
            time.sleep(self.delay_s)
            dst.copy_(src)
            ev.set()

        q.submit(run)
        return ev

    def offload(self, storage: torch.UntypedStorage, host: torch.Tensor) -> Any:
        host.fill_(0xAB)  # garbage until the copy lands: reading it early shows up in the gradients
        return self._later(self.d2h_q, host, _as_bytes(storage, self.device))

    def prefetch(self, host: torch.Tensor) -> tuple[torch.Tensor, Any]:
        dst = torch.full((host.numel(),), 0xCD, dtype=torch.uint8)
        return dst, self._later(self.h2d_q, dst, host)

    def wait(self, event: Any) -> None:
        if event is not None:
            self.waits += 1
            event.synchronize()


def _run(w, sched, tr, steps=3):
    with apply_schedule(w.model, sched, trace=tr) as sm:
        sm.copier = copier = LateCopier()
        outs = [grads(w, sm) for _ in range(steps)]
        stats = sm.pool_stats()
    return outs, stats, copier


def test_late_copies_give_identical_gradients():
    w = tiny("gpt2", layers=4)
    tr = trace(w.model, w.step, steps=1, warmup=0, batch_size=2, seq_len=32, measure_bandwidth=False)
    _, ref = grads(w)
    # Overlapped (done-by and prefetch one layer later) and the latest possible timing (prefetch at the
    # layer's own backward stage, release at the last forward stage).
    for decisions in (offload_all_overlapped(tr), [offload_all(tr, i, tr.n - 1, i) for i in range(tr.n)]):
        outs, stats, copier = _run(w, schedule_of(tr, decisions), tr)
        for _, got in outs:
            assert_bitwise(got, ref)
        assert copier.waits > 0
        n_tensors = sum(len(layer.tensors) for layer in tr.layers)
        assert stats.allocated_buffers == n_tensors  # pending buffers were waited for, not duplicated
        assert stats.in_use_buffers == 0
