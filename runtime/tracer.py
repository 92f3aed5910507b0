"""The tracer: run a few real training steps and write a Trace (docs/architecture.md, 'Trace').

Three kinds of step, so that instrumentation never inflates what it measures:
1. plain steps: warm-up, then the baseline step time (median);
2. timing steps: per-layer forward time (around the layer's forward) and backward time (from the moment the
   layer's output gradient is complete to the moment its input gradient is), medians over the steps;
3. one memory step, measured whole (memsched.runtime.memory: every live tensor byte, the CUDA allocator or
   the CPU allocator's events; the same function on both): saved tensors (saved_tensors_hooks; deduplicated
   by storage; attributed to the innermost traced layer whose forward saved them first; parameters and buffers
   excluded: they are static), input and output bytes, DAG edges from storage identity between a layer's
   outputs and later layers' inputs, the keep-all whole-step peak (the baseline peak) and the peak within each
   stage. What a stage holds beyond the layer model (static + saved bytes so far + the layer's output and
   input gradient) is the layer's workspace; the memory outside the layers goes to the stage it is live in
   (`fit_workspace`), so the simulator's keep-all peak is the measured one on both devices.
"""

from __future__ import annotations

import logging
import statistics
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from memsched.errors import MemschedError
from memsched.runtime.checkpointing import flatten
from memsched.runtime.clock import Clock, time_steps
from memsched.runtime.device import device_memory, device_name, framework_versions, measure_runtime_copy_speed
from memsched.runtime.hostalloc import steady_host_allocator
from memsched.runtime.layers import find_layers
from memsched.runtime.memory import PRE, MemoryMeter, StepMemory
from memsched.runtime.storage import StaticStorages, local_tensor, storage_key, storage_nbytes, tensor_nbytes
from memsched.runtime.wrapping import wrapped
from memsched.schema import Baseline, DeviceInfo, Layer, StaticBytes, Trace

log = logging.getLogger(__name__)

StepFn = Callable[[], Any]


@dataclass
class _LayerStats:
    """What the memory step and the timing steps saw for one layer."""

    name: str
    """Module path."""
    kind: str
    """Module class name."""
    saved: list[int] = field(default_factory=list)
    """Storage sizes of the tensors it saved first, in save order."""
    input_bytes: int = 0
    """Bytes of its tensor inputs that require grad (their gradients are produced in backward)."""
    output_bytes: int = 0
    """Bytes of its tensor outputs."""
    deps: set[int] = field(default_factory=set)
    """Call-order indices of the layers whose outputs it consumed."""
    forward_s: list[float] = field(default_factory=list)
    """Forward time per timing step."""
    backward_s: list[float] = field(default_factory=list)
    """Backward time per timing step."""
    shared: int = 0
    """Bytes of storages it saved that an earlier layer saved first (attributed there)."""


