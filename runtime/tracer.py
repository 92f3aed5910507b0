"""The tracer: run a few real training steps and write a Trace (docs/architecture.md, 'Trace').

Three kinds of step, so that instrumentation never inflates what it measures:
1. plain steps: warm-up, then the baseline step time (median);
2. timing steps: per-layer forward time (around the layer's forward) and backward time (from the moment the
   layer's output gradient is complete to the moment its input gradient is, or, for a layer fed the raw
   batch, its last parameter gradient), medians over the steps;
3. one memory step, measured whole (memsched.runtime.memory: every live tensor byte, the CUDA allocator or
   the CPU allocator's events; the same function on both): saved tensors (saved_tensors_hooks; deduplicated
   by storage; attributed to the innermost traced layer whose forward saved them first; parameters and buffers
   excluded: they are static), input and output bytes, DAG edges (storage identity between a layer's
   outputs and later layers' inputs, and data flow through untraced ops: a walk back over the autograd
   graph from a layer's inputs to the nearest traced outputs, across pools, concats, norms), the keep-all
   whole-step peak (the baseline peak) and the peak within each stage. What a stage holds beyond the layer
   model (static + saved bytes so far + the layer's output and input gradient) is the layer's workspace;
   the memory outside the layers goes to the stage it is live in (`fit_workspace`), so the simulator's
   keep-all peak is the measured one on both devices.

Before a trace is returned it is checked (`TraceCheckError`, or a warning in `TraceReport`): the step ran a
backward; the optimizer given is the one the step steps (one the step runs over the model's parameters is
counted even when not given); the per-layer times add up to no more than the step; bytes saved between
traced layers, which no layer owns, are named with what they cost the smallest feasible budget.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import math
import statistics
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook

from memsched.errors import MemschedError, UserCodeError, one_line
from memsched.runtime.checkpointing import flatten
from memsched.runtime.clock import Clock, time_steps
from memsched.runtime.device import device_memory, device_name, framework_versions, measure_runtime_copy_speed
from memsched.runtime.hostalloc import steady_host_allocator
from memsched.runtime.kv_cache import CacheOff, cache_message, hook_caches
from memsched.runtime.layerdrop import layerdrop_off
from memsched.runtime.layers import find_layers
from memsched.runtime.memory import PRE, MemoryMeter, StepMemory
from memsched.runtime.storage import (
    ModuleTensors,
    StaticStorages,
    local_tensor,
    storage_key,
    storage_nbytes,
    tensor_nbytes,
)
from memsched.runtime.wrapping import CopySafeHook, check_compiled, wrapped
from memsched.schema import (
    STEP_BELOW_LAYERS_FACTOR,
    Baseline,
    DeviceInfo,
    Layer,
    RerunOverhead,
    Schedule,
    StaticBytes,
    Trace,
)
from memsched.units import format_bytes, format_seconds

if TYPE_CHECKING:
    from torch.utils.hooks import RemovableHandle

    from memsched.runtime.models import Workload

log = logging.getLogger(__name__)

StepFn = Callable[[], Any]

STEP_PARTS_WARN = 1.5
"""Per-layer forward + backward times summing to more than this many measured steps are suspect (warned):
the step contains them all, so only instrumentation or contention inflates them."""
STEP_PARTS_FAIL = STEP_BELOW_LAYERS_FACTOR
"""Beyond this the trace is refused (the Trace schema refuses it too): the times were not taken as one step."""


class TraceCheckError(MemschedError):
    """A trace that cannot be right (times that do not add up, no backward, missing optimizer state): not
    written, with the fix."""


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
    output_saved_bytes: int = 0
    """Bytes of its tensor outputs whose storages it saved itself, first (Layer.output_saved_bytes)."""
    input_saved_bytes: int = 0
    """Bytes of its checkpointable inputs (those counted in input_bytes) whose storages it saved itself, first
    (Layer.input_saved_bytes)."""
    saved_output_readers: set[int] = field(default_factory=set)
    """Call-order indices of the layers that read those outputs (Layer.output_saved_readers)."""
    output_held_until: int | None = None
    """Registration index of the last layer whose forward started while the model's code still held one of those
    outputs; HELD_INTO_BACKWARD: still held when the backward started (Layer.output_held_until)."""
    output_held_past: int | None = None
    """Registration index of the last layer after whose forward the code still held one of those outputs, not
    as that layer's input (past the last layer: through the loss point)."""
    deps: set[int] = field(default_factory=set)
    """Call-order indices of the layers whose outputs it consumed."""
    forward_s: list[float] = field(default_factory=list)
    """Forward time per timing step."""
    backward_s: list[float] = field(default_factory=list)
    """Backward time per timing step."""
    rerun_s: list[float] = field(default_factory=list)
    """Re-run time inside the backward per re-run step (every layer checkpointed on its own)."""
    checkpointed_forward_s: list[float] = field(default_factory=list)
    """Forward time (outside the backward) in the re-run steps, rerun_s's pair step by step."""
    shared: int = 0
    """Bytes of storages it saved that an earlier layer saved first (attributed there)."""
    resaved_from: set[int] = field(default_factory=set)
    """Registration indices of the earlier layers that first saved a storage it saved too, static ones included
    (Layer.resaved_from)."""
    changed_buffer_bytes: int = 0
    """Bytes of the buffers its forward changes, learned by the re-run steps (Layer.changed_buffer_bytes)."""
    side_input_bytes: int = 0
    """Bytes of its inputs that need no gradient and that the step made outside the traced layers (masks,
    rotary tables, position ids): a recompute checkpoint holds them (Layer.side_input_bytes)."""
    ctx_held_bytes: int = 0
    """Bytes its forward keeps on custom autograd Functions' ctx objects, seen by no saved-tensor hook
    (Layer.ctx_held_bytes)."""


def _tensors_in(values: Any, depth: int) -> list[torch.Tensor]:
    """The tensors among `values`, in containers (lists, tuples, dicts) and, `depth` levels down, in the
    attributes of plain objects (a quantisation state object a Function keeps on its ctx)."""
    found: list[torch.Tensor] = []
    for v in values:
        if isinstance(v, torch.Tensor):
            found.append(v)
        elif depth > 0 and isinstance(v, (list, tuple)):
            found += _tensors_in(v, depth - 1)
        elif depth > 0 and isinstance(v, dict):
            found += _tensors_in(v.values(), depth - 1)
        elif depth > 0 and hasattr(v, "__dict__") and not isinstance(v, (nn.Module, type)):
            found += _tensors_in(vars(v).values(), depth - 1)
    return found


