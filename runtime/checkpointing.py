"""Recompute segments on PyTorch's non-reentrant checkpoint, opened and closed around the model's own loop.

A segment [a..b] is entered before layer a's forward and left after layer b's (the way
torch.distributed._composable.checkpoint does it for one module), so the user's model code runs unchanged.
The checkpoint keeps only the segment's inputs. For its recomputation it re-runs layers a..b in order,
feeding each layer the recomputed outputs of the earlier ones: the tensors a layer received that were
outputs of an earlier layer of the segment are recorded as links (by identity), everything else by value.
RNG state (CPU and device) is stashed at entry and restored for the recomputation, so dropout matches; and
before each later layer of the segment too, as its forward found it: code between the layers that draws random
numbers (LayerDrop's draw per layer) is not re-run, and would otherwise shift every later layer's dropout masks.

Layers that a forward skips (LayerDrop, stochastic depth skipping whole blocks) are skipped by the recomputation
too: it re-runs the layers that ran, in order, and a skipped first layer moves the segment's start to the first
that ran (runtime/replay.py).

Buffers: a forward may change its module's buffers (BatchNorm's running statistics and
`num_batches_tracked`). A recomputation must neither apply that change a second time nor read the changed
value where the original forward read the old one. So each recompute layer's forward snapshots the buffers it
changes (learned per layer from the forwards seen: the first forward snapshots all of the layer's buffers and
keeps the copies of those that changed), and its recomputation runs against private copies of those
snapshots, swapped into the modules for the call; the real buffers are never written in backward.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils import checkpoint as _cp

from memsched.errors import ScheduleMismatchError

log = logging.getLogger(__name__)

# torch >= 2.5 added `early_stop` before *args; pass the fixed parameters positionally in the right shape.
_GEN = _cp._checkpoint_without_reentrant_generator
_HAS_EARLY_STOP = "early_stop" in inspect.signature(_GEN).parameters


@dataclass(frozen=True)
class _Link:
    """Placeholder for a tensor that was output `path` of segment layer `layer`."""

    layer: int
    """Global layer index of the producer."""
    path: tuple[Any, ...]
    """Where the tensor sits in the producer's output (tuple indices / dict keys)."""


def flatten(obj: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], torch.Tensor]]:
    """(path, tensor) for every tensor in nested tuples / lists / dicts (ModelOutput is a dict)."""
    if isinstance(obj, torch.Tensor):
        yield path, obj
    elif isinstance(obj, tuple | list):
        for i, v in enumerate(obj):
            yield from flatten(v, (*path, i))
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from flatten(v, (*path, k))


def get_path(obj: Any, path: tuple[Any, ...]) -> Any:
    for p in path:
        obj = obj[p]
    return obj


def map_tensors(obj: Any, fn: Callable[[torch.Tensor], Any]) -> Any:
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
        return tuple(map_tensors(v, fn) for v in obj)
    if isinstance(obj, list):
        return [map_tensors(v, fn) for v in obj]
    if type(obj) is dict:
        return {k: map_tensors(v, fn) for k, v in obj.items()}
    return obj


@dataclass
class BufferSnapshot:
    """One forward of one recompute layer: its buffers as the forward found them."""

    seen: list[tuple[torch.Tensor | None, int]]
    """Per buffer slot of the layer: the tensor in the slot at entry and its version counter."""
    values: dict[int, torch.Tensor]
    """Slot -> a copy of its value at entry (after the forward: only for slots the forward changed)."""
    changed: list[int] = field(default_factory=list)
    """Slots the forward changed (in place, or by assigning a new tensor), set when it returns."""


