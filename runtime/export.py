"""A schedule's recompute decisions as PyTorch's own activation checkpointing, for users who will not run
memsched's runtime (docs/exports.md).

`apply_checkpoint_wrappers(model, schedule)` wraps each recomputed layer in PyTorch's `CheckpointWrapper`
(`torch.utils.checkpoint.checkpoint(..., use_reentrant=False)` around the module's call), the wrapper
torchtitan and FSDP's `apply_activation_checkpointing` put on a block; `apply_selective_checkpointing` does the
same with a selective-activation-checkpointing (SAC) `context_fn` from `create_selective_checkpoint_contexts`.
What these native forms cannot say, and what the export does instead:

- offload: they have none. Offloaded layers are kept (the service's export predicts what that costs).
- a recompute segment of several layers: a wrapper checkpoints one module, so each layer of the segment is
  checkpointed on its own; the inputs of the segment's inner layers are then held until the backward.
- BatchNorm statistics: a plain checkpoint re-runs the forward, so a wrapped layer's running statistics are
  updated twice per step (memsched's runtime snapshots them; PyTorch's checkpoint does not). Warned.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    CheckpointImpl,
    CheckpointWrapper,
    checkpoint_wrapper,
)
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

from memsched.errors import ScheduleMismatchError
from memsched.runtime.plan import build_plan
from memsched.schema import Action, Schedule

log = logging.getLogger(__name__)

SAC_POLICY: dict[Action, CheckpointPolicy] = {
    Action.KEEP: CheckpointPolicy.MUST_SAVE,
    Action.OFFLOAD: CheckpointPolicy.MUST_SAVE,
    Action.RECOMPUTE: CheckpointPolicy.PREFER_RECOMPUTE,
}
"""The SAC policy of every op inside a layer, by the layer's action (offload has no SAC form: kept)."""