def _input_tensors(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[torch.Tensor]:
    return [t for _, t in flatten((args, kwargs))]


def _unique_bytes(tensors: Sequence[torch.Tensor], whole_storage: bool = False) -> int:
    """Bytes of the tensors, each storage once: the tensors' own bytes, or with `whole_storage` their storages'
    (what stays allocated while any view of each is held)."""
    seen: set[tuple[str, int]] = set()
    total = 0
    for t in tensors:
        k = storage_key(t)
        if k not in seen:
            seen.add(k)
            total += storage_nbytes(t) if whole_storage else tensor_nbytes(t)
    return total


HELD_INTO_BACKWARD = -1
"""_LayerStats.output_held_until of an output the model's code still held when the backward started."""


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
        held: dict[int, set[int]] | None = None,
        probe: bool = False,
    ) -> None:
        self.static = StaticStorages().add_module(model)
        # Per layer, the places in its save order of the storages the model's code holds past its forward, which
        # the probe step found (`_code_holds_probe`): in this step they take 0 bytes there and count in
        # code_held, as static (StaticBytes.saved_held_by_code).
        self.held = held or {}
        self.code_held: dict[int, tuple[weakref.ref[torch.UntypedStorage], int]] = {}
        # The probe step (`probe`): autograd keeps copies of what the layers save, so a layer's saved storage
        # outlives its forward only where the model's code holds it. watch: (layer, place in its save order,
        # storage) of every storage a layer claimed; found: what the later layers' starts saw alive.
        self.probe = probe
        self.watch: list[tuple[int, int, weakref.ref[torch.UntypedStorage]]] = []
        self.found: dict[int, set[int]] = {}
        self.modules = modules
        self.module_tensors = [ModuleTensors(m) for m in modules]
        self.stats = stats
        self.meter = meter
        self.stack: list[int] = []
        # Per open layer call (parallel to `stack`): its inputs counted in input_bytes.
        self.call_inputs: list[list[torch.Tensor]] = []
        # Per layer, weak references to the output tensors it saved itself: while one is alive the model's code
        # holds it (autograd's saved copy is another tensor object), checked at each layer's start and when the
        # backward starts (Layer.output_held_until).
        self.own_outputs: dict[int, list[weakref.ref[torch.Tensor]]] = {}
        self.claims: dict[int, weakref.ref[torch.UntypedStorage]] = {}
        self.producers: dict[int, tuple[int, weakref.ref[torch.UntypedStorage]]] = {}
        self.order: list[int] = []
        # Forward calls per layer in this step: more than one is refused (`_memory_step`).
        self.calls: dict[int, int] = {}
        self.outside: dict[int, tuple[weakref.ref[torch.UntypedStorage], int]] = {}
        self.bwd_marked: set[int] = set()
        self.owner: dict[int, int] = {}  # id(storage) -> the layer that saved it first
        self.shared_seen: set[tuple[int, int]] = set()
        # Saved outside every traced layer after the first one ran: storage id -> (storage, bytes, how many
        # layers had run). Those saved before the last layer ran sit between traced layers (a norm or a
        # residual add between sub-module layers): no layer owns them, so no schedule moves them.
        self.between: dict[int, tuple[weakref.ref[torch.UntypedStorage], int, int]] = {}
        # How many layers had run when code outside every layer saved a tensor (any storage, owned or not): k
        # in here means the code between the k-th layer in forward order and the next saves for backward, so
        # no recompute segment may run across that gap (Layer.code_after_saves).
        self.saves_after: set[int] = set()
        # Data flow through untraced ops (`_upstream`): the autograd nodes of the traced layers' outputs
        # and the nodes an earlier layer's walk already went through. Held for the one step only.
        self.out_nodes: dict[Any, int] = {}
        # Those of them whose layer saved the output itself (Layer.output_saved_readers).
        self.saved_out_nodes: set[Any] = set()
        self.walked: set[Any] = set()
        # Storages alive before the step (the batch, what the process keeps): never side inputs of a layer.
        self.resident = StaticStorages()

    def note_resident(self) -> None:
        """Remember every tensor alive now, at the start of the step (one walk over the garbage collector's
        objects, before any layer runs)."""
        for obj in gc.get_objects():
            # type() rather than isinstance: isinstance would ask lazy module proxies for __class__.
            if issubclass(type(obj), torch.Tensor):
                self.resident.add_tensor(obj)

    def pack(self, x: torch.Tensor) -> torch.Tensor:
        if isinstance(x, torch.Tensor) and x not in self.static:
            self._note(x)
            if self.probe and self.stack and not (x.is_leaf and x.requires_grad):
                # A copy, so that autograd does not keep the layer's storage alive (a leaf that requires grad
                # is the user's input: autograd needs that very tensor back).
                return x.detach().clone()
        # Detached: the packed tensor must not point back at its own grad_fn (see replay._keep).
        return x.detach() if isinstance(x, torch.Tensor) and x.grad_fn is not None else x

    def _note(self, x: torch.Tensor) -> None:
        s = x.untyped_storage()
        if not self.stack:
            # Saved outside every traced layer, before the first one runs (embeddings): no schedule moves it
            # and it lives until the end of the backward, so it is static memory (StaticBytes.saved_before_layers), once
            # per storage. What is saved outside the layers later (the head, the loss) lives only around
            # the loss: the whole-step fit places it there (`fit_workspace`).
            if self.order:
                self.saves_after.add(len(self.order))
                claim, late = self.claims.get(id(s)), self.between.get(id(s))
                if (claim is None or claim() is not s) and (late is None or late[0]() is not s):
                    self.between[id(s)] = (weakref.ref(s), storage_nbytes(x), len(self.order))
                return
            if x in self.resident:
                return  # alive before the step (the batch a stem's first op saves): static already
            claim, hit = self.claims.get(id(s)), self.outside.get(id(s))
            if (claim is None or claim() is not s) and (hit is None or hit[0]() is not s):
                self.outside[id(s)] = (weakref.ref(s), storage_nbytes(x))
            return
        pinned = self._pinned(x)
        ref = self.claims.get(id(s))
        if ref is not None and ref() is s:
            first, me = self.owner[id(s)], self.stack[-1]
            if first != me and first not in self.stack:
                # The replay runs the two with their claims where either offloads (Layer.resaved_from).
                self.stats[me].resaved_from.add(first)
            if pinned or self._code_held(s):
                return  # static (below): no layer holds it alone
            # Counted once, for the layer that saved it first. A later layer saving it too (ResNet: a block's
            # last ReLU output is the next block's input) needs it back at its own backward, before the first
            # layer's: if that layer offloads it, it returns early. Noted for the workspace (`fit_workspace`).
            if first != me and first not in self.stack and (id(s), me) not in self.shared_seen:
                self.shared_seen.add((id(s), me))
                self.stats[me].shared += storage_nbytes(x)
            return
        if pinned:
            # Code before the first layer saved it too (a CNN stem's last ReLU output, read by block 0): that
            # autograd node holds it to the end of the backward whatever this layer does, so it stays static
            # (saved_before_layers). It keeps its place in the layer's save order, with 0 bytes, because the
            # replay numbers a layer's saved storages in the order it claims them; no plan offloads a 0-byte
            # entry (decisions.offload_all).
            self.claims[id(s)] = weakref.ref(s)
            self.owner[id(s)] = self.stack[-1]
            self.stats[self.stack[-1]].saved.append(0)
            return
        self.outside.pop(id(s), None)  # a dead storage's entry under this id (a live one is pinned, above)
        late = self.between.pop(id(s), None)
        if late is not None and late[0]() is not s:
            self.between[id(s)] = late
        self.claims[id(s)] = weakref.ref(s)
        me = self.stack[-1]
        self.owner[id(s)] = me
        place = len(self.stats[me].saved)
        if place in self.held.get(me, ()):
            # The model's code holds it past this layer's forward: moving it would free nothing, so it keeps its
            # place in the save order with 0 bytes, like a pinned storage above, and is static.
            self.code_held[id(s)] = (weakref.ref(s), storage_nbytes(x))
            self.stats[me].saved.append(0)
            return
        if self.probe:
            self.watch.append((me, place, weakref.ref(s)))
        self.stats[me].saved.append(storage_nbytes(x))

    def _code_held(self, s: torch.UntypedStorage) -> bool:
        hit = self.code_held.get(id(s))
        return hit is not None and hit[0]() is s

    def code_held_bytes(self) -> int:
        """Bytes of the storages layers saved that the model's code holds (StaticBytes.saved_held_by_code)."""
        return sum(nbytes for _ref, nbytes in self.code_held.values())

    def _note_code_holds(self, i: int, inputs: Sequence[torch.Tensor]) -> None:
        """Probe step, as layer i starts: the storages that layers whose forward has ended saved and that are still
        alive are held by the model's code, other than their own saved outputs (Layer.output_held_until prices
        those) and the outputs of traced layers passed to layer i (the data flow: deps and shared inputs price
        those)."""
        flow = set()
        for t in inputs:
            hit = self.producers.get(id(t.untyped_storage()))
            if hit is not None and hit[1]() is t.untyped_storage():
                flow.add(id(t.untyped_storage()))
        alive = []
        for j, place, ref in self.watch:
            held = ref()
            if held is None:
                continue
            alive.append((j, place, ref))
            if j == i or j in self.stack or id(held) in flow:
                continue  # an enclosing layer's forward is still running: its own code holds what it saved
            own = {id(o.untyped_storage()) for r in self.own_outputs.get(j, []) if (o := r()) is not None}
            if id(held) not in own:
                self.found.setdefault(j, set()).add(place)
        self.watch = alive

    # LayerCalls (memsched.runtime.wrapping): around each traced layer's forward.

    def enter(self, i: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        st = self.stats[i]
        if i not in self.order:
            self.order.append(i)
        self.calls[i] = self.calls.get(i, 0) + 1
        self.meter.mark(f"F{i}")
        self._note_held(i)
        self.static.add_module(self.module_tensors[i])  # parameters gathered just in time (FSDP)
        inputs = _input_tensors(args, kwargs)
        if self.probe:
            self._note_code_holds(i, inputs)
        # An input that code before the first layer saved (a stem's last ReLU output) is static: a checkpoint of
        # this layer holds nothing more by keeping it, so it is not a checkpoint input (nor, then, counted as
        # the input gradient: the whole-step fit carries that at B_i).
        grad_inputs = [t for t in inputs if t.requires_grad and not self._pinned(t)]
        st.input_bytes = _unique_bytes(grad_inputs)
        self.call_inputs.append(inputs)  # which of them it saves: known when it returns (`leave`)
        side = []
        for t in inputs:
            hit = self.producers.get(id(t.untyped_storage()))
            if hit is not None and hit[1]() is t.untyped_storage():
                if hit[0] != i:
                    st.deps.add(hit[0])
                    if self._claimed_by(t, hit[0]):
                        self.stats[hit[0]].saved_output_readers.add(i)
            elif not t.requires_grad and t not in self.static and t not in self.resident:
                side.append(t)
        st.side_input_bytes = _unique_bytes(side, whole_storage=True)
        st.deps |= self._upstream([t.grad_fn for t in inputs if t.grad_fn is not None], i)
        self.stack.append(i)

    def _pinned(self, t: torch.Tensor) -> bool:
        """Whether code before the first layer saved this tensor's storage (StaticBytes.saved_before_layers)."""
        s = t.untyped_storage()
        hit = self.outside.get(id(s))
        return hit is not None and hit[0]() is s

    def _upstream(self, nodes: list[Any], i: int) -> set[int]:
        """The traced layers whose outputs reach layer i's inputs through untraced ops (a pool, a concat, a
        norm, a residual add): a walk back over the autograd graph that stops at a traced layer's output and
        at a node an earlier layer's walk went through (that data is already routed: a residual stream
        shared by sub-module layers would otherwise make every layer depend on all the ones before it)."""
        found: set[int] = set()
        todo = list(nodes)
        while todo:
            node = todo.pop()
            producer = self.out_nodes.get(node)
            if producer is not None:
                if producer != i:
                    found.add(producer)
                    if node in self.saved_out_nodes:
                        self.stats[producer].saved_output_readers.add(i)
                continue
            if node in self.walked:
                continue
            self.walked.add(node)
            todo.extend(nxt for nxt, _ in node.next_functions if nxt is not None)
        return found

    def forget_graph(self) -> None:
        """Drop the references to the step's autograd nodes."""
        self.out_nodes.clear()
        self.saved_out_nodes.clear()
        self.walked.clear()

    def between_bytes(self) -> dict[int, int]:
        """Bytes saved outside every traced layer between two of them, keyed by how many layers had run
        (k: after the k-th layer in forward order, before the next). After the last layer: the head."""
        n = len(self.order)
        out: dict[int, int] = {}
        for _ref, nbytes, k in self.between.values():
            if k < n:
                out[k] = out.get(k, 0) + nbytes
        return out

    def leave(self, i: int, token: None, out: Any) -> None:
        self.stack.pop()
        ins = self.call_inputs.pop()
        grad_inputs = [t for t in ins if t.requires_grad and not self._pinned(t)]
        self.stats[i].input_saved_bytes = _unique_bytes([t for t in grad_inputs if self._claimed_by(t, i)])
        # Own saved outputs the code still holds after this layer, other than as its inputs (its caller's frame
        # holds those until the call returns).
        passed = {id(t) for t in ins}
        for j, refs in self.own_outputs.items():
            if any((t := r()) is not None and id(t) not in passed for r in refs):
                self.stats[j].output_held_past = i
        self.meter.mark(f"F{i}:end")  # after the last layer: the loss's stage, apart (`fit_workspace`)
        outs = [t for _, t in flatten(out)]
        self.stats[i].ctx_held_bytes = self._ctx_held(outs, ins)
        self.stats[i].output_bytes = _unique_bytes(outs)
        own = [t for t in outs if self._claimed_by(t, i)]
        self.stats[i].output_saved_bytes = _unique_bytes(own)
        self.own_outputs[i] = [weakref.ref(t) for t in own]
        for t in outs:
            s = t.untyped_storage()
            self.producers[id(s)] = (i, weakref.ref(s))
            if t.grad_fn is not None:
                self.out_nodes[t.grad_fn] = i
                if self._claimed_by(t, i):
                    self.saved_out_nodes.add(t.grad_fn)
            if t.requires_grad:
                t.register_hook(self._backward_mark(i))

    def _ctx_held(self, outs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor]) -> int:
        """Bytes of the tensors a layer's forward keeps as attributes of custom autograd Functions' ctx objects
        (Layer.ctx_held_bytes): a walk back over the autograd nodes its forward made, from its outputs to where
        the walk before it (`_upstream`) or an earlier layer's outputs begin. Parameters, buffers, what the
        process held before the step, the layer's inputs and storages a saved-tensor hook saw are left out."""
        skip = {id(t.untyped_storage()) for t in inputs}
        seen: set[int] = set()
        total = 0
        done: set[Any] = set()
        todo = [t.grad_fn for t in outs if t.grad_fn is not None]
        while todo:
            node = todo.pop()
            if node in done or node in self.walked or node in self.out_nodes:
                continue
            done.add(node)
            attrs = getattr(node, "__dict__", None)  # only a Python Function's node (its ctx) has one
            for t in _tensors_in(attrs.values() if attrs else (), depth=2):
                s = t.untyped_storage()
                key = id(s)
                if key in seen or key in skip or key in self.owner or t in self.static or t in self.resident:
                    continue
                seen.add(key)
                total += storage_nbytes(t)
            todo.extend(nxt for nxt, _ in node.next_functions if nxt is not None)
        return total

    def _note_held(self, now: int) -> None:
        """Layers whose own saved outputs the model's code still holds as layer `now` starts (HELD_INTO_BACKWARD:
        as the backward starts)."""
        for j, refs in self.own_outputs.items():
            if any(r() is not None for r in refs):
                self.stats[j].output_held_until = now

    def fail(self, i: int, token: None) -> None:
        self.stack.pop()
        self.call_inputs.pop()

    def _claimed_by(self, t: torch.Tensor, i: int) -> bool:
        """Whether layer i saved this tensor's storage first, with its bytes (not a 0-byte static placeholder)."""
        s = t.untyped_storage()
        ref = self.claims.get(id(s))
        return (
            ref is not None
            and ref() is s
            and self.owner.get(id(s)) == i
            and not self._pinned(t)
            and not self._code_held(s)
        )

    def _backward_mark(self, i: int) -> Callable[[torch.Tensor], None]:
        def on_grad(_g: torch.Tensor) -> None:
            if not self.bwd_marked:
                self._note_held(HELD_INTO_BACKWARD)
                self.own_outputs.clear()
            if i not in self.bwd_marked:
                self.bwd_marked.add(i)
                self.meter.mark(f"B{i}")

        return on_grad