class LayerBuffers:
    """The buffer slots under one recompute layer and, learned across its forwards, which of them it changes.

    A change is a new tensor in the slot or a bumped version counter, and, in the layer's first forward, any
    change of value (BatchNorm writes its running statistics without bumping their version). Later forwards
    snapshot only the slots learned then; one that changes later with a version bump is found and warned about
    (its recomputation in that step reads the changed value); one changed later by such a silent kernel would
    not be: no module we know of does that only after its first training forward."""

    def __init__(self, name: str, module: nn.Module) -> None:
        self.name = name
        # (owner, attribute): a slot, not a tensor, so a buffer replaced by assignment is still found.
        self.slots: list[tuple[nn.Module, str]] = [
            (m, b) for m in module.modules() for b, t in m._buffers.items() if t is not None
        ]
        self.changing: set[int] | None = None
        """Slots a forward of this layer changed so far; None before its first forward."""
        self._warned: set[int] = set()

    def changing_bytes(self) -> int:
        """Bytes of the slots its forwards were seen to change (0 before its first forward)."""
        total = 0
        for k in sorted(self.changing or ()):
            t = self._current(k)
            if t is not None:
                total += int(t.untyped_storage().nbytes())
        return total

    def _current(self, k: int) -> torch.Tensor | None:
        m, b = self.slots[k]
        return m._buffers.get(b)

    def before(self) -> BufferSnapshot:
        """At the start of the layer's forward."""
        seen = []
        for k in range(len(self.slots)):
            t = self._current(k)
            seen.append((t, t._version if t is not None else 0))
        todo = range(len(self.slots)) if self.changing is None else sorted(self.changing)
        with torch.no_grad():
            values = {k: t.clone() for k in todo if (t := seen[k][0]) is not None}
        return BufferSnapshot(seen, values)

    def after(self, snap: BufferSnapshot) -> None:
        """At the end of the layer's forward: which slots it changed; keep only their snapshots."""
        first = self.changing is None
        changing = self.changing or set()
        changed = []
        for k, (t0, v0) in enumerate(snap.seen):
            t = self._current(k)
            if t is not t0 or (t is not None and t._version != v0):
                changed.append(k)
            elif t is not None and (k in changing if not first else not torch.equal(t, snap.values[k])):
                # Kernels may write a buffer without bumping its version (BatchNorm's running statistics):
                # the first forward compares values; a buffer it changed is snapshotted from then on.
                changed.append(k)
        snap.changed = changed
        snap.values = {k: v for k, v in snap.values.items() if k in set(changed)}
        for k in changed:
            if k not in snap.values and k not in self._warned:
                self._warned.add(k)
                m, b = self.slots[k]
                log.warning(
                    "layer %s: this forward changed buffer %r of %s, which its earlier forwards left alone; this "
                    "step's recomputation reads the changed value (later steps snapshot it first)",
                    self.name,
                    b,
                    type(m).__name__,
                )
        self.changing = changing | set(changed)

    @contextlib.contextmanager
    def isolated(self, snap: BufferSnapshot) -> Iterator[None]:
        """During a recomputation: the changed slots hold private copies of the values the forward saw, so the
        recomputation reads what the forward read and its writes go nowhere."""
        saved = []
        with torch.no_grad():
            for k in snap.changed:
                m, b = self.slots[k]
                cur = m._buffers.get(b)
                src = snap.values.get(k, cur)
                # A copy each time: a second backward over the graph (retain_graph) recomputes again.
                m._buffers[b] = src.clone() if src is not None else None
                saved.append((m, b, cur))
        try:
            yield
        finally:
            for m, b, cur in saved:
                m._buffers[b] = cur


