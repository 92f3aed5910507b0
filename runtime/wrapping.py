"""Code around a traced layer's forward, the one mechanism the tracer and the replay share: module hooks.

A forward pre-hook (with kwargs, after the hooks already there: a sharding wrapper gathers its parameters
first) calls `LayerCalls.enter`; a forward hook (prepended, `always_call`) calls `leave` with the output, or
`fail` when the forward raised. This is how `torch.distributed._composable.checkpoint` wraps a module.

Why hooks and not a replaced `forward`: nothing of ours is stored as an attribute of the model. A closure in a
module's `__dict__` made `copy.deepcopy(model)` run the original model's layers (the closure still pointed
at them) and made `torch.save(model)` fail (a local function cannot be pickled). The hook objects here are
instances of module-level classes that deep-copy and pickle as an inert hook: a copy of a model taken while
it is wrapped is an independent, plain model that runs its own weights (its layers are not wrapped; apply a
schedule to it to schedule it), and a pickled model loads without memsched state. `state_dict` is untouched.

A block compiled on its own with `block.compile()` (the torchtitan pattern) runs its hooks inside the compiled
`_call_impl`: Dynamo would trace ours, break the graph at each of them and recompile whenever they are added or
removed (the tracer installs four sets, the replay one more), past its recompile limit, after which the block
runs eagerly and saves other tensors than the ones traced. So for such a block the calls wrap the compiled
call itself (`_CompiledCall` in its `_compiled_call_impl`, put back on removal): they run eagerly around the
unchanged compiled graph, whose saved tensors reach the active saved-tensor hooks like an eager layer's. A block
wrapped as `torch.compile(block)` (an OptimizedModule in the container) needs nothing: its own hooks run outside
the compiled region.
"""

from __future__ import annotations

import contextlib
import copy
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from torch import nn
from torch.utils.hooks import RemovableHandle

from memsched.errors import MemschedError