class _ParamEnd(CopySafeHook):
    """Post-accumulate-grad hook of a parameter of layers whose inputs need no gradient: the moment its
    gradient is accumulated is a mark the backward of those layers has reached (the last one is its end)."""

    __slots__ = ("index", "timing")

    def __init__(self, timing: _TimingStep, index: int) -> None:
        self.timing = timing
        self.index = index

    def __call__(self, _p: torch.Tensor) -> None:
        self.timing.marks.append((self.index, "param_end", self.timing.clock.mark()))


class _TimingStep:
    """Instrumentation of the timing steps: forward around the call, backward between gradient hooks.

    A layer's backward starts when its output gradient is complete and ends when its input gradient is. A
    layer fed the raw batch (the first block of a CNN) has no input that requires grad, so nothing marks the
    end there: its backward ends when the last of its parameters' gradients is accumulated (post-accumulate
    hooks, registered only for such layers, only for the timing steps). A layer none of whose outputs requires
    grad has no backward at all: 0 s."""

    def __init__(self, stats: list[_LayerStats], clock: Clock, modules: Sequence[nn.Module]) -> None:
        self.stats = stats
        self.clock = clock
        self.modules = modules
        self.marks: list[tuple[int, str, Any]] = []
        self._param_hooked: set[int] = set()
        self._handles: list[Any] = []
        self.steps_with_backward = 0
        """Timing steps in which any traced layer's backward started."""

    def _hook_params(self, i: int) -> None:
        """Mark layer i's backward end from its parameters' gradient accumulation (see the class docstring)."""
        self._param_hooked.add(i)
        for p in self.modules[i].parameters():
            if p.requires_grad:
                self._handles.append(p.register_post_accumulate_grad_hook(_ParamEnd(self, i)))

    def remove(self) -> None:
        """Take the parameter hooks off (after the timing steps)."""
        for h in self._handles:
            h.remove()
        self._handles.clear()

    # LayerCalls (memsched.runtime.wrapping): around each traced layer's forward.

    def _grad_mark(self, i: int, kind: str, fired: set[str]) -> Callable[[torch.Tensor], None]:
        def on_grad(_g: torch.Tensor) -> None:
            if kind not in fired:
                fired.add(kind)
                self.marks.append((i, kind, self.clock.mark()))

        return on_grad

    def enter(self, i: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, set[str]]:
        fired: set[str] = set()
        needs_grad = False
        for t in _input_tensors(args, kwargs):
            if t.requires_grad:
                needs_grad = True
                t.register_hook(self._grad_mark(i, "bwd_end", fired))
        if not needs_grad and i not in self._param_hooked:
            self._hook_params(i)
        return self.clock.mark(), fired

    def leave(self, i: int, token: tuple[Any, set[str]], out: Any) -> None:
        b = self.clock.mark()
        a, fired = token
        self.marks.append((i, "fwd", (a, b)))
        grad_out = False
        for _, t in flatten(out):
            if t.requires_grad:
                grad_out = True
                t.register_hook(self._grad_mark(i, "bwd_start", fired))
        if not grad_out:
            self.marks.append((i, "no_grad", None))

    def fail(self, i: int, token: tuple[Any, set[str]]) -> None:
        return None

    def collect(self) -> None:
        """After a step: turn the marks into per-layer times."""
        self.clock.finish()
        fwd: dict[int, float] = {}
        end: dict[int, Any] = {}
        param_end: dict[int, Any] = {}
        started: dict[int, int] = {}  # layer -> backward starts seen so far
        no_grad: set[int] = set()
        seq: list[tuple[int, Any]] = []
        for i, kind, tok in self.marks:
            if kind == "fwd":
                fwd[i] = fwd.get(i, 0.0) + self.clock.seconds(*tok)
            elif kind == "bwd_start":
                seq.append((i, tok))
                started[i] = started.get(i, 0) + 1
            elif kind == "bwd_end":
                end.setdefault(i, tok)
            elif kind == "param_end" and started.get(i) == 1:
                # The last parameter mark within the layer's first backward (a second backward of the layer
                # in one step, gradient accumulation, begins with a second bwd_start).
                param_end[i] = tok
            elif kind == "no_grad":
                no_grad.add(i)
        # The first backward of each layer (gradient accumulation, shared modules: later ones are ignored).
        first: dict[int, Any] = {}
        for i, tok in seq:
            first.setdefault(i, tok)
        if seq:
            self.steps_with_backward += 1
        # A layer's backward ends when its input gradient is complete; failing a hook there (an input that
        # does not require grad), when its last parameter gradient is accumulated; failing that, when the
        # next layer's backward starts.
        starts = list(first.items())
        for k, (i, tok) in enumerate(starts):
            stop = end.get(i, param_end.get(i))
            if stop is None and k + 1 < len(starts):
                stop = starts[k + 1][1]
            if stop is not None:
                self.stats[i].backward_s.append(max(self.clock.seconds(tok, stop), 0.0))
        for i in no_grad - set(first):
            self.stats[i].backward_s.append(0.0)  # nothing of it needs a gradient: no backward to time
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