class LayerPolicy:
    """A SAC `policy_fn` that answers one policy for every op (a layer-level plan has no per-op choice).
    A class, not a closure: a wrapped model stays deep-copyable and picklable."""

    def __init__(self, policy: CheckpointPolicy) -> None:
        self.policy = policy

    def __call__(self, ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        return self.policy


def sac_context_fn(action: Action) -> Callable[[], tuple[Any, Any]]:
    """The `context_fn` for `torch.utils.checkpoint.checkpoint` over a layer scheduled `action`."""
    return functools.partial(create_selective_checkpoint_contexts, LayerPolicy(SAC_POLICY[action]))


@dataclass
class NativeCheckpointing:
    """What `apply_checkpoint_wrappers` / `apply_selective_checkpointing` put on a model. Use as a context
    manager, or call `remove()`: the model's own modules go back in place."""

    model: nn.Module
    """The model, its layers wrapped."""
    wrapped: list[str]
    """Layers wrapped in a checkpoint, in forward order."""
    recomputed: list[str]
    """Layers whose forward is re-run in the backward (the schedule's recompute layers)."""
    offload_kept: list[str]
    """Layers the schedule offloads, kept: the native form has no offload."""
    split_segments: list[tuple[str, str]]
    """Recompute segments of several layers (first, last), each layer checkpointed on its own."""
    _swapped: list[tuple[nn.Module, str, nn.Module]] = field(default_factory=list)
    """(parent, child name, the original module) for each wrapper, to put the original back."""
    _use_cache: bool | None = None
    """The model config's `use_cache` before it was switched off, None when untouched."""

    def remove(self) -> None:
        """Put the original modules back (and the config's use_cache)."""
        for parent, child, original in reversed(self._swapped):
            parent.register_module(child, original)
        self._swapped.clear()
        if self._use_cache is not None:
            config: Any = self.model.config
            config.use_cache = self._use_cache
            self._use_cache = None

    def __enter__(self) -> NativeCheckpointing:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


def apply_checkpoint_wrappers(model: nn.Module, schedule: Schedule) -> NativeCheckpointing:
    """Wrap each layer the schedule recomputes in `torch.utils.checkpoint` (non-reentrant), in place.

    The schedule is checked against the model first (ScheduleMismatchError names the first layer that is
    not one of its modules). Offloaded layers are kept; a segment of several layers is checkpointed one
    layer at a time (module docstring); both are logged."""
    return _wrap(model, schedule, sac=False, wrap_kept=False)


def apply_selective_checkpointing(
    model: nn.Module, schedule: Schedule, *, wrap_kept: bool = False
) -> NativeCheckpointing:
    """The schedule as SAC: each recomputed layer checkpointed with a `context_fn` whose policy recomputes
    every op (`sac_context_fn`). `wrap_kept` also checkpoints the kept layers, with a MUST_SAVE policy: the
    shape of a stack that checkpoints every block (torchtitan's full AC, Hugging Face's
    gradient_checkpointing_kwargs). SAC then caches the output of every op of a kept layer, more than autograd
    would save (docs/exports.md gives a measured figure), so prefer the default."""
    return _wrap(model, schedule, sac=True, wrap_kept=wrap_kept)


def _wrap(model: nn.Module, schedule: Schedule, *, sac: bool, wrap_kept: bool) -> NativeCheckpointing:
    plan = build_plan(model, schedule)
    where = {id(m): name for name, m in model.named_modules()}
    for lp, m in zip(plan.layers, plan.modules, strict=True):
        if isinstance(m, CheckpointWrapper) or getattr(m, "gradient_checkpointing", False) is True:
            raise ScheduleMismatchError(
                f"layer {lp.name!r} is already checkpointed ({type(m).__name__}); remove that checkpointing "
                "(model.gradient_checkpointing_disable(), or the earlier wrappers' remove()) before exporting"
            )
    out = NativeCheckpointing(
        model,
        wrapped=[],
        recomputed=[lp.name for lp in plan.layers if lp.action == Action.RECOMPUTE],
        offload_kept=[lp.name for lp in plan.layers if lp.action == Action.OFFLOAD],
        split_segments=sorted(
            {
                (plan.layers[s].name, plan.layers[e].name)
                for lp in plan.layers
                if lp.segment is not None and (s := lp.segment[0]) != (e := lp.segment[1])
            }
        ),
    )
    for lp, m in zip(plan.layers, plan.modules, strict=True):
        if lp.action != Action.RECOMPUTE and not (sac and wrap_kept):
            continue
        kwargs: dict[str, Any] = {"context_fn": sac_context_fn(lp.action)} if sac else {}
        parent_name, _, child = where[id(m)].rpartition(".")
        parent = model.get_submodule(parent_name)
        parent.register_module(child, checkpoint_wrapper(m, checkpoint_impl=CheckpointImpl.NO_REENTRANT, **kwargs))
        out._swapped.append((parent, child, m))
        out.wrapped.append(lp.name)
        if lp.action == Action.RECOMPUTE and _updates_statistics(m):
            log.warning(
                "layer %s has BatchNorm running statistics: PyTorch's checkpoint re-runs its forward in the "
                "backward and updates them twice per step (memsched's runtime does not)",
                lp.name,
            )
    if out.offload_kept:
        log.warning(
            "native checkpointing has no offload: layers %s, which the schedule offloads, are kept",
            ", ".join(out.offload_kept),
        )
    for first, last in out.split_segments:
        log.warning("recompute segment %s..%s is checkpointed one layer at a time", first, last)
    config: Any = getattr(model, "config", None)
    if getattr(config, "use_cache", None) is True:
        # The trace was taken without the cache (memsched.runtime.kv_cache), so every plan runs without it: a
        # kept attention layer would save the cache's copies of its keys and values, and a recomputed one would
        # append them to the cache a second time in the backward (transient memory no schedule priced);
        # Hugging Face's own gradient checkpointing turns the cache off in training for the same reason. Put
        # back by remove().
        log.warning("%s: use_cache switched off while the checkpoint wrappers are on", type(model).__name__)
        out._use_cache, config.use_cache = True, False
    return out


def _updates_statistics(module: nn.Module) -> bool:
    return any(
        isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats and m.training
        for m in module.modules()
    )


def unwrapped_name(name: str) -> str:
    """A parameter or module name of a wrapped model as the plain model names it."""
    return name.replace("._checkpoint_wrapped_module", "")
