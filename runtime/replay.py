"""Replay a Schedule in the user's eager training loop: `apply_schedule(model, schedule)`.

Each scheduled layer is wrapped by module hooks (memsched.runtime.wrapping, shared with the tracer; removed on
exit; nothing is stored on the model, so a deep copy or a pickle of it is the plain model, and its code and
state_dict are unchanged):

- keep: the layer's saved tensors are only registered (attribution, CPU ledger); where it shares no saved storage
  with an offload layer and no ledger counts, not even that: it runs as it would unscheduled (`bare_kept_layers`).
- offload: saved tensors whose index (in save order, one per storage) the schedule lists are copied into a
  pooled host buffer as autograd saves them (side D2H stream on CUDA); the device storage is dropped at the
  end of the forward of layer `done_by` after waiting on that copy's event; the prefetch is issued when the
  backward of layer `prefetch_at` starts (a hook on that layer's output gradient); an unpack waits only on
  its own copy's event (and issues the copy itself if backward needs it earlier than scheduled).
- recompute: PyTorch's non-reentrant checkpoint over the segment [first..last], RNG state preserved; the
  buffers a forward changes are snapshotted and the recomputation runs on private copies (checkpointing.py).

A training step is detected as one forward pass over the layers (a pass starts at the first traced layer);
all bookkeeping is per pass, so nothing accumulates across steps.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import math
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from memsched.errors import ScheduleMismatchError
from memsched.runtime.checkpointing import LayerBuffers, Segment, flatten, glue_error
from memsched.runtime.copier import Copier
from memsched.runtime.kv_cache import CacheOff, cache_message, hook_caches
from memsched.runtime.ledger import SavedLedger
from memsched.runtime.linkcheck import check_link
from memsched.runtime.offload import OffloadRecord
from memsched.runtime.plan import LayerPlan, RuntimePlan, build_plan
from memsched.runtime.pool import HostBufferPool, PoolStats
from memsched.runtime.storage import ModuleTensors, StaticStorages, storage_key, tensor_nbytes
from memsched.runtime.wrapping import LayerHooks, check_compiled, is_wrapped
from memsched.schema import Action, Schedule, Trace

log = logging.getLogger(__name__)


def _top_hooks() -> tuple[Callable[[torch.Tensor], Any], Callable[[Any], torch.Tensor]] | None:
    top = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)
    return top(True) if top is not None else None


class _Observer(torch.autograd.graph.saved_tensors_hooks):
    """Sees every tensor saved in its scope, then hands it to the hooks it was entered over (checkpoint's),
    so the ledger can count what a checkpointed region saves and recomputes without changing it. A save that
    `on_pack` answers True for is kept as a plain save instead, out of those hooks."""

    def __init__(self, on_pack: Callable[[torch.Tensor], bool | None]) -> None:
        self._on_pack = on_pack

        def identity(x: Any) -> Any:
            return x

        super().__init__(identity, identity)

    def __enter__(self) -> None:
        inner = _top_hooks()
        inner_pack, inner_unpack = inner if inner is not None else (lambda x: x, lambda x: x)
        on_pack = self._on_pack

        def pack(x: torch.Tensor) -> Any:
            if on_pack(x):
                return _Plain(_keep(x))
            return inner_pack(x)

        def unpack(packed: Any) -> Any:
            return packed.tensor if isinstance(packed, _Plain) else inner_unpack(packed)

        self.pack_hook = pack
        self.unpack_hook = unpack
        super().__enter__()


@dataclass(frozen=True)
class _Plain:
    """A save an `_Observer` kept out of the hooks beneath it."""

    tensor: torch.Tensor
    """The saved tensor, detached (`_keep`)."""


class _Pass:
    """Bookkeeping of one forward pass (one training step) and its backward."""

    def __init__(self, n: int, model_tensors: ModuleTensors) -> None:
        self._model_tensors = model_tensors
        self._static: StaticStorages | None = None
        self.claims: dict[int, tuple[int, weakref.ref[torch.UntypedStorage]]] = {}
        self.next_index = [0] * n
        self.offloaded: dict[int, tuple[weakref.ref[torch.UntypedStorage], OffloadRecord]] = {}
        self.records: dict[int, list[OffloadRecord]] = {}
        self.offloaded_bytes = [0] * n
        # Storages claimed at a place the trace counts with 0 bytes: static memory in the cost model (saved by code
        # before the layers, or held by the model's code: StaticBytes.saved_static), so never moved, and not in
        # the ledger, which measures the saved part a schedule moves.
        self.static_saves: dict[int, weakref.ref[torch.UntypedStorage]] = {}
        self.last_forward = -1
        self.backward_started: set[int] = set()
        # The storages of the outputs (with grad) of the layers that claim nothing (claiming_layers): alive while
        # this forward's graph is (a later layer or checkpoint keeps them), so they stand in for the claims.
        self.outputs: list[weakref.ref[torch.UntypedStorage]] = []
        # Whether a layer of this pass returned fewer / more output bytes than traced (`_check_shapes`): a step at
        # another batch size or sequence length, which explains offloaded bytes other than the planned ones.
        self.smaller = False
        self.larger = False
        # The layers that ran in this forward (a model may skip some: LayerDrop), and the last done-by stage whose
        # releases were made (those of skipped stages are made at the next layer that runs).
        self.ran: set[int] = set()
        self.released_through = -1

    def owner(self, s: torch.UntypedStorage) -> int | None:
        hit = self.claims.get(id(s))
        if hit is not None and hit[1]() is s:
            return hit[0]
        return None

    def claim(
        self, s: torch.UntypedStorage, layer: int, static_places: frozenset[int] = frozenset()
    ) -> tuple[int, int | None]:
        """(owner, index in the owner's save order if this call made the claim, else None). A claim at one of
        `static_places` (the layer's 0-byte places in the trace) makes the storage a static save."""
        owner = self.owner(s)
        if owner is not None:
            return owner, None
        self.claims[id(s)] = (layer, weakref.ref(s))
        idx = self.next_index[layer]
        self.next_index[layer] += 1
        if idx in static_places:
            self.static_saves[id(s)] = weakref.ref(s)
        return layer, idx

    def is_static_save(self, s: torch.UntypedStorage) -> bool:
        hit = self.static_saves.get(id(s))
        return hit is not None and hit() is s

    def offload_record(self, s: torch.UntypedStorage) -> OffloadRecord | None:
        """The record of this very storage if it was offloaded in this pass (ids of dead storages are
        reused by new ones, so the weak reference decides)."""
        hit = self.offloaded.get(id(s))
        if hit is not None and hit[0]() is s and not hit[1].finished:
            return hit[1]
        return None

    @property
    def static(self) -> StaticStorages:
        """The storages of the model's parameters and buffers, read when first needed in the pass (a pass whose
        layers all run bare never needs them: reading them all costs a small CPU step 2-3%)."""
        if self._static is None:
            self._static = StaticStorages().add_module(self._model_tensors)
        return self._static

    def is_static(self, x: torch.Tensor) -> bool:
        return x in self.static


@dataclass
class _Call:
    """What `enter` started for one layer call, for `leave` / `fail`."""

    plan: LayerPlan | None
    """The layer's plan; None for a call run as is (grad disabled, or inside a recomputation)."""
    hooks: Any = None
    """The saved-tensor hooks entered for a keep/offload layer."""
    segment: Segment | None = None
    """The recompute segment this call belongs to."""


_PLAIN = _Call(None)


def _unwrapped(model: nn.Module) -> nn.Module:
    """What a pickled ScheduledModel loads as: its model, plain."""
    return model


class ScheduledModel:
    """The model with a schedule applied. Call it like the model; attributes are the model's.
    Use as a context manager (removed on exit) or keep it and call `remove()`.

    A deep copy or a pickle (`torch.save`) of it, or of its model, is the plain model: an independent
    nn.Module that runs its own weights, unscheduled (apply a schedule to the copy to schedule it)."""

    def __init__(
        self,
        model: nn.Module,
        schedule: Schedule,
        trace: Trace | None = None,
        layers: Sequence[str] | None = None,
        ledger: SavedLedger | None = None,
        pool: HostBufferPool | None = None,
        host_budget: int | Literal["schedule"] | None = "schedule",
    ) -> None:
        self.model = model
        self.schedule = schedule
        self.trace = trace
        check_compiled(model)
        self.plan: RuntimePlan = build_plan(model, schedule, trace, layers)
        check_compiled(model, self.plan.modules)
        p = next(model.parameters(), None)
        self.device = p.device if p is not None else torch.device("cpu")
        self.copier = Copier(self.device)
        self.link_warning = check_link(schedule, self.device)  # the plan's copy rates vs this link's, once
        limit = schedule.host_budget_bytes if host_budget == "schedule" else host_budget
        if pool is None:
            pool = HostBufferPool(pin_memory=self.device.type == "cuda", limit_bytes=limit)
        elif host_budget != "schedule" or pool.limit_bytes is None:
            pool.limit_bytes = limit  # a shared pool takes the limit given here, or the schedule's if it has none
        self.pool = pool
        self.ledger = ledger
        self._tls = threading.local()
        self._pass: _Pass | None = None
        self._segment: Segment | None = None
        self._warned: set[str] = set()
        # The largest output-bytes ratio over the trace warned of so far (`_check_shapes`).
        self._warned_ratio = 1.0
        self._priced_holds = None if trace is None else _priced_holds(trace)
        # Per layer, the places in its save order that the trace counts with 0 bytes (Pass.static_saves).
        self._static_places: list[frozenset[int]] = (
            [frozenset(k for k, b in enumerate(x.saved_tensor_bytes) if b == 0) for x in trace.layers]
            if trace is not None
            else [frozenset()] * self.plan.n
        )
        self._buffers = [
            LayerBuffers(lp.name, m) if lp.action == Action.RECOMPUTE else None
            for lp, m in zip(self.plan.layers, self.plan.modules, strict=True)
        ]
        # The modules' parameters and buffers, read each step (they are static memory: `_Pass.static`).
        self._model_tensors = ModuleTensors(model)
        self._layer_tensors = [ModuleTensors(m) for m in self.plan.modules]
        self._claims = claiming_layers(self.plan, trace, counting=ledger is not None)
        self._bare = bare_kept_layers(self.plan, trace, counting=ledger is not None)
        self._hooks: LayerHooks | None = None
        self._cache_handles: list[RemovableHandle] = []
        self._install()

    # -- public --------------------------------------------------------------------------------------------

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.model(*args, **kwargs)

    def changed_buffer_bytes(self) -> list[int]:
        """Per layer of the plan: bytes of the buffers its forwards were seen to change, learned where it is
        recomputed (the snapshots a recompute keeps); 0 for the other layers."""
        return [0 if b is None else b.changing_bytes() for b in self._buffers]

    def __getattr__(self, name: str) -> Any:
        if name == "model":  # not yet set: avoid recursing during construction
            raise AttributeError(name)
        return getattr(self.model, name)

    def __deepcopy__(self, memo: dict[int, Any]) -> nn.Module:
        return copy.deepcopy(self.model, memo)

    def __reduce__(self) -> tuple[Callable[[nn.Module], nn.Module], tuple[nn.Module]]:
        return (_unwrapped, (self.model,))

    def __enter__(self) -> ScheduledModel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()

    def remove(self) -> None:
        """Take the schedule off the model (its hooks; the model's code and state were never changed)."""
        hooks, self._hooks = self._hooks, None
        if hooks is not None:
            hooks.unwind(keep=0)
            hooks.remove()
        for h in self._cache_handles:
            h.remove()
        self._cache_handles.clear()
        if self._segment is not None:
            self._segment.abort()
            self._segment = None

    def pool_stats(self) -> PoolStats:
        return self.pool.stats()

    # -- installation --------------------------------------------------------------------------------------

    def _install(self) -> None:
        for name, m in zip(self.schedule.layer_names, self.plan.modules, strict=True):
            if getattr(m, "gradient_checkpointing", False) is True:
                # The framework would checkpoint the block around our hooks and the two would fight.
                raise ScheduleMismatchError(
                    f"layer {name!r} has the framework's gradient checkpointing on; the schedule decides what is "
                    "recomputed: call model.gradient_checkpointing_disable() before applying it"
                )
            if is_wrapped(m):
                raise ScheduleMismatchError(
                    f"a schedule is already applied to {type(m).__name__}; remove it (leave its `with` block or "
                    "call .remove()) before applying another"
                )
        self._hooks = LayerHooks(self.plan.modules, self)
        # Every plan, keep-all too: the trace was taken without the cache (memsched.runtime.kv_cache).
        self._cache_handles = hook_caches(self.model, CacheOff(self._cache_switched))

    def _cache_switched(self, model: nn.Module) -> None:
        if "use_cache" not in self._warned:
            self._warned.add("use_cache")
            log.warning("%s", cache_message(model, "training forwards under the schedule"))

    # -- per-thread state ----------------------------------------------------------------------------------

    def _stack(self) -> list[int]:
        st = getattr(self._tls, "stack", None)
        if st is None:
            st = self._tls.stack = []
        return st

    def _recomputing(self) -> int:
        return int(getattr(self._tls, "recomputing", 0))

    @contextlib.contextmanager
    def _recompute_scope(self) -> Iterator[None]:
        self._tls.recomputing = self._recomputing() + 1
        try:
            yield
        finally:
            self._tls.recomputing -= 1

    # -- around each layer's forward (LayerCalls, memsched.runtime.wrapping) --------------------------------

    def enter(self, i: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> _Call:
        if not torch.is_grad_enabled():
            return _PLAIN
        stack = self._stack()
        if self._recomputing():
            # Inside a checkpoint's recomputation: run as is; the stack attributes what it saves.
            stack.append(i)
            return _Call(None, segment=None)
        plan = self.plan.layers[i]
        p = self._pass
        if p is None or i <= p.last_forward:
            if stack and self._hooks is not None:
                # The layers do not nest, so a layer call still open as a forward begins was cut off by a
                # BaseException (KeyboardInterrupt: the always-call hooks run on Exception only): undo it.
                stack.clear()
                self._hooks.unwind(keep=1)
            if p is not None:
                self._check_overlap(p, plan.name)
            p = self._new_pass()
        p.last_forward = i
        p.ran.add(i)
        if self._segment is not None and i > self._segment.end:
            # The open segment's last layers did not run in this forward (LayerDrop): it ends where its last layer
            # to run did. The code since then saved outside it (`_open_segment`'s observer).
            self._close_segment()
        if i == self.plan.n - 1 and self._priced_holds is not None:
            self._check_code_holds(p, args, kwargs)
        # Parameters a sharding wrapper (FSDP) gathers just before this layer runs are new storages: still
        # static memory, never activations to offload or count (a layer that claims nothing never asks).
        if self._claims[i]:
            p.static.add_module(self._layer_tensors[i])
        if self.ledger is not None:
            self.ledger.mark(f"F{i}")
        seg = self._segment
        if plan.action == Action.RECOMPUTE:
            assert plan.segment is not None
            end = plan.segment[1]
            if seg is None:
                # At the segment's first layer; or past it, where this forward skipped the layers before (LayerDrop):
                # the segment starts at the first of its layers to run.
                seg = self._open_segment(p, i, end, args, kwargs)
            else:
                assert seg.end == end and seg.start < i, (seg.start, seg.end, i)
                if seg.glue_saves:
                    self._segment = None
                    seg.abort()
                    raise glue_error(seg.start, end, [self.plan.layers[seg.start].name, self.plan.layers[end].name])
                seg.record_inputs(i, args, kwargs)
            seg.buffers_before(i)
        call = _Call(plan, segment=seg if plan.action == Action.RECOMPUTE else None)
        if plan.action != Action.RECOMPUTE and not self._bare[i]:
            call.hooks = torch.autograd.graph.saved_tensors_hooks(self._packer(p, i), _unpack)
            call.hooks.__enter__()
        stack.append(i)
        return call

    def fail(self, i: int, call: _Call) -> None:
        if call is _PLAIN:
            return
        stack = self._stack()
        if stack:
            stack.pop()
        if call.hooks is not None:
            call.hooks.__exit__(None, None, None)
        if call.plan is not None and self._segment is not None:
            self._segment.abort()
            self._segment = None

    def leave(self, i: int, call: _Call, out: Any) -> None:
        if call is _PLAIN:
            return
        self._stack().pop()
        plan = call.plan
        if plan is None:  # a recomputation
            return
        if call.hooks is not None:
            call.hooks.__exit__(None, None, None)
        p = self._pass
        assert p is not None
        seg = call.segment
        if seg is not None:
            seg.buffers_after(i)
            if i < seg.end:
                seg.record_outputs(i, out)
            else:
                self._close_segment()
        self._check_shapes(p, i, out)
        self._hook_backward(p, i, out, note_outputs=not self._claims[i])
        # The done-by stages up to this layer, those of layers this forward skipped (LayerDrop) included.
        for k in range(p.released_through + 1, i + 1):
            for j in self.plan.release_at.get(k, ()):
                for rec in p.records.get(j, ()):
                    rec.release_device()
                self._check_offloaded(p, j)
        p.released_through = max(p.released_through, i)

    def _close_segment(self) -> None:
        """Close the open segment: after its last layer, or where this forward skipped its last layers, at the next
        layer to run (with none, the next forward aborts it: `_new_pass`)."""
        seg, self._segment = self._segment, None
        assert seg is not None
        seg.close()

    def _check_overlap(self, p: _Pass, name: str) -> None:
        """Warn (once) where a forward begins while the previous one's saved tensors are alive and its backward has
        not begun: two forwards before one backward (a siamese or contrastive loss), or a layer called twice in one
        forward (ALBERT's shared layer). Each forward holds its own activations, so the step holds more than the
        plan, which is priced for one forward and its backward at a time. A forward whose graph was dropped (no
        backward meant) holds nothing by then, and passes."""
        if "overlap" in self._warned or p.backward_started or p.last_forward < 0:
            return
        if not any(ref() is not None for _, ref in p.claims.values()) and not any(r() is not None for r in p.outputs):
            return
        self._warned.add("overlap")
        log.warning(
            "memsched: layer %r began a forward while the previous forward's saved tensors were still alive and "
            "its backward had not begun (two forwards before one backward, or a layer called twice in one "
            "forward): each forward holds its own activations, and the schedule is planned and budgeted for one "
            "forward and its backward at a time, so this step can peak above the budget. Run the backward of "
            "each forward before the next one, or trace and solve a step that does what this one does",
            name,
        )

    def _new_pass(self) -> _Pass:
        if self._segment is not None:  # the previous forward stopped inside a segment
            self._segment.abort()
            self._segment = None
        self._pass = _Pass(self.plan.n, self._model_tensors)
        return self._pass

    def _check_shapes(self, p: _Pass, i: int, out: Any) -> None:
        """With a trace: a layer's output bytes against the traced ones. A larger step (a longer sequence, a bigger
        batch) holds more than the schedule was solved for and can break its budget: a warning, and again each
        time a step outgrows the last one warned of by a tenth, so a later, longer batch is not hidden behind the
        first. A smaller one (dynamic padding's short batches) holds smaller tensors: said once, at INFO."""
        if self.trace is None:
            return
        traced = self.trace.layers[i].output_bytes
        got = _output_bytes(out)
        if got == traced:
            return
        shapes = f"batch_size={self.trace.batch_size}" + (
            "" if self.trace.seq_len is None else f", seq_len={self.trace.seq_len}"
        )
        name = self.plan.layers[i].name
        if got > traced:
            p.larger = True
            ratio = got / traced if traced else math.inf
            if ratio <= self._warned_ratio * 1.1:
                return
            self._warned_ratio = ratio
            log.warning(
                "layer %s returned %d bytes of output, more than the %d traced (%s): this step is larger than the "
                "one the schedule was solved for, and can peak above its budget. Trace and solve at the largest "
                "batch size and sequence length you train with (with dynamic padding: the longest batch)",
                name,
                got,
                traced,
                shapes,
            )
            return
        p.smaller = True
        if "shapes:smaller" not in self._warned:
            self._warned.add("shapes:smaller")
            log.info(
                "layer %s returned %d bytes of output, fewer than the %d traced (%s): this step is smaller than the "
                "one the schedule was solved for, so its tensors are too; the schedule's prediction (peak, step "
                "time) is the traced step's",
                name,
                got,
                traced,
                shapes,
            )

    def _check_offloaded(self, p: _Pass, j: int) -> None:
        plan = self.plan.layers[j]
        got, planned = p.offloaded_bytes[j], plan.offload_bytes
        if j not in p.ran or got == planned or (p.smaller and got < planned) or (p.larger and got > planned):
            return  # the traced bytes, or a step at other shapes, which _check_shapes has told of
        key = f"{plan.name}:{'more' if got > planned else 'less'}"
        if key in self._warned:
            return
        self._warned.add(key)
        if got > planned:
            log.warning(
                "layer %s: the schedule offloads %d bytes but this step offloaded %d: its saved tensors are larger "
                "than the schedule's (a longer sequence or a bigger batch than traced), so this step can peak above "
                "the budget; trace and solve at the largest shapes you train with",
                plan.name,
                planned,
                got,
            )
        else:
            log.warning(
                "layer %s: the schedule offloads %d bytes but this step offloaded %d (shapes differ from the "
                "trace, or scheduled tensors were not offloadable); the measured peak will differ from the "
                "prediction",
                plan.name,
                planned,
                got,
            )

    # -- saved tensors -------------------------------------------------------------------------------------

    def _packer(self, p: _Pass, i: int) -> Callable[[torch.Tensor], Any]:
        plan = self.plan.layers[i]
        offload = plan.action == Action.OFFLOAD
        ledger = self.ledger
        static_places = self._static_places[i]

        def pack(x: torch.Tensor) -> Any:
            if not isinstance(x, torch.Tensor) or p.is_static(x):
                return x
            s = x.untyped_storage()
            rec = p.offload_record(s)
            if rec is not None:
                # Already offloaded (a view of it, or a storage an earlier layer offloaded): share the copy.
                return rec.handle(x)
            owner, idx = p.claim(s, i, static_places)
            if p.is_static_save(s):
                return _keep(x)
            if ledger is not None:
                ledger.note(x, owner)
            if offload and idx is not None and idx in plan.offload_tensors and self._offloadable(x):
                rec = OffloadRecord(i, s, self.copier, self.pool, ledger)
                p.offloaded[id(s)] = (weakref.ref(s), rec)
                p.records.setdefault(i, []).append(rec)
                p.offloaded_bytes[i] += rec.nbytes
                return rec.handle(x)
            return _keep(x)

        return pack

    def _offloadable(self, x: torch.Tensor) -> bool:
        # A leaf that requires grad is the user's input; autograd needs that very tensor back.
        return (
            x.device == self.device
            and x.layout == torch.strided
            and not (x.is_leaf and x.requires_grad)
            and x.untyped_storage().nbytes() > 0
        )

    # -- recompute segments --------------------------------------------------------------------------------

    def _open_segment(self, p: _Pass, start: int, end: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Segment:
        buffers = [b for b in self._buffers[start : end + 1] if b is not None]
        seg = Segment(start, end, self.plan.modules[start : end + 1], buffers=buffers)
        ledger = self.ledger
        stack = self._stack()
        claiming = any(self._claims[start : end + 1])

        def on_forward_save(x: torch.Tensor) -> bool:
            if not isinstance(x, torch.Tensor):
                return False
            if not stack or not start <= stack[-1] <= end:
                # Code between the layers, which the recomputation does not re-run: a plain save, out of the
                # checkpoint (whose recomputation would not save it again). Where a layer of the segment follows,
                # the segment is refused there (`enter`); where none does (this forward skipped the segment's last
                # layers: LayerDrop), it is code after the segment, and its saves are the model's own.
                if not p.is_static(x):
                    seg.glue_saves = True
                return True
            if not claiming or p.is_static(x):
                return False
            s = x.untyped_storage()
            owner, _ = p.claim(s, stack[-1], self._static_places[stack[-1]])
            if ledger is not None and p.is_static_save(s):
                ledger.forget(x)  # the checkpoint may have saved it first, as its input (on_input_save)
            elif ledger is not None:
                ledger.note(x, owner)
            return False

        def on_recompute_save(x: torch.Tensor) -> None:
            if (
                ledger is not None
                and isinstance(x, torch.Tensor)
                and not p.is_static(x)
                and not p.is_static_save(x.untyped_storage())
            ):
                ledger.note(x, stack[-1] if stack else start)

        def on_input_save(x: torch.Tensor) -> None:
            if (
                ledger is not None
                and isinstance(x, torch.Tensor)
                and not p.is_static(x)
                and not p.is_static_save(x.untyped_storage())
            ):
                ledger.note(x, start)

        def context_fn() -> tuple[Any, Any]:
            # The re-run's saves matter to the ledger alone: without one it runs under the checkpoint's hooks only.
            return _Observer(on_forward_save), (
                _Observer(on_recompute_save) if ledger is not None else contextlib.nullcontext()
            )

        # The checkpoint saves its inputs through whatever hooks are active: observe them for the ledger. The
        # observer stays entered until the segment closes. Saved-tensor hooks are a stack and `open` leaves the
        # checkpoint's hooks and the forward observer pushed above it: leaving the observer here would pop the
        # forward observer instead, and the segment's saves would go unseen (unclaimed, so the next layer's
        # save indices would shift off the trace's and its offload would move other tensors).
        if ledger is not None:
            inputs = _Observer(on_input_save)
            inputs.__enter__()
            seg.on_finish = lambda: inputs.__exit__(None, None, None)
        try:
            seg.open(args, kwargs, self._recompute_scope, context_fn)
        except BaseException:
            seg.abort()
            raise
        self._segment = seg
        return seg

    # -- backward stages -----------------------------------------------------------------------------------

    def _hook_backward(self, p: _Pass, i: int, out: Any, note_outputs: bool = False) -> None:
        """Mark the backward of layer i as its output gradient completes; `note_outputs`: also remember the outputs'
        storages (`_Pass.outputs`)."""

        def on_grad(_grad: torch.Tensor) -> None:
            self._backward_stage(p, i)

        for _, t in flatten(out):
            if t.requires_grad:
                t.register_hook(on_grad)
                if note_outputs and t.grad_fn is not None:  # not a parameter handed through
                    p.outputs.append(weakref.ref(t.untyped_storage()))

    def _check_code_holds(self, p: _Pass, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """As the last layer's forward starts, the schedule has let go of every storage it offloads by then. One
        that is still alive is held by the model's own code (a local variable of its forward: an embedding
        output, a rotary table or an attention mask made before the layers), so the device frees it only when
        the code lets go of it, while the cost model counts it freed at its done-by stage. Say so, with the
        bytes, once per layer. Not the outputs of the last layer's producers that it takes as inputs, nor
        outputs whose holding by the code the cost model prices (_priced_holds)."""
        assert self._priced_holds is not None and self.trace is not None
        inputs = {id(t.untyped_storage()) for _, t in flatten((args, kwargs))}
        producers = set(self.trace.layers[-1].deps)  # their outputs in its inputs: its workspace holds them
        held: dict[int, int] = {}
        for sid, (ref, rec) in p.offloaded.items():
            if not rec.released or ref() is None or self._priced_holds[rec.layer]:
                continue
            if sid in inputs and rec.layer in producers:
                continue
            held[rec.layer] = held.get(rec.layer, 0) + rec.nbytes
        for j, nbytes in sorted(held.items()):
            name = self.plan.layers[j].name
            if f"held:{name}" in self._warned:
                continue
            self._warned.add(f"held:{name}")
            log.warning(
                "layer %s: %d of the bytes it offloads are still on the device in the forward of the last layer: "
                "the model's code holds them (a local variable of its forward, such as an embedding output, a "
                "rotary table or an attention mask made before the layers, or autocast's cache of weight casts), "
                "so offloading them frees nothing before the code lets go, and the measured peak can exceed the "
                "prediction by up to that much. Solve with this layer kept, or have the model's forward drop its "
                "reference",
                name,
                nbytes,
            )

    def _backward_stage(self, p: _Pass, i: int) -> None:
        """The backward of layer i is about to run (its output gradient is complete)."""
        if i in p.backward_started:
            return
        if not p.backward_started:
            # Backward has begun: whatever a done-by stage did not release (no layer ran after it: this forward
            # skipped its last layers) is released now, as the forward is over. A segment still open for that
            # reason stays open until the next forward (`_new_pass`) or `remove`: this hook may run on the autograd
            # engine's device thread, whose saved-tensor hooks are a copy of the forward thread's, so it cannot
            # take the checkpoint's hooks off; above them, the forward observer keeps every save made meanwhile
            # out of the checkpoint (`_open_segment`).
            for recs in p.records.values():
                for rec in recs:
                    rec.release_device()
        p.backward_started.add(i)
        if self.ledger is not None:
            self.ledger.mark(f"B{i}")
        for j in self.plan.prefetch_at.get(i, ()):
            for rec in p.records.get(j, ()):
                rec.prefetch()


def claiming_layers(plan: RuntimePlan, trace: Trace | None, counting: bool) -> list[bool]:
    """Per layer, whether the replay claims what it saves (attributes each storage to the first layer that saves
    it). A claim keeps a later offload layer's save order the traced one, and sends a storage an offload layer
    moved through its copy, so an offload layer claims, and so does a layer that shares a saved storage with one
    (Layer.resaved_from, either way round; every layer of a plan that offloads where the trace does not say);
    every layer claims where a ledger counts saves (`counting`). The rest need none: a kept one runs without the
    replay's saved-tensor hooks (`bare_kept_layers`), a recomputed one's checkpoint only watches for saves between
    its layers."""
    offload = [lp.action == Action.OFFLOAD for lp in plan.layers]
    if counting:
        return [True] * plan.n
    if not any(offload):
        return offload
    if trace is None or any(x.resaved_from is None for x in trace.layers):
        return [True] * plan.n
    claims = list(offload)
    for f, x in enumerate(trace.layers):
        for j in x.resaved_from or ():
            if offload[f] or offload[j]:
                claims[f] = claims[j] = True
    return claims


def bare_kept_layers(plan: RuntimePlan, trace: Trace | None, counting: bool) -> list[bool]:
    """Per layer, whether it runs without the replay's saved-tensor hooks: a kept layer that claims nothing
    (`claiming_layers`). Entering the hooks costs every saved tensor a Python pack and unpack (+10% on a small CPU
    ResNet-50 step with hooks that do nothing, +17% with the claims)."""
    claims = claiming_layers(plan, trace, counting)
    return [lp.action == Action.KEEP and not c for lp, c in zip(plan.layers, claims, strict=True)]


def _priced_holds(trace: Trace) -> list[bool]:
    """Per layer, whether the cost model prices the model's code holding the output the layer saved itself into
    the last layer's forward: a reader there or later (Layer.output_saved_readers, else deps), or the tracer saw
    the code hold it that long (Layer.output_held_until)."""
    last = trace.n - 1
    return [
        bool(x.output_saved) and (max(r, default=-1) >= last or (x.output_held_until or 0) >= last)
        for x, r in zip(trace.layers, trace.saved_output_readers(), strict=True)
    ]


def _output_bytes(out: Any) -> int:
    """A layer's output bytes as the tracer counts them: tensor bytes, each storage once."""
    seen: set[tuple[str, int]] = set()
    total = 0
    for _, t in flatten(out):
        k = storage_key(t)
        if k not in seen:
            seen.add(k)
            total += tensor_nbytes(t)
    return total


def _keep(x: torch.Tensor) -> torch.Tensor:
    """What a pack hook stores for a kept tensor: the tensor, detached. Storing the tensor itself would tie
    an output to its own grad_fn (node -> packed tensor -> node), a cycle that keeps the whole graph alive
    if backward never runs (an exception between forward and backward)."""
    return x.detach() if x.grad_fn is not None else x


def _unpack(x: Any) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x
    return x.unpack()


def apply_schedule(
    model: nn.Module,
    schedule: Schedule,
    *,
    trace: Trace | None = None,
    layers: Sequence[str] | None = None,
    ledger: SavedLedger | None = None,
    pool: HostBufferPool | None = None,
    host_budget: int | Literal["schedule"] | None = "schedule",
) -> ScheduledModel:
    """Apply a schedule to the model, now; returns a ScheduledModel usable as the model and as a context
    manager (`with apply_schedule(model, schedule): train()` restores the model on exit).

    trace: when given, the schedule is checked against it (layer names, count, content hash).
    layers: the layer patterns the trace was made with, if not the default repeated blocks.
    ledger: a SavedLedger to count live saved bytes (the CPU measurement; see `measure`).
    pool: a host buffer pool to share between schedules (default: one per ScheduledModel).
    host_budget: the most bytes the pinned pool may hold ("schedule": the schedule's `host_budget_bytes`, the
        budget it was solved under; None: no limit). Past it an offload raises HostBudgetExceeded, naming why.
    Raises ScheduleMismatchError naming the first mismatch between schedule and model.
    """
    return ScheduledModel(
        model, schedule, trace=trace, layers=layers, ledger=ledger, pool=pool, host_budget=host_budget
    )