def fit_workspace(layers: Sequence[_LayerStats], static_total: int, whole: StepMemory) -> tuple[list[int], list[int]]:
    """Per layer (forward order): the bytes its stages held beyond the layer model, never negative, and the
    bytes its forward stage alone held beyond it (the same terms without the backward's need: the forward
    workspace, Layer.forward_workspace_bytes, at most the first).

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
    out: list[int] = []
    fwd_out: list[int] = []
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
        fwd_out.append(max(0, need_f) + st.shared)
    assert len(out) == len(fwd_out) == n
    return out, fwd_out


def _time_layers(
    step_fn: StepFn, modules: Sequence[nn.Module], stats: list[_LayerStats], clock: Clock, steps: int
) -> None:
    """Timing steps: per-layer forward and backward times into `stats`."""
    timing = _TimingStep(stats, clock, modules)
    try:
        with wrapped(modules, timing):
            for _ in range(steps):
                step_fn()
                timing.collect()
    finally:
        timing.remove()
    skipped = [st for st in stats if len(st.forward_s) < steps]  # one time per step that ran the layer
    if skipped:
        raise _not_every_step(skipped, f"{steps} timing steps")
    if not timing.steps_with_backward:
        raise TraceCheckError(
            "step: no backward ran through the traced layers; the step function must compute the loss and "
            "call loss.backward() (not under torch.no_grad()), as Workload.step does"
        )


def _not_every_step(layers: list[_LayerStats], where: str) -> MemschedError:
    """The error for layers that did not run in every step: a layer pattern matching modules the step does not
    call, or a model that skips layers at random, which the trace cannot describe."""
    names = [st.name for st in layers[:3]]
    skips = (
        "a model that skips layers at random (stochastic depth that skips whole blocks; the LayerDrop of a "
        "transformers config or module, layerdrop / encoder_layerdrop / decoder_layerdrop, the tracer turns off "
        "itself) must be traced with that off: the trace then describes the step that runs every layer, and the "
        "replay runs steps that skip some (runtime/README.md, 'Layers a step skips')"
    )
    if any(st.forward_s for st in layers):  # it ran in some step: skipped in others
        return MemschedError(f"layers: {names} ran in some steps and not in others ({where}): {skips}")
    return MemschedError(
        f"layers: {names} never ran ({where}); check the layer patterns or the step function. Or: {skips}"
    )


TIMING_RUNS = 2
"""Timing runs (the plain steps, then the per-layer timing steps) before layer times that sum past
STEP_PARTS_FAIL steps are refused: one stall (another process, a page-fault storm) inflates a short run, and a
second run tells it from contention or instrumentation that lasts."""


def _time_step_and_layers(
    step_fn: StepFn, modules: Sequence[nn.Module], stats: list[_LayerStats], device: torch.device, steps: int
) -> float:
    """The in-core step's median seconds, and the per-layer times into `stats`: timed again once where the
    layers' medians sum past STEP_PARTS_FAIL steps (the check that refuses the trace, `_check_times`)."""
    for run in range(TIMING_RUNS):
        for st in stats:
            st.forward_s.clear()
            st.backward_s.clear()
        step_s = statistics.median(time_steps(step_fn, device, steps))
        _time_layers(step_fn, modules, stats, Clock(device), steps)
        parts = sum(
            statistics.median(st.forward_s or [0.0]) + statistics.median(st.backward_s or [0.0]) for st in stats
        )
        ratio = _parts_ratio(parts, step_s)
        if ratio <= STEP_PARTS_FAIL:
            break
        if run + 1 < TIMING_RUNS:
            log.info("times: the layers' forward + backward sum to %.1fx the step; timing again (a stall)", ratio)
    return step_s


def _parts_ratio(parts: float, step_s: float) -> float:
    """The layers' summed times over the step that contains them (infinite for a step of 0 s)."""
    return parts / step_s if step_s > 0 else float("inf")


RERUN_STEPS = 2
"""Extra steps in which every traced layer is checkpointed on its own, to time its re-run (Layer.recompute_s)."""
RERUN_BELOW = 0.95
"""A re-run is recorded only where its median is below this fraction of forward_s: measurably cut short by
the checkpoint's early stop. Else recompute_s stays None (the layer re-runs whole, within the noise)."""


