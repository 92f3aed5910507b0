"""Training forwards without the KV cache, in the trace and in the replay alike.

A `transformers` model whose config asks for `use_cache=True` (Llama's and GPT-2's defaults) copies every
layer's keys and values into its cache during a training forward, and the attention then saves those copies
for the backward instead of views of the projection's output. A schedule names saved tensors by their place
in the layer's save order, so a trace taken with the cache on and a replay run with it off (or the other way
round) disagree on which tensor an offload moves and on the bytes a layer saves: the plan's prediction would
not hold. So the rule has one home: under the tracer and under a schedule, training forwards run with
use_cache=False (what `gradient_checkpointing_enable` does too), and both say so once.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from memsched.runtime.wrapping import CopySafeHook


def cache_message(model: nn.Module, where: str) -> str:
    """The one-line warning both the tracer and the replay give when they switch a cache off; `where` says
    whose forwards run without it."""
    return (
        f"memsched: {type(model).__name__} has use_cache=True, which keeps every layer's keys and values alive "
        f"until the backward, outside the schedule's budget; {where} run with use_cache=False (as "
        "gradient_checkpointing_enable does). Without the cache the attention reads its keys in another memory "
        "layout, so gradients can differ in the last bit from a keep-all run with the cache on; pass "
        "use_cache=False in training to compare bitwise"
    )


class CacheOff(CopySafeHook):
    """A forward pre-hook on a `transformers`-style model (one with `config.use_cache` and a `use_cache`
    argument): a training forward (training mode, grad enabled) runs with use_cache=False. `on_switch` is
    called with the model each time it switches one off (the owner warns once)."""

    __slots__ = ("on_switch",)

    def __init__(self, on_switch: Callable[[nn.Module], None]) -> None:
        self.on_switch = on_switch

    def __call__(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if not (module.training and torch.is_grad_enabled()):
            return None  # not a training forward: the user's own choice stands
        asked = kwargs.get("use_cache")
        if asked is False or (asked is None and not getattr(module.config, "use_cache", False)):
            return None
        self.on_switch(module)
        return args, {**kwargs, "use_cache": False}


def hook_caches(model: nn.Module, hook: CacheOff) -> list[RemovableHandle]:
    """Put `hook` on each outermost module that keeps a cache on request (`config.use_cache` and a
    `use_cache` argument: a `transformers` model, or a DDP-wrapped one)."""
    handles: list[RemovableHandle] = []
    hooked: list[str] = []
    for name, m in model.named_modules():
        if any(name.startswith(f"{h}.") for h in hooked):
            continue
        if not isinstance(getattr(getattr(m, "config", None), "use_cache", None), bool):
            continue
        try:
            takes = "use_cache" in inspect.signature(m.forward).parameters
        except (TypeError, ValueError):
            takes = False
        if takes:
            handles.append(m.register_forward_pre_hook(hook, with_kwargs=True))
            hooked.append(name)
    return handles