def _input_tensors(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[torch.Tensor]:
    return [t for _, t in flatten((args, kwargs))]


def _unique_bytes(tensors: Sequence[torch.Tensor]) -> int:
    seen: set[tuple[str, int]] = set()
    total = 0
    for t in tensors:
        k = storage_key(t)
        if k not in seen:
            seen.add(k)
            total += tensor_nbytes(t)
    return total


class _MemoryStep:
    """Instrumentation of the one memory step: attribution of saved tensors, inputs, outputs, edges and the
    stage marks of the whole-step meter (F_i when layer i's forward starts, B_i when its output gradient is
    complete)."""

    def __init__(
        self,
        model: nn.Module,
        stats: list[_LayerStats],
        modules: Sequence[nn.Module],
        meter: MemoryMeter,
    ) -> None:
        self.static = StaticStorages().add_module(model)
        self.modules = modules
        self.stats = stats
        self.meter = meter
        self.stack: list[int] = []
        self.claims: dict[int, weakref.ref[torch.UntypedStorage]] = {}
        self.producers: dict[int, tuple[int, weakref.ref[torch.UntypedStorage]]] = {}
        self.order: list[int] = []
        self.outside: dict[int, tuple[weakref.ref[torch.UntypedStorage], int]] = {}
        self.bwd_marked: set[int] = set()
        self.owner: dict[int, int] = {}  # id(storage) -> the layer that saved it first
        self.shared_seen: set[tuple[int, int]] = set()

    def pack(self, x: torch.Tensor) -> torch.Tensor:
        if isinstance(x, torch.Tensor) and x not in self.static:
            self._note(x)
        # Detached: the packed tensor must not point back at its own grad_fn (see replay._keep).
        return x.detach() if isinstance(x, torch.Tensor) and x.grad_fn is not None else x

    def _note(self, x: torch.Tensor) -> None:
        s = x.untyped_storage()
        if not self.stack:
            # Saved outside every traced layer, before the first one runs (embeddings): no schedule moves it
            # and it lives until the end of the backward, so it is static memory (StaticBytes.other), once
            # per storage. What is saved outside the layers later (the head, the loss) lives only around
            # the loss: the whole-step fit places it there (`fit_workspace`).
            if self.order:
                return
            claim, hit = self.claims.get(id(s)), self.outside.get(id(s))
            if (claim is None or claim() is not s) and (hit is None or hit[0]() is not s):
                self.outside[id(s)] = (weakref.ref(s), storage_nbytes(x))
            return
        ref = self.claims.get(id(s))
        if ref is not None and ref() is s:
            # Counted once, for the layer that saved it first. A later layer saving it too (ResNet: a block's
            # last ReLU output is the next block's input) needs it back at its own backward, before the first
            # layer's: if that layer offloads it, it returns early. Noted for the workspace (`fit_workspace`).
            first, me = self.owner[id(s)], self.stack[-1]
            if first != me and first not in self.stack and (id(s), me) not in self.shared_seen:
                self.shared_seen.add((id(s), me))
                self.stats[me].shared += storage_nbytes(x)
            return
        hit = self.outside.pop(id(s), None)
        if hit is not None and hit[0]() is not s:
            self.outside[id(s)] = hit  # another (dead) storage had this id: keep its entry
        self.claims[id(s)] = weakref.ref(s)
        self.owner[id(s)] = self.stack[-1]
        self.stats[self.stack[-1]].saved.append(storage_nbytes(x))

    # LayerCalls (memsched.runtime.wrapping): around each traced layer's forward.

    def enter(self, i: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        st = self.stats[i]
        if i not in self.order:
            self.order.append(i)
        self.meter.mark(f"F{i}")
        self.static.add_module(self.modules[i])  # parameters gathered just in time (FSDP)
        inputs = _input_tensors(args, kwargs)
        st.input_bytes = _unique_bytes([t for t in inputs if t.requires_grad])
        for t in inputs:
            hit = self.producers.get(id(t.untyped_storage()))
            if hit is not None and hit[1]() is t.untyped_storage() and hit[0] != i:
                st.deps.add(hit[0])
        self.stack.append(i)

    def leave(self, i: int, token: None, out: Any) -> None:
        self.stack.pop()
        self.meter.mark(f"F{i}:end")  # after the last layer: the loss's stage, apart (`fit_workspace`)
        outs = [t for _, t in flatten(out)]
        self.stats[i].output_bytes = _unique_bytes(outs)
        for t in outs:
            s = t.untyped_storage()
            self.producers[id(s)] = (i, weakref.ref(s))
            if t.requires_grad:
                t.register_hook(self._backward_mark(i))

    def fail(self, i: int, token: None) -> None:
        self.stack.pop()

    def _backward_mark(self, i: int) -> Callable[[torch.Tensor], None]:
        def on_grad(_g: torch.Tensor) -> None:
            if i not in self.bwd_marked:
                self.bwd_marked.add(i)
                self.meter.mark(f"B{i}")

        return on_grad


class _TimingStep:
    """Instrumentation of the timing steps: forward around the call, backward between gradient hooks."""

    def __init__(self, stats: list[_LayerStats], clock: Clock) -> None:
        self.stats = stats
        self.clock = clock
        self.marks: list[tuple[int, str, Any]] = []

    # LayerCalls (memsched.runtime.wrapping): around each traced layer's forward.

    def _grad_mark(self, i: int, kind: str, fired: set[str]) -> Callable[[torch.Tensor], None]:
        def on_grad(_g: torch.Tensor) -> None:
            if kind not in fired:
                fired.add(kind)
                self.marks.append((i, kind, self.clock.mark()))

        return on_grad

    def enter(self, i: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, set[str]]:
        fired: set[str] = set()
        for t in _input_tensors(args, kwargs):
            if t.requires_grad:
                t.register_hook(self._grad_mark(i, "bwd_end", fired))
        return self.clock.mark(), fired

    def leave(self, i: int, token: tuple[Any, set[str]], out: Any) -> None:
        b = self.clock.mark()
        a, fired = token
        self.marks.append((i, "fwd", (a, b)))
        for _, t in flatten(out):
            if t.requires_grad:
                t.register_hook(self._grad_mark(i, "bwd_start", fired))

    def fail(self, i: int, token: tuple[Any, set[str]]) -> None:
        return None

    def collect(self) -> None:
        """After a step: turn the marks into per-layer times."""
        self.clock.finish()
        fwd: dict[int, float] = {}
        start: dict[int, Any] = {}
        end: dict[int, Any] = {}
        seq: list[tuple[int, str, Any]] = []
        for i, kind, tok in self.marks:
            if kind == "fwd":
                fwd[i] = fwd.get(i, 0.0) + self.clock.seconds(*tok)
            elif kind == "bwd_start":
                start.setdefault(i, tok)
                seq.append((i, kind, tok))
            else:
                end.setdefault(i, tok)
        # A layer's backward ends when its input gradient is complete or, failing a hook there (an input
        # that does not require grad), when the next layer's backward starts.
        starts = [(i, tok) for i, kind, tok in seq]
        for k, (i, tok) in enumerate(starts):
            stop = end.get(i)
            if stop is None and k + 1 < len(starts):
                stop = starts[k + 1][1]
            if stop is not None:
                self.stats[i].backward_s.append(max(self.clock.seconds(tok, stop), 0.0))
        for i, s in fwd.items():
            self.stats[i].forward_s.append(s)
        self.marks.clear()


def _dtype_name(model: nn.Module) -> str:
    counts: dict[torch.dtype, int] = {}
    for p in model.parameters():
        counts[p.dtype] = counts.get(p.dtype, 0) + p.numel()
    dt = max(counts, key=counts.__getitem__) if counts else torch.float32
    return str(dt).removeprefix("torch.")


def static_bytes(model: nn.Module, optimizer: torch.optim.Optimizer | None) -> StaticBytes:
    """Parameters, their gradients (dense training: one per trainable parameter), optimizer state, buffers.
    (The tracer adds the tensors saved outside the traced layers to `other`.)"""
    seen: set[tuple[str, int]] = set()
    params = grads = 0
    for p in map(local_tensor, model.parameters()):
        k = storage_key(p)
        if k in seen:
            continue  # tied weights (GPT-2's lm_head and wte) are one allocation
        seen.add(k)
        params += storage_nbytes(p)
        if p.requires_grad:
            grads += storage_nbytes(p)
    state = 0
    if optimizer is not None:
        state_seen: set[tuple[str, int]] = set()
        for st in optimizer.state.values():
            for v in st.values():
                if isinstance(v, torch.Tensor) and v.device.type != "meta":
                    k = storage_key(v)
                    if k not in state_seen:
                        state_seen.add(k)
                        state += storage_nbytes(v)
    buffers = 0
    for b in map(local_tensor, model.buffers()):
        k = storage_key(b)
        if k not in seen:
            seen.add(k)
            buffers += storage_nbytes(b)
    return StaticBytes(params=params, grads=grads, optimizer_state=state, other=buffers)


def fit_workspace(layers: Sequence[_LayerStats], static_total: int, whole: StepMemory) -> list[int]:
    """Per layer (forward order): the bytes its stages held beyond the layer model, never negative.

    The layer model of keep-all stage memory (docs/cost-model.md, 'Memory') is static + the saved bytes of
    layers 0..i + the layer's output (F_i) and also its input gradient (B_i) + its workspace. The workspace is
    what the measured stage peak needs on top, the larger of F_i's and B_i's need. The memory outside the
    layers goes to the stage it is live in: before F_0 (zero_grad, embeddings) to F_0's; between two layers'
    forwards to the earlier one's; after B_0 (the embedding's backward, the optimizer step) to B_0's.

    From the end of the last forward to B_{n-1} (head, logits, loss: 'F{n-1}:end') is the loss point, a
    moment of its own in the cost model. When it is the step's peak, its bytes stay out of the last layer's
    workspace: the simulator takes the loss's bytes from the measured peak (`unattributed_bytes`) and holds
    them at the loss point only, beside what is held across it. Folded into the last layer's workspace they
    would be charged beside a recomputed last layer's own saved bytes (gone by then) and in B_{n-1} (the loss
    is freed by then): 75 MiB too much at B_{n-1} on GPT-2 (6 x 384, batch 4 x 256). When the loss point is
    not the peak the simulator could not recover its bytes, so they are folded in (an upper bound).

    A storage the layer saves that an earlier layer saved first is added on top (see `_MemoryStep._note`).
    All of it is decision-independent."""
    peaks = whole.stage_peak_bytes
    n = len(layers)
    loss_key = f"F{n - 1}:end"
    loss_peak = peaks.get(loss_key, 0)
    loss_apart = loss_peak > max((v for k, v in peaks.items() if k != loss_key), default=0)
    prefix = 0
    out = []
    for i, st in enumerate(layers):
        prefix += sum(st.saved)
        fwd = [peaks.get(f"F{i}", 0)] + ([peaks.get(PRE, 0)] if i == 0 else [])
        if i < n - 1 or not loss_apart:
            fwd.append(peaks.get(f"F{i}:end", 0))
        bwd = [peaks.get(f"B{i}", 0)] + ([peaks.get("optimizer", 0)] if i == 0 else [])
        need_f = max(fwd) - static_total - prefix - st.output_bytes
        need_b = max(bwd) - static_total - prefix - st.output_bytes - st.input_bytes
        # A storage an earlier layer saved first and this one saves too comes back at this layer's backward
        # if the earlier layer offloads it: held here on top, so an offload of it never under-counts B_i.
        out.append(max(0, need_f, need_b) + st.shared)
    assert len(out) == n
    return out


def _time_layers(
    step_fn: StepFn, modules: Sequence[nn.Module], stats: list[_LayerStats], clock: Clock, steps: int
) -> None:
    """Timing steps: per-layer forward and backward times into `stats`."""
    timing = _TimingStep(stats, clock)
    with wrapped(modules, timing):
        for _ in range(steps):
            step_fn()
            timing.collect()


def _memory_step(
    model: nn.Module,
    step_fn: StepFn,
    modules: Sequence[nn.Module],
    stats: list[_LayerStats],
    device: torch.device,
    optimizer: torch.optim.Optimizer | None,
) -> tuple[_MemoryStep, StepMemory]:
    """One instrumented step, measured whole (after a plain priming step on the CPU)."""
    meter = MemoryMeter(device)
    mem = _MemoryStep(model, stats, modules, meter)
    handle = optimizer.register_step_pre_hook(lambda *_a: meter.mark("optimizer")) if optimizer is not None else None

    def instrumented() -> None:
        with wrapped(modules, mem), torch.autograd.graph.saved_tensors_hooks(mem.pack, lambda x: x):
            step_fn()

    try:
        whole = meter.measure(instrumented, prime=step_fn)
    finally:
        if handle is not None:
            handle.remove()
    missing = [stats[i].name for i in range(len(stats)) if i not in mem.order]
    if missing:
        raise MemschedError(
            f"layers: {missing[:3]} never ran during the step; check the layer patterns or the step function"
        )
    return mem, whole


def _layers(stats: list[_LayerStats], order: list[int], workspace: list[int]) -> list[Layer]:
    """The trace's layers in forward order, with registration-order deps renumbered."""
    pos = {orig: k for k, orig in enumerate(order)}  # registration index -> forward index
    out = []
    for k, orig in enumerate(order):
        st = stats[orig]
        if not st.forward_s or not st.backward_s:
            raise MemschedError(
                f"layer {st.name!r}: no {'forward' if not st.forward_s else 'backward'} time was measured; "
                "the step function must run forward and backward through the model"
            )
        out.append(
            Layer(
                name=st.name,
                kind=st.kind,
                forward_s=statistics.median(st.forward_s),
                backward_s=statistics.median(st.backward_s),
                saved_bytes=sum(st.saved),
                saved_tensor_bytes=list(st.saved),
                input_bytes=st.input_bytes,
                output_bytes=st.output_bytes,
                workspace_bytes=workspace[k],
                deps=sorted(pos[d] for d in st.deps if pos[d] < pos[orig]),
            )
        )
    return out


def _device_info(device: torch.device, measure_bandwidth: bool, layers: Sequence[_LayerStats]) -> DeviceInfo:
    """The device, with copy speeds measured through the runtime's offload path on the saved tensors of the
    median layer (by saved bytes): the sizes a schedule moves."""
    speed = None
    if measure_bandwidth:
        typical = sorted(layers, key=lambda st: sum(st.saved))[len(layers) // 2]
        speed = measure_runtime_copy_speed(device, typical.saved)
    return DeviceInfo(
        name=device_name(device),
        memory_bytes=device_memory(device),
        h2d_bytes_per_s=speed.h2d_bytes_per_s if speed else 1e10,
        d2h_bytes_per_s=speed.d2h_bytes_per_s if speed else 1e10,
        copy_latency_s=speed.latency_s if speed else 0.0,
        # On the CPU a copy is a memcpy on the compute thread: nothing overlaps it.
        concurrent_copies=device.type == "cuda",
    )


def trace(
    model: nn.Module,
    step_fn: StepFn,
    *,
    layers: Sequence[str] | None = None,
    steps: int = 5,
    warmup: int = 2,
    model_id: str | None = None,
    batch_size: int = 1,
    seq_len: int | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    measure_bandwidth: bool = True,
) -> Trace:
    """Trace `model` by running `step_fn()` (one whole training step: forward, backward, optimizer step)
    warmup + 2 * steps + 2 times. Layers are the repeated blocks, or the modules whose names match `layers`
    (regexes). Times are medians over `steps` steps after the warm-up; memory is one whole measured step.
    On the CPU (glibc) it keeps freed memory in the process from then on, heap untrimmed and no mmap
    (memsched.runtime.hostalloc), so that page faults do not move the step times it records."""
    if steps < 1 or warmup < 0:
        raise MemschedError(f"steps must be >= 1 and warmup >= 0 (got steps={steps}, warmup={warmup})")
    found = find_layers(model, layers)
    p0 = next(model.parameters(), None)
    device = p0.device if p0 is not None else torch.device("cpu")
    modules = [m for _, m in found]
    stats = [_LayerStats(name, type(m).__name__) for name, m in found]
    if device.type == "cpu":
        # The replay's measurement keeps freed memory in the process (memsched.runtime.hostalloc); the times
        # it is compared with are taken the same way.
        steady_host_allocator()

    for _ in range(warmup):
        step_fn()
    step_s = statistics.median(time_steps(step_fn, device, steps))  # the in-core step
    _time_layers(step_fn, modules, stats, Clock(device), steps)
    mem, whole = _memory_step(model, step_fn, modules, stats, device, optimizer)
    static = static_bytes(model, optimizer)
    static.other += sum(nbytes for _, nbytes in mem.outside.values())
    workspace = fit_workspace([stats[i] for i in mem.order], static.total, whole)
    return Trace(
        model=model_id or type(model).__name__,
        batch_size=batch_size,
        seq_len=seq_len,
        dtype=_dtype_name(model),
        framework=framework_versions(),
        source="tracer",
        device=_device_info(device, measure_bandwidth, stats),
        static=static,
        baseline=Baseline(step_s=step_s, peak_bytes=int(whole.peak_bytes)),
        layers=_layers(stats, mem.order, workspace),
    )