class _RerunProbe:
    """Times each traced layer's forward, from `enter` to `leave` or `fail`, in the re-run steps: inside the
    backward, the re-run of a layer that is its own checkpointed segment's last layer (the checkpoint's early
    stop ends it by an exception raised through the forward); outside, its forward in the same step, the pair
    that the re-run is compared with (`_recompute_s`). LayerCalls (memsched.runtime.wrapping), installed over
    the replay's own."""

    def __init__(self, stats: list[_LayerStats], clock: Clock) -> None:
        self.stats = stats
        self.clock = clock
        self.marks: list[tuple[int, bool, Any, Any]] = []

    def enter(self, i: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return torch._C._current_graph_task_id() >= 0, self.clock.mark()

    def leave(self, i: int, token: Any, out: Any) -> None:
        self.fail(i, token)

    def fail(self, i: int, token: Any) -> None:
        rerun, start = token
        self.marks.append((i, rerun, start, self.clock.mark()))

    def collect(self) -> None:
        self.clock.finish()
        total: dict[tuple[int, bool], float] = {}
        for i, rerun, a, b in self.marks:
            total[i, rerun] = total.get((i, rerun), 0.0) + self.clock.seconds(a, b)
        # Both times of a layer in one step, or neither: the lists stay paired step by step (_recompute_s).
        for (i, rerun), t in total.items():
            if rerun and (i, False) in total:
                self.stats[i].rerun_s.append(t)
                self.stats[i].checkpointed_forward_s.append(total[i, False])
        self.marks.clear()


class _ForwardMarks:
    """Marks each traced layer's forward (outside the backward) as stage F{i} of a measured step, ending at
    F{i}:end: the memory a layer's forward grows by under a checkpoint. LayerCalls (memsched.runtime.wrapping)."""

    def __init__(self, meter: MemoryMeter) -> None:
        self.meter = meter

    def enter(self, i: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if torch._C._current_graph_task_id() >= 0:
            return None  # a re-run inside the backward
        self.meter.mark(f"F{i}")
        return i

    def leave(self, i: int, token: Any, out: Any) -> None:
        self.fail(i, token)

    def fail(self, i: int, token: Any) -> None:
        if token is not None:
            self.meter.mark(f"F{i}:end")


def with_checkpointed_forwards(tr: Trace, checkpointed: StepMemory) -> Trace:
    """`tr` with Layer.checkpointed_forward_bytes from the checkpoint-all step (`_time_reruns`): the peak of each
    layer's forward stage above static memory, F{i} and the stage after it up to the next layer, as the workspace
    fit reads keep-all's (the loss's stage after the last layer is left out). The cost model fits a recomputed
    layer's forward to it (optimizer: simulate.forward_cuts)."""
    n = tr.n
    peaks = checkpointed.stage_peak_bytes
    layers = []
    for i, layer in enumerate(tr.layers):
        seen = [peaks[k] for k in (f"F{i}", f"F{i}:end") if k in peaks and k != f"F{n - 1}:end"]
        measured = max(0, max(seen) - tr.static.total) if seen else None
        layers.append(layer.model_copy(update={"checkpointed_forward_bytes": measured}))
    return tr.model_copy(update={"layers": layers})


def _time_reruns(
    model: nn.Module,
    step_fn: StepFn,
    names: Sequence[str],
    modules: Sequence[nn.Module],
    stats: list[_LayerStats],
    clock: Clock,
    report: TraceReport,
) -> StepMemory | None:
    """RERUN_STEPS steps with every traced layer checkpointed on its own, as the runtime replays a recompute
    (torch.utils.checkpoint, non-reentrant, early stop): each layer's re-run time into `stats`. Then one such
    step measured, with each layer's forward marked: returned, for what a forward holds under a checkpoint
    (Layer.checkpointed_forward_bytes); None where the re-run steps could not run."""
    from memsched.runtime.measure import keep_all_schedule
    from memsched.runtime.replay import ScheduledModel
    from memsched.schema import Action, LayerAction

    keep = keep_all_schedule(names)
    ckpt = keep.model_copy(
        update={"policy": "checkpoint-all", "actions": [LayerAction(layer=x, action=Action.RECOMPUTE) for x in names]}
    )
    probe = _RerunProbe(stats, clock)
    try:
        with ScheduledModel(model, ckpt) as sm, wrapped(modules, probe):
            for _ in range(RERUN_STEPS):
                step_fn()
                probe.collect()
            # What the replay learned while recomputing every layer: the buffers each forward changes.
            for st, nbytes in zip(stats, sm.changed_buffer_bytes(), strict=True):
                st.changed_buffer_bytes = nbytes
            meter = MemoryMeter(clock.device)
            with wrapped(modules, _ForwardMarks(meter)):
                return meter.measure(step_fn)
    except MemschedError as e:  # e.g. the framework's own gradient checkpointing is on
        report.warn(f"re-run times not measured (recompute_s left null: priced as forward_s): {e}")
        for st in stats:
            st.rerun_s.clear()
            st.checkpointed_forward_s.clear()
    return None


MACHINERY_SECONDS = 1.5
"""About how long the machinery's steps take (`_time_machinery`), within MACHINERY_ROUNDS rounds."""
MACHINERY_ROUNDS = (6, 30)
"""The fewest and most rounds (one step of each schedule) of the machinery's measurement."""
MACHINERY_LONGEST = 8
"""The longest segment of the long-segment steps: long enough to tell the per-layer part of the machinery from
the per-segment part, short enough that its re-run holds little more than keep-all's activations."""


def _long_segments(n: int, saves_after: set[int] | frozenset[int], longest: int) -> list[int]:
    """Per forward index, the first layer of its segment when the layers are cut into the longest segments the
    trace allows (none across a gap where the model's code saves tensors: Trace.segment_last), at most
    `longest` layers each."""
    starts: list[int] = []
    a = 0
    for k in range(n):
        if k > a and (k - a >= longest or k in saves_after):
            a = k
        starts.append(a)
    return starts


def _over_keep_all(
    model: nn.Module,
    step_fn: StepFn,
    device: torch.device,
    keep: Schedule,
    schedules: Sequence[Schedule],
    step_s: float,
) -> list[list[float]]:
    """Per schedule, its steps' times over keep-all's, one step of each in turn per round (MACHINERY_ROUNDS rounds
    in about MACHINERY_SECONDS), keep-all under the replay first (its kept layers bare, `replay.bare_kept_layers`:
    the plain step and the replay's per-layer bookkeeping), as `memsched measure` compares. What a schedule's own
    saved-tensor hooks cost (its offload layers', and the kept layers' that share a storage with them) is in its
    ratio. A slow spell of the machine (this CPU ran
    steps 1.6x slower for seconds at a time) falls on all of a round, and a ratio within a round does not change.
    One host buffer pool for every schedule, as `memsched measure` keeps one: a step does not pay its allocation."""
    from memsched.runtime.pool import HostBufferPool
    from memsched.runtime.replay import ScheduledModel

    low, high = MACHINERY_ROUNDS
    rounds = max(low, min(high, math.ceil(MACHINERY_SECONDS / ((len(schedules) + 1) * max(step_s, 1e-9)))))
    pool = HostBufferPool(pin_memory=device.type == "cuda")
    ratios: list[list[float]] = [[] for _ in schedules]
    for _ in range(rounds):
        times = []
        for schedule in (keep, *schedules):
            sm = ScheduledModel(model, schedule, pool=pool, host_budget=None)
            try:
                times += time_steps(step_fn, device, 1)
            finally:
                sm.remove()
        for c in range(len(schedules)):
            ratios[c].append(times[c + 1] / times[0] - 1.0 if times[0] > 0 else 0.0)
    return ratios


def _time_machinery(
    model: nn.Module,
    step_fn: StepFn,
    names: Sequence[str],
    stats: Sequence[_LayerStats],
    saves_after: set[int] | frozenset[int],
    device: torch.device,
    step_s: float,
    report: TraceReport,
) -> RerunOverhead | None:
    """What the recompute machinery costs beyond the layers' re-runs (RerunOverhead): steps with every layer a
    segment of its own and with the longest segments (`_long_segments`), each as a ratio to a keep-all step
    under the replay in the same round, times the trace's step `step_s`, less what the trace's layer
    times price for them (Trace.segment_rerun_s without the machinery). With n layers in s segments a step pays
    s x per_segment + n x per_layer more than priced; two segmentations give both, each clamped at 0 (on a GPU the
    machinery's host work often hides behind queued kernels). `names` and `stats` in forward order; None where
    the steps could not run (the trace then prices re-runs by their layers alone)."""
    from memsched.runtime.measure import keep_all_schedule
    from memsched.schema import Action, LayerAction

    n = len(names)
    fwd = [statistics.median(st.forward_s) for st in stats]
    rerun = [r if (r := _recompute_s(st)) is not None else f for st, f in zip(stats, fwd, strict=True)]

    def priced(starts: list[int]) -> float:
        return sum(rerun[k] if k + 1 == n or starts[k + 1] != starts[k] else fwd[k] for k in range(n))

    keep = keep_all_schedule(list(names))
    single = list(range(n))
    configs = [single]
    longer = _long_segments(n, saves_after, MACHINERY_LONGEST)
    if len(set(longer)) < n:
        configs.append(longer)
    schedules = [
        keep.model_copy(
            update={
                "policy": "machinery",
                "actions": [
                    LayerAction(layer=x, action=Action.RECOMPUTE, recompute_group=a)
                    for x, a in zip(names, starts, strict=True)
                ],
            }
        )
        for starts in configs
    ]
    try:
        ratios = _over_keep_all(model, step_fn, device, keep, schedules, step_s)
    except (MemschedError, RuntimeError, MemoryError) as e:
        if not (isinstance(e, MemschedError) or out_of_memory(e)):
            raise
        # The long segments' re-run holds up to MACHINERY_LONGEST layers' saved tensors at once, beside keep-all's.
        report.warn(f"recompute machinery not measured (re-runs priced by their layers alone): {one_line(e)}")
        return None
    # What each schedule adds to the trace's step, against what the trace's layer times price for it.
    unpriced = [statistics.median(r) * step_s - priced(starts) for r, starts in zip(ratios, configs, strict=True)]
    log.info(
        "recompute machinery: step over keep-all %s, unpriced %s ms",
        [round(statistics.median(r), 4) for r in ratios],
        [round(u * 1e3, 3) for u in unpriced],
    )
    if len(configs) == 1:
        return RerunOverhead(per_segment_s=max(unpriced[0], 0.0) / n)
    segments = len(set(longer))
    per_segment = max((unpriced[0] - unpriced[1]) / (n - segments), 0.0)
    per_layer = max((unpriced[1] - segments * per_segment) / n, 0.0)
    return RerunOverhead(per_segment_s=per_segment, per_layer_s=per_layer)


def _calibrated_serial_copies(
    model: nn.Module,
    step_fn: StepFn,
    names: Sequence[str],
    stats: Sequence[_LayerStats],
    device: torch.device,
    step_s: float,
    info: DeviceInfo,
    report: TraceReport,
) -> DeviceInfo:
    """`info` with its copy latency calibrated where copies run on the compute thread (the CPU): steps offloading
    every layer but the last, synchronously (done and prefetched at the layer's own stages), over keep-all steps
    (`_over_keep_all`), times the trace's step, less what `info` prices for those copies (each `latency + bytes /
    bandwidth`, both ways), spread over the copies. The runtime's copy probe (measure_runtime_copy_speed) times
    the copies and the pool, not the saved-tensor hooks around them nor what the step does with them; on this CPU
    GPT-2's offload-all plan measured +14.6% against +8.2% predicted. Devices whose copies run beside compute are
    returned as they are: there the hooks' host work is not on the link."""
    from memsched.runtime.measure import keep_all_schedule
    from memsched.schema import Action, LayerAction, OffloadPlan

    if info.concurrent_copies:
        return info
    keep = keep_all_schedule(list(names))
    actions, moved = [], []
    for k, (name, st) in enumerate(zip(names, stats, strict=True)):
        tensors = [j for j, nbytes in enumerate(st.saved) if nbytes > 0]
        if k + 1 == len(names) or not tensors:
            actions.append(LayerAction(layer=name, action=Action.KEEP))
            continue
        nbytes = sum(st.saved[j] for j in tensors)
        plan = OffloadPlan(tensors=tensors, bytes=nbytes, done_by_layer=k, prefetch_at_layer=k)
        actions.append(LayerAction(layer=name, action=Action.OFFLOAD, offload=plan))
        moved.append(nbytes)
    if not moved:
        return info
    offload = keep.model_copy(update={"policy": "copy-calibration", "actions": actions})
    try:
        (ratios,) = _over_keep_all(model, step_fn, device, keep, [offload], step_s)
    except (MemschedError, RuntimeError, MemoryError) as e:
        if not (isinstance(e, MemschedError) or out_of_memory(e)):
            raise
        report.warn(f"copies not calibrated through the replay (the copy probe's latency is kept): {one_line(e)}")
        return info
    priced = sum(2 * info.copy_latency_s + b / info.d2h_bytes_per_s + b / info.h2d_bytes_per_s for b in moved)
    unpriced = statistics.median(ratios) * step_s - priced
    latency = max(info.copy_latency_s + unpriced / (2 * len(moved)), 0.0)
    log.info(
        "copies on the compute thread: offload-all %.4f over keep-all, %.3f ms unpriced; latency %.1f -> %.1f us",
        statistics.median(ratios),
        unpriced * 1e3,
        info.copy_latency_s * 1e6,
        latency * 1e6,
    )
    report.probe_copy_latency_s = info.copy_latency_s
    return info.model_copy(update={"copy_latency_s": latency})


def resident_beyond_static(model: nn.Module, static: StaticBytes, whole: StepMemory) -> int:
    """Device bytes live when the measured step began beyond the model's own static memory: the input batch and
    whatever the user's process keeps on the device (a reference copy of the gradients, an EMA model, a
    dataset). They are resident for the whole step, so they are static (StaticBytes.other). Left in the stages,
    the workspace fit would charge them to every layer and the loss point, and a percentage budget would count
    them as activations (bench/peers on the CPU: 475 MiB of kept reference gradients made a checkpoint-all plan
    measured at 442 MiB above static look like 916 MiB). Gradients count only where they exist at the step's
    start (a step that sets them to None allocates them in its backward, inside the stages)."""
    seen: set[tuple[str, int]] = set()
    grads = 0
    for p in model.parameters():
        g = p.grad
        if g is None:
            continue
        g = local_tensor(g)
        k = storage_key(g)
        if k not in seen:
            seen.add(k)
            grads += storage_nbytes(g)
    # static.other is the model's buffers here (static_bytes), before the tracer adds anything else to it.
    present = static.params + grads + static.optimizer_state + static.other
    return max(0, whole.start_bytes - present)


def _code_holds_probe(
    model: nn.Module, step_fn: StepFn, modules: Sequence[nn.Module], stats: Sequence[_LayerStats], device: torch.device
) -> dict[int, set[int]]:
    """One step in which autograd keeps copies of what the layers save: per layer (registration index), the places
    in its save order of the storages still alive as a later layer starts, which the model's code holds (a local
    variable of its forward: an embedding output, a rotary table; autocast's cache of weight casts). Offloading or
    recomputing them frees nothing while the code holds them. The step holds those storages twice (the copy
    too); a layer's storages are checked at the later layers' starts, so the last layer's never are."""
    probe_stats = [_LayerStats(st.name, st.kind) for st in stats]
    mem = _MemoryStep(model, probe_stats, modules, MemoryMeter(device), probe=True)
    try:
        _instrumented(mem, modules, step_fn)()
    finally:
        mem.forget_graph()
    return mem.found


def _instrumented(mem: _MemoryStep, modules: Sequence[nn.Module], step_fn: StepFn) -> Callable[[], None]:
    """`step_fn` with `mem` around every traced layer and on every saved tensor."""

    def run() -> None:
        mem.note_resident()
        with wrapped(modules, mem), torch.autograd.graph.saved_tensors_hooks(mem.pack, lambda x: x):
            step_fn()

    return run


def _memory_step(
    model: nn.Module,
    step_fn: StepFn,
    modules: Sequence[nn.Module],
    stats: list[_LayerStats],
    device: torch.device,
    optimizers: Sequence[torch.optim.Optimizer],
    held: dict[int, set[int]] | None = None,
) -> tuple[_MemoryStep, StepMemory]:
    """One instrumented step, measured whole (after a plain priming step on the CPU). `held`: the storages the
    model's code holds (`_code_holds_probe`), counted as static."""
    meter = MemoryMeter(device)
    mem = _MemoryStep(model, stats, modules, meter, held=held)
    handles = [o.register_step_pre_hook(lambda *_a: meter.mark("optimizer")) for o in optimizers]
    try:
        whole = meter.measure(_instrumented(mem, modules, step_fn), prime=step_fn)
    finally:
        mem.forget_graph()
        for h in handles:
            h.remove()
    missing = [stats[i] for i in range(len(stats)) if i not in mem.order]
    if missing:
        raise _not_every_step(missing, "the memory step")
    _check_one_call_each(mem.calls, stats)
    return mem, whole


def _check_one_call_each(calls: dict[int, int], stats: Sequence[_LayerStats]) -> None:
    """Refuse layers whose forward ran more than once in the step. A trace has one forward and one backward per
    layer; a module called again in the same step (one block shared across depth, as ALBERT's; a model applied to
    two inputs before one backward; micro-batches inside the step; the model's own gradient checkpointing) would
    be traced as one layer holding every call's saved tensors, with every call's time, in one stage: a plan
    priced on that is not the step that runs (ALBERT, one layer called 4 times, 2026-12-07: the recompute plan's
    predicted peak 9.43 MB against 6.41 MB measured, and its row F0 0.21 MB under the measured one)."""
    repeated = [(stats[i].name, c) for i, c in sorted(calls.items()) if c > 1]
    if not repeated:
        return
    name, count = repeated[0]
    more = f" (and {len(repeated) - 1} more layers)" if len(repeated) > 1 else ""
    raise TraceCheckError(
        f"layers: {name!r} ran its forward {count} times in one step{more}; memsched plans one call of each layer "
        "per step. Select layers that run once per step (--layer-pattern; a module shared across depth, as "
        "ALBERT's, has no such layers), turn the model's own gradient checkpointing off, and run one forward and "
        "one backward per traced step (one micro-batch)"
    )


def _layers(
    stats: list[_LayerStats],
    order: list[int],
    workspace: list[int],
    forward_workspace: list[int],
    saves_after: set[int] | frozenset[int] = frozenset(),
) -> list[Layer]:
    """The trace's layers in forward order, with registration-order deps renumbered; forward_workspace_bytes
    where the forward's need is below the workspace (else None: the workspace). `saves_after`: the gaps (how
    many layers had run) where code between two layers saved tensors (_MemoryStep.saves_after)."""
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
                recompute_s=_recompute_s(st),
                input_bytes=st.input_bytes,
                output_bytes=st.output_bytes,
                workspace_bytes=workspace[k],
                forward_workspace_bytes=forward_workspace[k] if forward_workspace[k] < workspace[k] else None,
                deps=sorted(pos[d] for d in st.deps if pos[d] < pos[orig]),
                shared_input_bytes=st.shared or None,
                resaved_from=sorted(pos[j] for j in st.resaved_from if pos[j] < pos[orig]),
                side_input_bytes=st.side_input_bytes or None,
                ctx_held_bytes=st.ctx_held_bytes or None,
                changed_buffer_bytes=st.changed_buffer_bytes or None,
                output_saved_bytes=min(st.output_saved_bytes, st.output_bytes, sum(st.saved)) or None,
                input_saved_bytes=min(st.input_saved_bytes, st.input_bytes, sum(st.saved)) or None,
                output_saved_readers=sorted(pos[r] for r in st.saved_output_readers if pos[r] > pos[orig])
                if st.output_saved_bytes
                else None,
                output_held_until=_held_until(st, pos, len(order)),
                code_after_saves=k + 1 < len(order) and k + 1 in saves_after,
            )
        )
    return out