class LayerCalls(Protocol):
    """What runs around layer `i`'s forward (i: the index in the `modules` given to `install`)."""

    def enter(self, i: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Before the forward; returns a token handed to `leave` or `fail`."""

    def leave(self, i: int, token: Any, out: Any) -> None:
        """After the forward returned `out`."""

    def fail(self, i: int, token: Any) -> None:
        """The forward (or a hook after `enter`) raised; undo what `enter` started."""


@dataclass
class _Frame:
    """One layer call in progress on this thread."""

    module: nn.Module
    """The module called."""
    index: int
    """Its layer index."""
    token: Any = None
    """What `enter` returned."""
    entered: bool = False
    """Whether `enter` returned (it may raise)."""
    exc: BaseException | None = None
    """The exception being handled when the call began (a model called inside an `except` block): an
    exception seen at the end that is not this one was raised by the forward."""


class _Inert:
    """What a hook becomes in a deep copy or a pickle of the model: nothing."""

    def __call__(self, *args: Any) -> None:
        return None


class CopySafeHook:
    """Base of memsched's module hooks: a module-level class whose deep copy and pickle are an inert hook, so
    a copy or a saved model carries no reference to the live runtime state."""

    __slots__ = ()

    def __deepcopy__(self, memo: dict[int, Any]) -> _Inert:
        return _Inert()

    def __reduce__(self) -> tuple[type[_Inert], tuple[()]]:
        return (_Inert, ())


class _Hook(CopySafeHook):
    """Base of the two layer hooks."""

    __slots__ = ("hooks", "index")

    def __init__(self, hooks: LayerHooks, index: int) -> None:
        self.hooks = hooks
        self.index = index


class _PreHook(_Hook):
    def __call__(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        frames = self.hooks.frames()
        frame = _Frame(module, self.index, exc=sys.exc_info()[1])
        frames.append(frame)
        frame.token = self.hooks.calls.enter(self.index, args, kwargs)
        frame.entered = True


class _PostHook(_Hook):
    def __call__(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
        frames = self.hooks.frames()
        # always_call also runs this hook when an earlier pre-hook (not ours) raised: no frame of ours then.
        if not frames or frames[-1].module is not module:
            return
        frame = frames.pop()
        if not frame.entered:
            return
        if sys.exc_info()[1] is not frame.exc:
            self.hooks.calls.fail(self.index, frame.token)
        else:
            self.hooks.calls.leave(self.index, frame.token, out)


def _passthrough(obj: Any) -> Any:
    """What a pickled `_CompiledCall` loads as: the compiled call it wrapped."""
    return obj


class _CompiledCall:
    """In a `block.compile()`d module's `_compiled_call_impl`: the layer calls around the compiled call (see the
    module docstring). A deep copy or a pickle of it is the compiled call it wraps, as it was before."""

    __slots__ = ("hooks", "index", "inner", "module")

    def __init__(self, hooks: LayerHooks, index: int, module: nn.Module, inner: Callable[..., Any]) -> None:
        self.hooks = hooks
        self.index = index
        self.module = module
        self.inner = inner

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        frames = self.hooks.frames()
        frame = _Frame(self.module, self.index, exc=sys.exc_info()[1])
        frames.append(frame)
        calls = self.hooks.calls
        try:
            frame.token = calls.enter(self.index, args, kwargs)
            frame.entered = True
            out = self.inner(*args, **kwargs)
        except BaseException:
            if frames and frames[-1] is frame:
                frames.pop()
                if frame.entered:
                    calls.fail(self.index, frame.token)
            raise
        if frames and frames[-1] is frame:
            frames.pop()
            calls.leave(self.index, frame.token, out)
        return out

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        return copy.deepcopy(self.inner, memo)

    def __reduce__(self) -> tuple[Callable[[Any], Any], tuple[Any]]:
        return (_passthrough, (self.inner,))


def is_compiled_block(module: nn.Module) -> bool:
    """Whether the module was compiled on its own with `module.compile()`."""
    return module.__dict__.get("_compiled_call_impl") is not None


def _compiled_whole(module: nn.Module) -> bool:
    """Whether calling the module runs its code under torch.compile: `module.compile()`, or the OptimizedModule
    that `torch.compile(module)` returns."""
    from torch._dynamo.eval_frame import OptimizedModule

    return is_compiled_block(module) or isinstance(module, OptimizedModule)


def check_compiled(model: nn.Module, modules: Sequence[nn.Module] = ()) -> None:
    """MemschedError when a layer runs inside a module compiled as a whole (the model, or a block enclosing the
    layers): the layer hooks would be traced into the compiled graph, which breaks it at each of them and
    recompiles whenever they change, and the graph Dynamo ends with saves other tensors than the traced ones.
    With no `modules`, only the model itself is checked."""
    layers = {id(m) for m in modules}
    for name, m in model.named_modules():
        if id(m) in layers or not _compiled_whole(m):
            continue
        inside = [n for n, sub in m.named_modules(prefix=name) if id(sub) in layers and sub is not m]
        if inside or (not modules and m is model):
            what = f"{name!r}" if name else f"the model ({type(model).__name__})"
            which = f"layer {inside[0]!r}" if inside else "its layers"
            raise MemschedError(
                f"{which} runs inside {what}, which is compiled as a whole: memsched needs the layers called from "
                "eager code; compile each layer on its own instead (`for block in blocks: block.compile()`, what "
                "--compile does) and leave the code around them uncompiled"
            )


class LayerHooks:
    """The hooks of one installation over a list of modules; `remove()` takes them all off."""

    def __init__(self, modules: Sequence[nn.Module], calls: LayerCalls) -> None:
        self.calls = calls
        self._tls = threading.local()
        self._handles: list[RemovableHandle] = []
        self._compiled: list[tuple[nn.Module, _CompiledCall]] = []
        try:
            for i, m in enumerate(modules):
                if is_compiled_block(m):
                    wrap = _CompiledCall(self, i, m, m.__dict__["_compiled_call_impl"])
                    m.__dict__["_compiled_call_impl"] = wrap
                    self._compiled.append((m, wrap))
                    continue
                self._handles.append(m.register_forward_pre_hook(_PreHook(self, i), with_kwargs=True))
                self._handles.append(
                    m.register_forward_hook(_PostHook(self, i), with_kwargs=True, prepend=True, always_call=True)
                )
        except BaseException:
            self.remove()
            raise

    def frames(self) -> list[_Frame]:
        """This thread's layer calls in progress, innermost last."""
        f = getattr(self._tls, "frames", None)
        if f is None:
            f = self._tls.frames = []
        return f

    def unwind(self, keep: int = 0) -> int:
        """Fail the calls still open on this thread but the innermost `keep` (a BaseException such as
        KeyboardInterrupt skips the always-call hooks); returns how many were failed."""
        frames = self.frames()
        current = frames[len(frames) - keep :] if keep else []
        del frames[len(frames) - len(current) :]
        n = len(frames)
        while frames:
            frame = frames.pop()
            if frame.entered:
                self.calls.fail(frame.index, frame.token)
        frames.extend(current)
        return n

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        for m, wrap in reversed(self._compiled):
            _unlink(m, wrap)
        self._compiled.clear()


def _unlink(module: nn.Module, wrap: _CompiledCall) -> None:
    """Take `wrap` out of the module's chain of compiled-call wrappers (installations over the same block, such
    as the tracer's re-run probe inside a replay, may be removed in any order)."""
    cur = module.__dict__.get("_compiled_call_impl")
    if cur is wrap:
        module.__dict__["_compiled_call_impl"] = wrap.inner
        return
    while isinstance(cur, _CompiledCall):
        if cur.inner is wrap:
            cur.inner = wrap.inner
            return
        cur = cur.inner
    # Not found: the user compiled the block again since; theirs stays.


def is_wrapped(module: nn.Module) -> bool:
    """Whether a live installation (of the tracer or a replay) wraps this module."""
    return isinstance(module.__dict__.get("_compiled_call_impl"), _CompiledCall) or any(
        isinstance(h, _PreHook) for h in module._forward_pre_hooks.values()
    )


@contextlib.contextmanager
def wrapped(modules: Sequence[nn.Module], calls: LayerCalls) -> Iterator[LayerHooks]:
    """Wrap the modules for the duration of the block."""
    hooks = LayerHooks(modules, calls)
    try:
        yield hooks
    finally:
        hooks.remove()
