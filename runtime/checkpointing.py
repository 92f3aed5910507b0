"""Recompute segments on PyTorch's non-reentrant checkpoint, opened and closed around the model's own loop.

A segment [a..b] is entered before layer a's forward and left after layer b's (the way
torch.distributed._composable.checkpoint does it for one module), so the user's model code runs unchanged.
The checkpoint keeps only the segment's inputs. For its recomputation it re-runs layers a..b in order,
feeding each layer the recomputed outputs of the earlier ones: the tensors a layer received that were
outputs of an earlier layer of the segment are recorded as links (by identity), everything else by value.
RNG state (CPU and device) is stashed at entry and restored for the recomputation, so dropout matches.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils import checkpoint as _cp

from memsched.errors import ScheduleMismatchError

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
    outputs: dict[int, tuple[int, tuple[Any, ...]]] = field(default_factory=dict)
    """id(tensor) -> (layer, path) for outputs of segment layers seen so far (valid during the forward)."""
    output_refs: list[torch.Tensor] = field(default_factory=list)
    """The outputs themselves, so ids stay unique until the segment closes."""
    inputs: dict[int, tuple[tuple[Any, ...], dict[str, Any]]] = field(default_factory=dict)
    """Layer -> its (args, kwargs) with links in place of segment outputs (layers after start only)."""
    glue_saves: bool = False
    """Whether code between the segment's layers saved tensors (the recomputation would not re-run it)."""

    def record_inputs(self, layer: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        def link(t: torch.Tensor) -> Any:
            hit = self.outputs.get(id(t))
            return _Link(*hit) if hit is not None else t

        self.inputs[layer] = (map_tensors(args, link), map_tensors(kwargs, link))

    def record_outputs(self, layer: int, out: Any) -> None:
        for path, t in flatten(out):
            self.outputs[id(t)] = (layer, path)
            self.output_refs.append(t)

    def forget_outputs(self) -> None:
        self.outputs.clear()
        self.output_refs.clear()

    def recompute_fn(
        self, enter_recompute: Callable[[], contextlib.AbstractContextManager[None]]
    ) -> Callable[..., None]:
        """What the checkpoint runs in backward: layers start..end, chained through the recorded links."""

        def run(*args: Any, **kwargs: Any) -> None:
            with enter_recompute():
                outs: dict[int, Any] = {self.start: self.modules[0](*args, **kwargs)}
                for k in range(self.start + 1, self.end + 1):
                    a, kw = self.inputs[k]

                    def resolve(x: Any) -> Any:
                        return get_path(outs[x.layer], x.path) if isinstance(x, _Link) else x

                    a = _map_links(a, resolve)
                    kw = _map_links(kw, resolve)
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
        if gen is None:
            return
        try:
            next(gen)
        except StopIteration:
            return
        raise AssertionError("the checkpoint generator did not finish")

    def abort(self) -> None:
        """The forward raised inside the segment: unwind the checkpoint's hooks without finishing it."""
        gen, self.gen = self.gen, None
        self.forget_outputs()
        if gen is not None:
            gen.close()


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
        "re-run; solve with single-layer recompute segments for this model"
    )