@dataclass
class Segment:
    """One open checkpointed segment during the original forward."""

    start: int
    """First layer index."""
    end: int
    """Last layer index."""
    modules: list[torch.nn.Module]
    """The segment's modules, start..end."""
    gen: Any = None
    """The checkpoint generator, suspended inside the checkpointed region."""
    outputs: dict[int, tuple[int, tuple[Any, ...], weakref.ref[torch.Tensor]]] = field(default_factory=dict)
    """id(tensor) -> (layer, path, a weak reference to it) for outputs of segment layers seen so far (valid during
    the forward). Weak: holding the outputs would keep every layer's output of the segment alive until its last
    layer's forward ends, which the cost model does not charge (a 4-block ResNet-50 segment held 12 MiB more
    at its third block); the reference tells a live output from a new tensor that reuses a dead one's id."""
    inputs: dict[int, tuple[tuple[Any, ...], dict[str, Any]]] = field(default_factory=dict)
    """Layer -> its (args, kwargs) with links in place of segment outputs (layers after start only)."""
    glue_saves: bool = False
    """Whether code since the segment's last layer to run saved tensors (kept as plain saves, out of the
    checkpoint; where another layer of the segment follows, the recomputation would not re-run that code)."""
    rng: dict[int, _RngState] = field(default_factory=dict)
    """Layer -> the RNG state its forward found, where the code since the segment's previous layer drew random
    numbers (layers after start only; elsewhere the re-run of the layers before leaves the state it found)."""
    rng_left: bytes = b""
    """The RNG state as the segment's latest layer to run left it (`_RngState.key`)."""
    buffers: list[LayerBuffers] = field(default_factory=list)
    """Per segment layer (start..end): its buffer slots; empty when no layer has buffers."""
    snapshots: dict[int, BufferSnapshot] = field(default_factory=dict)
    """Layer -> its buffers as this forward found them (layers that have buffers)."""
    on_finish: Callable[[], None] | None = None
    """Run once the checkpoint generator has finished (close) or been unwound (abort): leaves the hooks the
    caller entered beneath the checkpoint's own."""

    def buffers_before(self, layer: int) -> None:
        if self.buffers and self.buffers[layer - self.start].slots:
            self.snapshots[layer] = self.buffers[layer - self.start].before()

    def buffers_after(self, layer: int) -> None:
        snap = self.snapshots.get(layer)
        if snap is not None:
            self.buffers[layer - self.start].after(snap)
            if not snap.changed:
                del self.snapshots[layer]

    def _isolated(self, layer: int) -> contextlib.AbstractContextManager[None]:
        snap = self.snapshots.get(layer)
        if snap is None:
            return contextlib.nullcontext()
        return self.buffers[layer - self.start].isolated(snap)

    def record_inputs(self, layer: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        def link(t: torch.Tensor) -> Any:
            hit = self.outputs.get(id(t))
            return _Link(hit[0], hit[1]) if hit is not None and hit[2]() is t else t

        self.inputs[layer] = (map_tensors(args, link), map_tensors(kwargs, link))
        state = _RngState.now((args, kwargs))
        # Kept only where it moved since the last layer (LayerDrop draws before each layer).
        if state.key() != self.rng_left:
            self.rng[layer] = state

    def record_outputs(self, layer: int, out: Any) -> None:
        for path, t in flatten(out):
            self.outputs[id(t)] = (layer, path, weakref.ref(t))
        self.rng_left = _RngState.now(out).key()

    def forget_outputs(self) -> None:
        self.outputs.clear()

    def recompute_fn(
        self, enter_recompute: Callable[[], contextlib.AbstractContextManager[None]]
    ) -> Callable[..., None]:
        """What the checkpoint runs in backward: layers start..end, chained through the recorded links."""

        def run(*args: Any, **kwargs: Any) -> None:
            with enter_recompute():
                with self._isolated(self.start):
                    outs: dict[int, Any] = {self.start: self.modules[0](*args, **kwargs)}
                for k in sorted(self.inputs):  # the layers that ran after start, in order
                    a, kw = self.inputs[k]
                    if k in self.rng:  # within the checkpoint's fork of the RNG: put back after the re-run
                        self.rng[k].restore()

                    def resolve(x: Any) -> Any:
                        return get_path(outs[x.layer], x.path) if isinstance(x, _Link) else x

                    a = _map_links(a, resolve)
                    kw = _map_links(kw, resolve)
                    with self._isolated(k):
                        outs[k] = self.modules[k - self.start](*a, **kw)

        return run

    def open(
        self,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        enter_recompute: Callable[[], contextlib.AbstractContextManager[None]],
        context_fn: Callable[[], tuple[Any, Any]],
    ) -> None:
        fn = self.recompute_fn(enter_recompute)
        if _HAS_EARLY_STOP:
            self.gen = _GEN(fn, True, context_fn, "default", False, True, *args, **kwargs)
        else:  # pragma: no cover - torch < 2.5
            self.gen = _GEN(fn, True, context_fn, "default", False, *args, **kwargs)
        next(self.gen)

    def close(self) -> None:
        gen, self.gen = self.gen, None
        self.forget_outputs()
        try:
            if gen is None:
                return
            try:
                next(gen)
            except StopIteration:
                return
            raise AssertionError("the checkpoint generator did not finish")
        finally:
            self._finish()

    def abort(self) -> None:
        """The forward raised inside the segment: unwind the checkpoint's hooks without finishing it."""
        gen, self.gen = self.gen, None
        self.forget_outputs()
        try:
            if gen is not None:
                gen.close()
        finally:
            self._finish()

    def _finish(self) -> None:
        done, self.on_finish = self.on_finish, None
        if done is not None:
            done()


@dataclass(frozen=True)
class _RngState:
    """The CPU RNG state and that of each accelerator holding one of a layer's inputs, as the checkpoint stashes
    them for its first layer. Held as bytes: host bookkeeping like the replay's other records, not tensors on the
    device's allocator (a CPU generator's state is 5 KiB, a CUDA one's 16 bytes)."""

    cpu: bytes
    """torch.get_rng_state()'s bytes."""
    device_ids: list[int]
    """Accelerator indices, one per device."""
    device_states: list[bytes]
    """Their RNG states' bytes, in that order."""
    device_type: str | None
    """Their device type (cuda, ...); None without one."""

    @staticmethod
    def now(inputs: Any) -> _RngState:
        one_per_device: dict[torch.device, torch.Tensor] = {}
        for _, t in flatten(inputs):
            if t.device.type not in ("cpu", "meta"):
                one_per_device.setdefault(t.device, t)
        tensors = list(one_per_device.values())
        ids, states = _cp.get_device_states(*tensors) if tensors else ([], [])
        device_type = _cp._infer_device_type(*tensors) if tensors else None
        return _RngState(_bytes(torch.get_rng_state()), ids, [_bytes(x) for x in states], device_type)

    def key(self) -> bytes:
        """Equal keys, equal states."""
        return b"".join((self.cpu, *self.device_states, bytes(self.device_ids)))

    def restore(self) -> None:
        torch.set_rng_state(_tensor(self.cpu))
        if self.device_ids:
            states = [_tensor(x) for x in self.device_states]
            _cp.set_device_states(self.device_ids, states, device_type=self.device_type)


def _bytes(state: torch.Tensor) -> bytes:
    return state.numpy().tobytes()


def _tensor(state: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(state), dtype=torch.uint8)


def _map_links(obj: Any, fn: Callable[[Any], Any]) -> Any:
    if isinstance(obj, _Link):
        return fn(obj)
    if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
        return tuple(_map_links(v, fn) for v in obj)
    if isinstance(obj, list):
        return [_map_links(v, fn) for v in obj]
    if type(obj) is dict:
        return {k: _map_links(v, fn) for k, v in obj.items()}
    return obj


def glue_error(start: int, end: int, names: list[str]) -> ScheduleMismatchError:
    return ScheduleMismatchError(
        f"recompute segment {names[0]}..{names[-1]} (layers {start}..{end}) cannot be replayed on this model: "
        "code between those layers saves tensors for backward, which the segment's recomputation would not "
        "re-run. A trace records such gaps (code_after_saves) and the solver ends every segment there: trace the "
        "model again with this memsched and solve again from that trace"
    )