def _held_until(st: _LayerStats, pos: dict[int, int], n: int) -> int | None:
    """Layer.output_held_until in forward indices; n where the code held one of the layer's own saved outputs
    past the last layer's forward (other than as its input) or into the backward: through the loss point. None
    where the layer saved none of its outputs, or the code let go of them before any later layer started."""
    seen = st.output_held_until
    if not st.output_saved_bytes or seen is None:
        return None
    if seen == HELD_INTO_BACKWARD or (st.output_held_past is not None and pos[st.output_held_past] == n - 1):
        return n
    return pos[seen]


def _recompute_s(st: _LayerStats) -> float | None:
    """The re-run's time where it is measurably below the forward's (RERUN_BELOW), else None: the median
    forward (forward_s) times the median, over the re-run steps, of the re-run's time over the same step's
    forward. Paired so, what the machine does between steps (another process's load on shared caches, a clock
    boost) cancels out: compared across the timing and re-run steps, the same early stop of a GPT-2 block
    measured 0.75x its forward in one run and 0.93-1.0x in another."""
    if not st.rerun_s or not st.forward_s:
        return None
    ratios = [r / f for r, f in zip(st.rerun_s, st.checkpointed_forward_s, strict=True) if f > 0]
    if not ratios:
        return None
    ratio = statistics.median(ratios)
    return ratio * statistics.median(st.forward_s) if ratio < RERUN_BELOW else None


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


