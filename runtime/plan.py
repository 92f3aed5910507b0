"""The runtime's view of a Schedule: per-layer instructions resolved against the model's modules."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from torch import nn

from memsched.errors import ScheduleMismatchError
from memsched.runtime.layers import find_layers
from memsched.schema import Action, Schedule, Trace, check_schedule, recompute_segment_ends


@dataclass(frozen=True)
class LayerPlan:
    """What the runtime does for one traced layer."""

    index: int
    """Layer index in forward order (the schedule's order)."""
    name: str
    """Module path."""
    action: Action
    """keep | offload | recompute."""
    offload_tensors: frozenset[int] = frozenset()
    """Indices (in save order, deduplicated by storage) of the saved tensors to offload."""
    offload_bytes: int = 0
    """Scheduled offloaded bytes (checked against what is actually offloaded, with a warning)."""
    done_by: int = -1
    """Forward stage at whose end the offloaded device memory is released."""
    prefetch_at: int = -1
    """Backward stage at whose start the prefetch is issued."""
    segment: tuple[int, int] | None = None
    """(first, last) layer of the recompute segment this layer belongs to."""


@dataclass
class RuntimePlan:
    """All layers' plans plus the stage tables the hooks look up."""

    layers: list[LayerPlan]
    """Per layer, in forward order."""
    modules: list[nn.Module]
    """The modules, same order."""
    release_at: dict[int, list[int]] = field(default_factory=dict)
    """Forward stage -> offloaded layers whose device copies are released at its end."""
    prefetch_at: dict[int, list[int]] = field(default_factory=dict)
    """Backward stage -> offloaded layers prefetched at its start, in need order (descending)."""

    @property
    def n(self) -> int:
        return len(self.layers)


def _resolve_modules(model: nn.Module, names: Sequence[str]) -> list[nn.Module]:
    modules = dict(model.named_modules())
    # A DDP/FSDP-style wrapper prefixes every name with 'module.'; accept schedules made on the bare model.
    prefix = "module." if "module" in modules and not any(n in modules for n in names[:1]) else ""
    out = []
    for i, name in enumerate(names):
        m = modules.get(prefix + name)
        if m is None:
            try:
                found = [n for n, _ in find_layers(model)]
                hint = f"; the model's repeated blocks are {len(found)}: {found[:3]}{'...' if len(found) > 3 else ''}"
            except ValueError:
                hint = ""
            raise ScheduleMismatchError(
                f"schedule layer_names[{i}] {name!r} is not a module of this {type(model).__name__} "
                f"(schedule has {len(names)} layers{hint}); trace and solve this model again"
            )
        out.append(m)
    if len({id(m) for m in out}) != len(out):
        raise ScheduleMismatchError("schedule names the same module twice; trace and solve this model again")
    return out


def _check_count(model: nn.Module, names: Sequence[str]) -> None:
    """A schedule over the default blocks must cover all of them (one made for a shallower model would
    otherwise leave the extra blocks silently unscheduled). Schedules over other layers (made with patterns)
    are not comparable to the default blocks and are not checked here."""
    try:
        blocks = [n for n, _ in find_layers(model)]
    except ValueError:
        return
    prefix = "module." if blocks and blocks[0].startswith("module.") else ""
    blocks = [b.removeprefix(prefix) for b in blocks]
    if set(names) <= set(blocks) and len(names) != len(blocks):
        missing = [b for b in blocks if b not in set(names)]
        raise ScheduleMismatchError(
            f"schedule has {len(names)} layers but this {type(model).__name__} has {len(blocks)} repeated blocks "
            f"(not scheduled: {missing[:3]}{'...' if len(missing) > 3 else ''}); trace and solve this model again"
        )


def build_plan(
    model: nn.Module,
    schedule: Schedule,
    trace: Trace | None = None,
    layer_patterns: Sequence[str] | None = None,
) -> RuntimePlan:
    """Check the schedule against the model (and the trace, when given) and resolve it to modules."""
    if trace is not None:
        check_schedule(schedule, trace)
    if layer_patterns:
        expected = [n for n, _ in find_layers(model, layer_patterns)]
        if expected != schedule.layer_names:
            raise ScheduleMismatchError(
                f"the layers matching {list(layer_patterns)} ({len(expected)}: {expected[:3]}...) are not the "
                f"schedule's ({len(schedule.layer_names)}: {schedule.layer_names[:3]}...); solve for this model"
            )
    modules = _resolve_modules(model, schedule.layer_names)
    if not layer_patterns:
        _check_count(model, schedule.layer_names)
    ancestors = {name for name in schedule.layer_names}
    for name in schedule.layer_names:
        parts = name.split(".")
        for k in range(1, len(parts)):
            if ".".join(parts[:k]) in ancestors:
                raise ScheduleMismatchError(
                    f"schedule layer {name!r} is nested in layer {'.'.join(parts[:k])!r}; the runtime replays "
                    "non-nested layers only: trace with layer patterns that do not nest"
                )
    n = len(schedule.actions)
    plans: list[LayerPlan] = []
    seg_start: dict[int, int] = {}
    for i, a in enumerate(schedule.actions):
        if a.action == Action.RECOMPUTE:
            seg_start[i] = a.recompute_group if a.recompute_group is not None else i
    seg_end = recompute_segment_ends(seg_start.items())
    release_at: dict[int, list[int]] = {}
    prefetch_at: dict[int, list[int]] = {}
    for i, a in enumerate(schedule.actions):
        if a.action == Action.OFFLOAD:
            o = a.offload
            assert o is not None  # the schema guarantees it
            for fld, v in (("done_by_layer", o.done_by_layer), ("prefetch_at_layer", o.prefetch_at_layer)):
                if not i <= v < n:
                    raise ScheduleMismatchError(f"actions[{i}].offload.{fld} = {v} must be in [{i}, {n - 1}]")
            plans.append(
                LayerPlan(
                    i,
                    a.layer,
                    a.action,
                    frozenset(o.tensors),
                    o.bytes,
                    o.done_by_layer,
                    o.prefetch_at_layer,
                )
            )
            release_at.setdefault(o.done_by_layer, []).append(i)
            prefetch_at.setdefault(o.prefetch_at_layer, []).append(i)
        elif a.action == Action.RECOMPUTE:
            s = seg_start[i]
            if any(seg_start.get(j) != s for j in range(s, i + 1)):
                raise ScheduleMismatchError(
                    f"actions[{i}].recompute_group = {s}: layers {s}..{i} must all be recompute in that segment"
                )
            plans.append(LayerPlan(i, a.layer, a.action, segment=(s, seg_end[s])))
        else:
            plans.append(LayerPlan(i, a.layer, a.action))
    for stage_layers in prefetch_at.values():
        stage_layers.sort(reverse=True)
    return RuntimePlan(plans, modules, release_at, prefetch_at)
