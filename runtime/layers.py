"""Which modules are the traced layers: the repeated blocks by default, module-name patterns on request."""

from __future__ import annotations

import re
from collections.abc import Sequence

from torch import nn

from memsched.errors import MemschedError

# A block is a unit a user would checkpoint: it holds at least this many parameterised leaf modules.
# Two would make a conv+norm pair (ResNetConvLayer) a block and split the residual add off the bottleneck.
_MIN_PARAM_LEAVES = 3


def _param_leaves(module: nn.Module) -> int:
    return sum(1 for m in module.modules() if not list(m.children()) and any(True for _ in m.parameters(recurse=False)))


def _is_block_container(module: nn.Module, nested: bool = False) -> bool:
    """A ModuleList/Sequential of >= 2 children of one class, each big enough to be a block. Inside a block
    (`nested`), one child is enough: a ResNet stage of depth 1 still holds its bottleneck in a Sequential."""
    if not isinstance(module, nn.ModuleList | nn.Sequential):
        return False
    children = list(module.children())
    if len(children) < (1 if nested else 2) or len({type(c) for c in children}) != 1:
        return False
    return all(_param_leaves(c) >= _MIN_PARAM_LEAVES for c in children)


def _outermost_containers(root: nn.Module, prefix: str, nested: bool) -> list[tuple[str, nn.Module]]:
    """Block containers under root (root excluded) that are not inside another one, in registration order."""
    found: list[tuple[str, nn.Module]] = []
    for name, m in root.named_modules(prefix=prefix):
        if m is root or any(name.startswith(f"{f}.") for f, _ in found):
            continue
        if _is_block_container(m, nested):
            found.append((name, m))
    return found


def _blocks(container_name: str, container: nn.Module) -> list[tuple[str, nn.Module]]:
    """A container's children, each replaced by its own inner blocks if it holds block containers
    (ResNet: stages -> the bottleneck layers of each stage)."""
    out: list[tuple[str, nn.Module]] = []
    for child_name, child in container.named_children():
        full = f"{container_name}.{child_name}" if container_name else child_name
        inner = _outermost_containers(child, full, nested=True)
        if inner:
            for cname, c in inner:
                out.extend(_blocks(cname, c))
        else:
            out.append((full, child))
    return out


def default_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The repeated blocks (GPT-2 `transformer.h.N`, BERT `encoder.layer.N`, ViT, ResNet
    `encoder.stages.S.layers.N`): children of the outermost ModuleList/Sequential holding >= 2 same-class
    blocks, descending into a child that itself holds blocks, in registration order."""
    containers = _outermost_containers(model, "", nested=False)
    if not containers:
        raise MemschedError(
            "layers: found no repeated blocks (a ModuleList/Sequential of >= 2 same-class modules) in "
            f"{type(model).__name__}; pass layer patterns, e.g. --layer-pattern 'blocks\\.\\d+'"
        )
    out: list[tuple[str, nn.Module]] = []
    for cname, container in containers:
        out.extend(_blocks(cname, container))
    return out


def find_layers(model: nn.Module, patterns: Sequence[str] | None = None) -> list[tuple[str, nn.Module]]:
    """The traced layers in module-registration order: the repeated blocks, or the modules whose full name
    matches one of the regex patterns (re.fullmatch)."""
    if not patterns:
        return default_layers(model)
    compiled = []
    for p in patterns:
        try:
            compiled.append(re.compile(p))
        except re.error as e:
            raise MemschedError(f"layers: pattern {p!r} is not a valid regular expression ({e}); fix it") from None
    out = [(name, m) for name, m in model.named_modules() if name and any(c.fullmatch(name) for c in compiled)]
    if not out:
        raise MemschedError(
            f"layers: no module name matches {list(patterns)}; module names look like "
            f"{[n for n, _ in list(model.named_modules())[1:4]]}"
        )
    return out


def layer_names(model: nn.Module, patterns: Sequence[str] | None = None) -> list[str]:
    return [name for name, _ in find_layers(model, patterns)]