@dataclass
class TraceReport:
    """What the tracer noticed beyond the Trace's own fields (also logged as warnings)."""

    unowned: list[tuple[str, int]] = field(default_factory=list)
    """Bytes saved by ops between two traced layers, outside both (a norm, a residual add between
    sub-module layers), per gap: (the layer after which they were saved, bytes). No layer owns them, so no
    schedule moves them; the stage peaks they are live in (the layers' workspace) hold them."""
    code_held: list[tuple[str, int]] = field(default_factory=list)
    """Bytes per layer (name, bytes) of the storages it saves that the model's code also holds past its forward
    (StaticBytes.saved_held_by_code), in forward order."""
    optimizers: list[str] = field(default_factory=list)
    """Class names of the optimizers whose state the trace counts."""
    warnings: list[str] = field(default_factory=list)
    """Every warning the tracer logged, one line each."""
    probe_copy_latency_s: float | None = None
    """The copy probe's latency (measure_runtime_copy_speed) where the trace's was then calibrated through the
    replay (`_calibrated_serial_copies`); None where it was not."""

    @property
    def unowned_bytes(self) -> int:
        """All the bytes no layer owns. They are all live when the backward starts, so they add up to this
        much to the smallest feasible budget, which covering them by traced layers could save."""
        return sum(b for _, b in self.unowned)

    def warn(self, msg: str) -> None:
        self.warnings.append(msg)
        log.warning("%s", msg)


def _optimizers_run(model: nn.Module, seen: Sequence[torch.optim.Optimizer]) -> list[torch.optim.Optimizer]:
    """The optimizers among `seen` that step at least one of the model's parameters."""
    mine = {id(p) for p in model.parameters()}
    return [o for o in seen if any(id(p) in mine for g in o.param_groups for p in g["params"])]


def _check_optimizers(
    model: nn.Module,
    given: torch.optim.Optimizer | None,
    seen: Sequence[torch.optim.Optimizer],
    report: TraceReport,
) -> list[torch.optim.Optimizer]:
    """The optimizers whose state is static memory: the one given, and any other that the step ran over the
    model's parameters (a step that builds or holds its own). A given one that never stepped is an error: its
    state would be counted as whatever it holds now (0 B for a fresh Adam)."""
    ran = _optimizers_run(model, seen)
    if given is not None and all(o is not given for o in seen):
        raise TraceCheckError(
            f"optimizer: the step never called step() on the given {type(given).__name__}, so its state would be "
            "missing from the trace; call optimizer.step() in the step function (as Workload.step does), or give "
            "the optimizer the step really uses"
        )
    out = [given] if given is not None else []
    out += [o for o in ran if all(o is not g for g in out)]
    if given is not None and len(out) > 1:
        report.warn(
            f"optimizer: the step also ran {', '.join(type(o).__name__ for o in out[1:])} over the model's "
            "parameters; its state is counted too"
        )
    elif given is None and out:
        log.info("optimizer: counting the state of %s, which the step ran", ", ".join(type(o).__name__ for o in out))
    elif not out:
        report.warn(
            "optimizer: the step ran no torch.optim optimizer over the model's parameters, so the trace counts "
            "no optimizer state (0 B); if you train with one, give it: Workload(optimizer=...) in the factory, "
            "or trace(..., optimizer=...)"
        )
    report.optimizers = [type(o).__name__ for o in out]
    return out


def _check_times(layers: Sequence[Layer], step_s: float, report: TraceReport) -> None:
    """Per-layer times are parts of the step: far more than the step means they were inflated."""
    parts = sum(x.forward_s + x.backward_s for x in layers)
    ratio = _parts_ratio(parts, step_s)
    if ratio <= STEP_PARTS_WARN:
        return
    msg = (
        f"times: the layers' forward + backward sum to {format_seconds(parts)}, {ratio:.1f}x the measured step "
        f"({format_seconds(step_s)}) that contains them: the per-layer timings were inflated (CPU contention or "
        "too many threads); re-trace with --threads 1 (torch.set_num_threads(1)) on a quieter machine, or with "
        "more --steps"
    )
    if ratio > STEP_PARTS_FAIL:
        raise TraceCheckError(msg)
    report.warn(msg)


def _first_three(per_layer: Sequence[tuple[str, int]], preposition: str, noun: str) -> str:
    """'B of 'name', ...' for the first three (layer name, bytes), and how many more `noun` there are."""
    where = ", ".join(f"{format_bytes(b)} {preposition} {name!r}" for name, b in per_layer[:3])
    return where + (f" and {len(per_layer) - 3} more {noun}" if len(per_layer) > 3 else "")


def _check_ctx_held(mem: _MemoryStep, stats: Sequence[_LayerStats], report: TraceReport) -> None:
    """Say which layers keep tensors on a custom autograd Function's ctx, and what that costs a plan."""
    per_layer = [(stats[i].name, stats[i].ctx_held_bytes) for i in mem.order if stats[i].ctx_held_bytes]
    if not per_layer:
        return
    total = sum(b for _, b in per_layer)
    report.warn(
        f"layers: {format_bytes(total)} of tensors are kept as attributes of custom autograd Functions' ctx, "
        f"not through ctx.save_for_backward ({_first_three(per_layer, 'in', 'layers')}): no saved-tensor hook "
        "sees them, so no schedule offloads or frees them, and a recompute segment's re-run makes them again "
        "while the forward's are still held (priced: Layer.ctx_held_bytes). Saving them with "
        "ctx.save_for_backward lets a schedule move them"
    )


def _check_unowned(mem: _MemoryStep, stats: Sequence[_LayerStats], report: TraceReport) -> None:
    """Say which bytes no traced layer owns and what they cost the smallest feasible budget."""
    gaps = mem.between_bytes()
    report.unowned = [(stats[mem.order[k - 1]].name, b) for k, b in sorted(gaps.items())]
    if not report.unowned:
        return
    where = _first_three(report.unowned, "after", "gaps")
    report.warn(
        f"layers: {format_bytes(report.unowned_bytes)} of activations are saved by ops between the traced layers "
        f"({where}) and belong to no layer: no schedule can free them, and as they are all live when the "
        f"backward starts they add up to {format_bytes(report.unowned_bytes)} to the smallest feasible budget, "
        "and no recompute segment runs across those gaps (the replay re-runs only traced layers); select layers "
        "that cover them (the enclosing blocks, the default, or a wider --layer-pattern)"
    )


