"""The optimizer's internal per-layer decision and its conversion to and from the Schedule contract."""

from __future__ import annotations

from dataclasses import dataclass, replace

from memsched.schema import Action, LayerAction, OffloadPlan, Schedule, Trace, recompute_segment_ends


@dataclass(frozen=True)
class Decision:
    """What to do with one layer's saved tensors. Stages are layer indices (forward for done_by,
    backward for prefetch_at); -1 means 'not set yet' and is filled in by `default_timing`."""

    action: Action = Action.KEEP
    """keep | offload | recompute."""
    offload_tensors: tuple[int, ...] = ()
    """Indices of the layer's saved tensors that are offloaded (offload only)."""
    offload_bytes: int = 0
    """Sum of the offloaded tensors' bytes (offload only)."""
    done_by: int = -1
    """Forward stage at whose end the device->host copy must have finished (offload only)."""
    prefetch_at: int = -1
    """Backward stage at whose start the host->device prefetch is issued (offload only)."""
    group: int = -1
    """First layer of this layer's recompute segment; -1 means a segment of its own (recompute only)."""


KEEP = Decision()


def recompute(group: int = -1) -> Decision:
    return Decision(action=Action.RECOMPUTE, group=group)


def offload_all(trace: Trace, i: int, done_by: int = -1, prefetch_at: int = -1) -> Decision:
    """Offload every saved tensor of layer i (or keep it, if it saves nothing). A 0-byte entry is not offloaded:
    it stands for a storage that code outside the layers also holds (the tracer's placeholder), which an offload
    would copy without freeing."""
    tensors = trace.layers[i].tensors
    movable = tuple(t for t, b in enumerate(tensors) if b > 0)
    if not movable:
        return KEEP
    return Decision(
        action=Action.OFFLOAD,
        offload_tensors=movable,
        offload_bytes=sum(tensors),
        done_by=done_by,
        prefetch_at=prefetch_at,
    )


def offload_subset(
    trace: Trace, i: int, tensors: tuple[int, ...], done_by: int = -1, prefetch_at: int = -1
) -> Decision:
    sizes = trace.layers[i].tensors
    return Decision(
        action=Action.OFFLOAD,
        offload_tensors=tuple(t for t in tensors if sizes[t] > 0),  # not the placeholders (offload_all)
        offload_bytes=sum(sizes[t] for t in tensors),
        done_by=done_by,
        prefetch_at=prefetch_at,
    )


def group_start(decisions: list[Decision], i: int) -> int:
    d = decisions[i]
    return d.group if d.group >= 0 else i


def segment_ends(decisions: list[Decision]) -> dict[int, int]:
    """The recompute segments as {first layer: last layer} (the schema's rule, `recompute_segment_ends`)."""
    return recompute_segment_ends(
        (i, d.group if d.group >= 0 else i) for i, d in enumerate(decisions) if d.action == Action.RECOMPUTE
    )


def split_at_breaks(trace: Trace, decisions: list[Decision]) -> list[Decision]:
    """The decisions with each recompute segment cut after every layer whose following code saves tensors for
    backward (Layer.code_after_saves, Trace.segment_last): the replay cannot run a segment across it. The
    planners keep to that rule; this is the one place every plan passes (simulate), so a plan any of them builds
    otherwise is priced, and replayed, as the segments it can run as."""
    if not any(layer.code_after_saves for layer in trace.layers):
        return decisions
    out = list(decisions)
    start = -1  # first layer of the current segment after the cuts
    for i, d in enumerate(decisions):
        if d.action != Action.RECOMPUTE:
            continue
        g = d.group if d.group >= 0 else i
        if g == i or trace.layers[i - 1].code_after_saves:
            start = i
        group = -1 if start == i else start
        if group != (-1 if g == i else g):
            out[i] = replace(d, group=group)
    return out


def decisions_from_schedule(schedule: Schedule) -> list[Decision]:
    out: list[Decision] = []
    for a in schedule.actions:
        if a.action == Action.OFFLOAD:
            assert a.offload is not None
            out.append(
                Decision(
                    action=Action.OFFLOAD,
                    offload_tensors=tuple(a.offload.tensors),
                    offload_bytes=a.offload.bytes,
                    done_by=a.offload.done_by_layer,
                    prefetch_at=a.offload.prefetch_at_layer,
                )
            )
        elif a.action == Action.RECOMPUTE:
            out.append(recompute(a.recompute_group if a.recompute_group is not None else -1))
        else:
            out.append(KEEP)
    return out


def to_actions(trace: Trace, decisions: list[Decision]) -> list[LayerAction]:
    actions: list[LayerAction] = []
    for i, (layer, d) in enumerate(zip(trace.layers, decisions, strict=True)):
        if d.action == Action.OFFLOAD:
            assert d.done_by >= i and d.prefetch_at >= i, "timing must be filled in before export"
            actions.append(
                LayerAction(
                    layer=layer.name,
                    action=Action.OFFLOAD,
                    offload=OffloadPlan(
                        tensors=list(d.offload_tensors),
                        bytes=d.offload_bytes,
                        done_by_layer=d.done_by,
                        prefetch_at_layer=d.prefetch_at,
                    ),
                )
            )
        elif d.action == Action.RECOMPUTE:
            g = d.group if 0 <= d.group < i else None
            actions.append(LayerAction(layer=layer.name, action=Action.RECOMPUTE, recompute_group=g))
        else:
            actions.append(LayerAction(layer=layer.name, action=Action.KEEP))
    return actions


__all__ = [
    "ALL_ACTIONS",
    "KEEP",
    "Decision",
    "decisions_from_schedule",
    "group_start",
    "offload_all",
    "offload_subset",
    "recompute",
    "segment_ends",
    "to_actions",
    "uses_only",
]


ALL_ACTIONS: frozenset[Action] = frozenset(Action)
"""Every action: what a plan may use unless the solve options restrict it."""


def uses_only(decisions: list[Decision], allowed: frozenset[Action]) -> bool:
    """Whether every decision's action is one of `allowed`."""
    return all(d.action in allowed for d in decisions)