def _check_code_held(mem: _MemoryStep, stats: Sequence[_LayerStats], report: TraceReport) -> None:
    """Say which layers save storages that the model's code holds, and that they are counted as static."""
    per_layer: dict[int, int] = {}
    for sid, (_ref, nbytes) in mem.code_held.items():
        j = mem.owner[sid]
        per_layer[j] = per_layer.get(j, 0) + nbytes
    report.code_held = [(stats[j].name, b) for j, b in sorted(per_layer.items(), key=lambda kv: mem.order.index(kv[0]))]
    if not report.code_held:
        return
    where = _first_three(report.code_held, "of", "layers")
    report.warn(
        f"layers: {format_bytes(mem.code_held_bytes())} that the layers save are also held by the model's own code "
        f"past their forward ({where}): a local variable of the forward (an embedding output, a rotary table, "
        "a mask) or autocast's cache of weight casts. Offloading or recomputing them would free nothing, so no plan "
        "moves them and the trace counts them as static memory (saved_held_by_code); a forward that lets go of them "
        "(del the variable, autocast(cache_enabled=False)) gives the planner those bytes"
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
    warmup + 2 * steps + 2 times (2 * steps more where a stall inflated the first timing run: TIMING_RUNS).
    Layers are the repeated blocks, or the modules whose names match `layers` (regexes). Times are medians
    over `steps` steps after the warm-up; memory is one whole measured step.
    On the CPU (glibc) it keeps freed memory in the process from then on, heap untrimmed and no mmap
    (memsched.runtime.hostalloc), so that page faults do not move the step times it records.

    It refuses (TraceCheckError) a trace that cannot be right: a step that runs no backward, per-layer times
    far above the step, a given optimizer the step never steps. See `trace_with_report` for the warnings."""
    return trace_with_report(
        model,
        step_fn,
        layers=layers,
        steps=steps,
        warmup=warmup,
        model_id=model_id,
        batch_size=batch_size,
        seq_len=seq_len,
        optimizer=optimizer,
        measure_bandwidth=measure_bandwidth,
    )[0]


def trace_workload(w: Workload, **options: Any) -> tuple[Trace, TraceReport]:
    """`trace_with_report` of a Workload: its model and step, and its identity, shape and optimizer (the
    keyword `options` are trace_with_report's others: layers, steps, warmup, measure_bandwidth)."""
    return trace_with_report(
        w.model,
        w.step,
        model_id=w.model_id,
        batch_size=w.batch_size,
        seq_len=w.seq_len,
        optimizer=w.optimizer,
        **options,
    )


def _first_step(step_fn: StepFn, cache_handles: Sequence[RemovableHandle]) -> None:
    """The first warm-up step, which runs the user's code with nothing of memsched's in place but the KV-cache
    switch (runtime.kv_cache): where it raises, the model fails, not the trace. It is then run once more with
    that switch removed too. Failing again, the model fails on its own, and the user gets what it raised and
    the fix (UserCodeError). Passing, the switch broke it: the first error goes on as it was (internal)."""
    try:
        step_fn()
        return
    except MemschedError:
        raise
    except Exception as first:
        for h in cache_handles:
            h.remove()
        try:
            step_fn()
        except Exception:  # noqa: BLE001 - any failure of the plain retry means the model fails on its own
            raise UserCodeError(_step_failed(first)) from first
        raise


def out_of_memory(e: BaseException) -> bool:
    """An allocation that failed: CUDA's OutOfMemoryError, the CPU allocator's RuntimeError ("DefaultCPUAllocator:
    can't allocate memory"), or Python's MemoryError."""
    if isinstance(e, torch.OutOfMemoryError | MemoryError):
        return True
    return isinstance(e, RuntimeError) and "can't allocate memory" in str(e)


def _step_failed(e: Exception) -> str:
    """The one-line error for a training step that fails on its own (`_first_step`)."""
    what = f"{type(e).__name__}: {one_line(e)}"
    if out_of_memory(e):
        return (
            f"step: the model's training step ran out of device memory on its own, before memsched traced "
            f"anything ({what}). The tracer times and measures plain keep-all steps, so one must fit: trace "
            "with a smaller --batch-size or --seq-len, or on a device with more memory"
        )
    return (
        f"step: the model's training step raised {what}, in its first warm-up step and again with nothing of "
        "memsched's in place: the model fails on its own. Fix the model, its batch or its step; calling the "
        "factory's Workload.step() alone shows the traceback (docs/factory.md)"
    )


def trace_with_report(
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
) -> tuple[Trace, TraceReport]:
    """`trace`, and what the tracer noticed beyond the trace's fields (bytes no layer owns, the optimizers
    counted, the warnings it logged)."""
    if steps < 1 or warmup < 0:
        raise MemschedError(f"steps must be >= 1 and warmup >= 0 (got steps={steps}, warmup={warmup})")
    check_compiled(model)
    found = find_layers(model, layers)
    check_compiled(model, [m for _, m in found])
    p0 = next(model.parameters(), None)
    device = p0.device if p0 is not None else torch.device("cpu")
    modules = [m for _, m in found]
    stats = [_LayerStats(name, type(m).__name__) for name, m in found]
    report = TraceReport()
    if device.type == "cpu":
        # The replay's measurement keeps freed memory in the process (memsched.runtime.hostalloc); the times
        # it is compared with are taken the same way.
        steady_host_allocator()

    # Which optimizers the step really runs (a global step hook: a factory's own step may hold its own).
    stepped: list[torch.optim.Optimizer] = []

    def on_step(opt: torch.optim.Optimizer, _args: Any, _kwargs: Any) -> None:
        if all(o is not opt for o in stepped):
            stepped.append(opt)

    def cache_switched(m: nn.Module) -> None:
        msg = cache_message(m, "the traced training forwards, like those under a schedule,")
        if msg not in report.warnings:
            report.warn(msg)

    # The forwards are traced as a schedule replays them: without a KV cache (memsched.runtime.kv_cache).
    cache_handles = hook_caches(model, CacheOff(cache_switched))
    # Every layer runs in every traced step: LayerDrop off (memsched.runtime.layerdrop).
    no_layerdrop = contextlib.ExitStack()
    dropped = no_layerdrop.enter_context(layerdrop_off(model))
    if dropped:
        report.warn(
            f"LayerDrop ({', '.join(dropped)}) is off while tracing: the trace is the step that runs every layer, "
            "the most a step holds and the longest it takes; the replay runs the steps that skip layers"
        )
    try:
        hook = register_optimizer_step_post_hook(on_step)
        try:
            for w in range(warmup):
                if w == 0:
                    _first_step(step_fn, cache_handles)
                else:
                    step_fn()
            step_s = _time_step_and_layers(step_fn, modules, stats, device, steps)
        finally:
            hook.remove()
        optimizers = _check_optimizers(model, optimizer, stepped, report)
        names = [name for name, _ in found]
        checkpointed = _time_reruns(model, step_fn, names, modules, stats, Clock(device), report)
        held = _code_holds_probe(model, step_fn, modules, stats, device)
        mem, whole = _memory_step(model, step_fn, modules, stats, device, optimizers, held)
        in_order = ([names[o] for o in mem.order], [stats[o] for o in mem.order])
        machinery = _time_machinery(model, step_fn, *in_order, mem.saves_after, device, step_s, report)
        device_info = _device_info(device, measure_bandwidth, stats)
        if measure_bandwidth:
            device_info = _calibrated_serial_copies(model, step_fn, *in_order, device, step_s, device_info, report)
    finally:
        for h in cache_handles:
            h.remove()
        no_layerdrop.close()
    static = static_bytes(model, optimizers[0] if optimizers else None)
    for extra in optimizers[1:]:
        static.optimizer_state += static_bytes(model, extra).optimizer_state
    static.other += resident_beyond_static(model, static, whole)
    static.saved_before_layers = sum(nbytes for _, nbytes in mem.outside.values())
    static.saved_held_by_code = mem.code_held_bytes()
    _check_code_held(mem, stats, report)
    _check_ctx_held(mem, stats, report)
    workspace, forward_workspace = fit_workspace([stats[i] for i in mem.order], static.total, whole)
    traced = _layers(stats, mem.order, workspace, forward_workspace, mem.saves_after)
    _check_times(traced, step_s, report)
    _check_unowned(mem, stats, report)
    tr = Trace(
        model=model_id or type(model).__name__,
        batch_size=batch_size,
        seq_len=seq_len,
        dtype=_dtype_name(model),
        framework=framework_versions(),
        source="tracer",
        device=device_info,
        static=static,
        baseline=Baseline(step_s=step_s, peak_bytes=int(whole.peak_bytes)),
        layers=traced,
        rerun_overhead=machinery,
    )
    if checkpointed is not None:
        tr = with_checkpointed_forwards(tr, checkpointed)
    return tr, report
