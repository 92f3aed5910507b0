"""The simulator: the one place that says what a schedule costs (docs/cost-model.md is its specification).

A training step is 2n stages in time order: forward stages F_0..F_{n-1} (global stage t = i), then backward
stages B_{n-1}..B_0 (global stage t = 2n-1-i). Memory is accounted per stage (the peak within a stage);
time is event-driven over three FIFO streams: compute, device->host (offloads) and host->device (prefetches).
The ILP models exactly these rules, so its objective equals `simulate(...).overhead_s` of its schedule.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from memsched.errors import ScheduleMismatchError
from memsched.optimizer.decisions import KEEP as _KEEP
from memsched.optimizer.decisions import (
    Decision,
    decisions_from_schedule,
    group_start,
    recompute,
    segment_ends,
    split_at_breaks,
    to_actions,
)
from memsched.schema import (
    Action,
    Prediction,
    Schedule,
    SolverRecord,
    Trace,
    TracedWorkload,
    check_schedule,
    validate_actions,
)

COMPUTE, D2H, H2D = "compute", "d2h", "h2d"


@dataclass(frozen=True)
class Event:
    """One interval on one stream of the timeline."""

    stream: str
    """'compute', 'd2h' or 'h2d'."""
    kind: str
    """'forward', 'backward', 'recompute', 'stall', 'offload' or 'prefetch'."""
    layer: int
    """Layer index the event belongs to."""
    start: float
    """Start time, seconds from the start of the step."""
    end: float
    """End time, seconds."""
    bytes: int = 0
    """Bytes moved (copies only)."""


@dataclass
class SimResult:
    """Everything the simulator says about one schedule."""

    decisions: list[Decision]
    """The decisions simulated, with offload timing filled in."""
    static_bytes: int
    """Static bytes of the trace (params, grads, optimizer state, other)."""
    stage_bytes: list[int]
    """Non-static device bytes at each of the 2n stages (activations + in-flight copies + workspace)."""
    stage_start: list[float]
    """Start time of each stage."""
    stage_end: list[float]
    """End time of each stage."""
    step_s: float
    """Predicted step time."""
    keepall_step_s: float
    """Predicted step time with every layer kept (no stall, no recompute)."""
    stall_s: float
    """Time the compute stream waits for copies."""
    recompute_s: float
    """Time spent recomputing forwards."""
    events: list[Event] = field(default_factory=list)
    """The timeline."""
    budget_bytes: int | None = None
    """The budget the schedule was checked against, if any."""

    @property
    def peak_bytes(self) -> int:
        return self.static_bytes + max(self.stage_bytes)

    @property
    def peak_stage(self) -> int:
        return max(range(len(self.stage_bytes)), key=self.stage_bytes.__getitem__)

    @property
    def overhead_s(self) -> float:
        return self.stall_s + self.recompute_s

    @property
    def host_peak_bytes(self) -> int:
        """Most offloaded bytes on the host at once (`host_stage_bytes`)."""
        return host_peak_bytes(self.decisions)

    @property
    def overhead_pct(self) -> float:
        return 100.0 * self.overhead_s / self.keepall_step_s if self.keepall_step_s > 0 else 0.0

    @property
    def feasible(self) -> bool:
        return self.budget_bytes is None or self.peak_bytes <= self.budget_bytes

    def prediction(self) -> Prediction:
        return Prediction(
            peak_bytes=self.peak_bytes,
            step_s=self.step_s,
            keepall_step_s=self.keepall_step_s,
            overhead_s=self.overhead_s,
            overhead_pct=self.overhead_pct,
            stall_s=self.stall_s,
            recompute_s=self.recompute_s,
            host_peak_bytes=self.host_peak_bytes,
        )


def host_stage_bytes(decisions: list[Decision]) -> list[int]:
    """Offloaded bytes on the host at each global stage 0..2n-1. The runtime takes a layer's host buffers from
    its pool as the forward F_i saves the tensors (runtime/offload.py, OffloadRecord) and gives them back when
    autograd drops the last handle, after the backward B_i has used them: the host holds them from F_i through
    B_i, whatever the copies' timing. Every such interval spans the loss point, so the peak (stages n-1 and n)
    is every offloaded byte."""
    n = len(decisions)
    diff = [0] * (2 * n + 1)
    for i, d in enumerate(decisions):
        if d.action == Action.OFFLOAD and d.offload_bytes:
            diff[i] += d.offload_bytes
            diff[2 * n - i] -= d.offload_bytes
    out, run = [], 0
    for t in range(2 * n):
        run += diff[t]
        out.append(run)
    return out


def host_peak_bytes(decisions: list[Decision]) -> int:
    """The host-memory peak of a plan: max(host_stage_bytes), which is the sum of its offloaded bytes (every
    host interval spans the loss point); O(n) without the per-stage list."""
    return sum(d.offload_bytes for d in decisions if d.action == Action.OFFLOAD)


def other_step_s(trace: Trace) -> float:
    """Time of the step outside the traced layers (loss, optimizer): never negative."""
    return max(0.0, trace.baseline.step_s - sum(x.forward_s + x.backward_s for x in trace.layers))


def keepall_step_s(trace: Trace) -> float:
    return sum(x.forward_s + x.backward_s for x in trace.layers) + other_step_s(trace)


def copy_seconds(trace: Trace, nbytes: int, direction: str) -> float:
    """Duration of one copy on one stream: latency + bytes / measured bandwidth."""
    if nbytes <= 0:
        return 0.0
    bw = trace.device.d2h_bytes_per_s if direction == D2H else trace.device.h2d_bytes_per_s
    return trace.device.copy_latency_s + nbytes / bw


def forward_transient(trace: Trace, i: int) -> int:
    """Bytes that exist only during F_i: the layer's forward workspace (Layer.forward_workspace) and the output
    it produces."""
    layer = trace.layers[i]
    return layer.forward_workspace + layer.output_bytes


def backward_transient(trace: Trace, i: int) -> int:
    """Bytes that exist only during B_i: workspace, the incoming output gradient and the input gradient.
    (The loss is not in B_{n-1}: it is freed by the time the last layer's output gradient arrives; it lives at
    the loss point, see `loss_point_bytes`.)"""
    layer = trace.layers[i]
    return layer.workspace_bytes + layer.output_bytes + layer.input_bytes


def unattributed_bytes(trace: Trace) -> int:
    """The loss's own bytes at the loss point (logits, their float32 upcast, the loss and its gradient, the
    head's saved tensors): what the measured keep-all peak holds beyond static + every saved byte + the last
    layer's output, when the layer model does not explain the measured peak (it is then the loss point: the
    tracer leaves the loss out of the last layer's workspace exactly when the loss is the step's peak). 0
    when the modelled keep-all peak already reaches the measured one (imported profiles, whose baseline peak
    is modelled; synthetic traces; traces that fold the loss into the last layer's workspace)."""
    static, saved = trace.static.total, sum(x.saved_bytes for x in trace.layers)
    out = trace.layers[-1].output_bytes
    # The modelled keep-all peak is at least static + every saved byte + the last output (the loss point);
    # at or below that the answer is 0 without the O(n) pass (this runs on every stage_memory call).
    if trace.baseline.peak_bytes <= static + saved + out:
        return 0
    modelled = static + max(_stage_memory(trace, [_KEEP] * trace.n, loss=False))
    if trace.baseline.peak_bytes <= modelled:
        return 0
    return trace.baseline.peak_bytes - static - saved - out


def loss_point_transient(trace: Trace) -> int:
    """Bytes that exist only at the loss point (after F_{n-1}, before B_{n-1}) beyond what is held across
    it: the last layer's output and the loss's own bytes (`unattributed_bytes`)."""
    return trace.layers[-1].output_bytes + unattributed_bytes(trace)


CPU_RNG_STATE_BYTES = 5056
"""Bytes of `torch.get_rng_state()`: the CPU generator's state (mt19937 and its normal-sampling cache), a uint8
tensor in host memory that a recompute segment's checkpoint stashes (torch.utils.checkpoint,
preserve_rng_state) for its recomputation (measured: torch 2.13; the layout is older than torch 1.0)."""


def checkpoint_state_bytes(trace: Trace) -> int:
    """Device bytes each recompute segment's checkpoint holds beyond its inputs, from F_a through B_a: the
    RNG state it stashes. The CPU generator's state is a host tensor, so it is device memory exactly where
    the device is the host (`DeviceInfo.is_host`); a GPU's stashed states are host tensors too: 0 there."""
    return CPU_RNG_STATE_BYTES if trace.device.is_host else 0


def rerun_fork_bytes(trace: Trace, a: int, b: int) -> int:
    """Bytes a recompute segment [a, b] holds in B_b, while it re-runs, beyond its layers' saved bytes: the fork
    of its stashed RNG state (`checkpoint_state_bytes`, torch.random.fork_rng), and what its layers' forwards keep
    on a custom autograd Function's ctx (Layer.ctx_held_bytes): the re-run makes those again while the forward's
    are still held, and drops them when it ends (docs/cost-model.md, 'Tensors kept on a ctx')."""
    return checkpoint_state_bytes(trace) + sum(x.ctx_held for x in trace.layers[a : b + 1])


def external_input_bytes(trace: Trace, i: int) -> int:
    """Bytes layer i reads that no traced layer produced (an embedding's or a stem's output, a mask): a
    recompute segment containing i holds them as checkpoint inputs, like the outputs of its deps."""
    layer = trace.layers[i]
    return max(0, layer.input_bytes - sum(trace.layers[j].output_bytes for j in layer.deps))


def segment_external_bytes(trace: Trace, a: int, b: int) -> int:
    """External inputs held by the checkpoint of segment [a..b] (counted per segment: conservative)."""
    return sum(external_input_bytes(trace, c) for c in range(a, b + 1))


def segment_outside_deps(trace: Trace, a: int, b: int) -> set[int]:
    """The producers outside segment [a..b] whose outputs its layers consume: its checkpoint holds them."""
    return {j for c in range(a, b + 1) for j in trace.layers[c].deps if j < a}


def checkpoint_inputs(trace: Trace, decisions: list[Decision], ends: dict[int, int] | None = None) -> dict[int, int]:
    """For each producer j whose output some recompute segment keeps as its input: the earliest such
    segment start. Segments' retention intervals are nested, so the earliest one covers the others and the
    tensor is counted once (the DAG case: one output consumed by several recomputed layers).
    `ends`: `segment_ends(decisions)`, when the caller has it already."""
    earliest: dict[int, int] = {}
    for a, b in (segment_ends(decisions) if ends is None else ends).items():
        for j in segment_outside_deps(trace, a, b):
            earliest[j] = min(earliest.get(j, a), a)
    return earliest


def checkpoint_input_bytes(trace: Trace, j: int) -> int:
    """Bytes of producer j's output that a recompute segment reading it from outside holds as its checkpoint
    input (`checkpoint_inputs`): all of it but the part j saved itself (Layer.output_saved_bytes), which is
    charged apart (`checkpoint_own_inputs`)."""
    layer = trace.layers[j]
    return layer.output_bytes - layer.output_saved


def rerun_input_overlap(trace: Trace, a: int, b: int) -> int:
    """Bytes the segment [a..b] would count twice from B_b through B_{a+1}: the inputs of layer a that its re-run
    saves again (Layer.input_saved_bytes: a convolution's or a norm's input), which are the storages its checkpoint
    holds as inputs there. (At B_a the checkpoint's charge has ended; a singleton segment has no such stage.)"""
    return trace.layers[a].input_saved if b > a else 0


def checkpoint_own_inputs(
    trace: Trace, decisions: list[Decision], ends: dict[int, int] | None = None
) -> dict[int, int]:
    """For each producer j that is not kept and whose self-saved output (Layer.output_saved_bytes) some recompute
    segment reads from outside, by the readers of that output (Layer.output_saved_readers: a UNet's skip is read
    by an up block, not by the next down block): the earliest such segment start, whose checkpoint holds it
    strictly between F_a and B_a. A kept j holds it F_j..B_j in its own saved bytes, which covers every later
    segment's hold (ResNet's block output, which the block's last ReLU saves). An offloaded j is charged: the
    checkpoint keeps the storage on the device whatever the copy does (an over-count only where j offloads a
    subset without it)."""
    readers = trace.saved_output_readers()
    earliest: dict[int, int] = {}
    for a, b in (segment_ends(decisions) if ends is None else ends).items():
        for j in segment_outside_deps(trace, a, b):
            if (
                trace.layers[j].output_saved
                and decisions[j].action != Action.KEEP
                and any(a <= r <= b for r in readers[j])
            ):
                earliest[j] = min(earliest.get(j, a), a)
    return earliest


def side_input_hold(trace: Trace, decisions: list[Decision], ends: dict[int, int] | None = None) -> tuple[int, int]:
    """(a, bytes): what the recompute segments' checkpoints keep of their layers' side inputs after the
    forward (Layer.side_input_bytes: masks, rotary tables, position ids), held from the loss point through
    B_a, a being the earliest segment start that holds any. Their retention intervals are nested, and a step
    makes these tensors once and hands them to every layer, so they are one set: the largest layer's bytes,
    over the earliest segment's span (docs/cost-model.md, 'Side inputs'). (-1, 0) without such a segment."""
    start, held = -1, 0
    for a, b in (segment_ends(decisions) if ends is None else ends).items():
        side = max(trace.layers[c].side_input for c in range(a, b + 1))
        if side:
            held = max(held, side)
            start = a if start < 0 else min(start, a)
    return start, held


def own_output_read_by_all(trace: Trace) -> list[bool]:
    """Per layer, whether every layer that reads its outputs reads the part it saved itself (so a checkpoint
    holding its outputs holds that part too: `checkpoint_own_inputs` starts with `checkpoint_inputs`). The DP
    and the MILP price the two parts together only there."""
    readers: list[set[int]] = [set() for _ in range(trace.n)]
    for c, layer in enumerate(trace.layers):
        for j in layer.deps:
            readers[j].add(c)
    return [set(r) == readers[j] for j, r in enumerate(trace.saved_output_readers())]


def skip_holds(
    trace: Trace, decisions: list[Decision], ends: dict[int, int] | None = None
) -> list[tuple[int, int, int]]:
    """(first stage, last stage, bytes): outputs a layer saved itself (Layer.output_saved_bytes) that the
    model's code keeps in the forward until a later layer reads them (a UNet's skips), where that layer does not
    keep them: autograd no longer holds them, the code does, through F_c of their last reader c. From F_{j+1}
    (an offloaded layer's: after its copy is done), up to F_a of the earliest recompute segment that holds it
    as a checkpoint input (`checkpoint_own_inputs`: that charge starts at F_{a+1}). Not where the only reader is
    the next layer and it saves the output again: its workspace holds it there (`code_holds`; docs/cost-model.md,
    'Outputs the model keeps')."""
    until = code_hold_until(trace)
    earliest = checkpoint_own_inputs(trace, decisions, ends)
    out = []
    for j, (layer, d) in enumerate(zip(trace.layers, decisions, strict=True)):
        if until[j] < 0 or d.action == Action.KEEP:
            continue
        lo = d.done_by + 1 if d.action == Action.OFFLOAD else j + 1
        hi = min(until[j], earliest.get(j, trace.n), trace.n - 1)  # past F_{n-1}: the loss point's (`loss_point_skips`)
        if lo <= hi:
            out.append((lo, hi, layer.output_saved))
    return out


def code_hold_until(trace: Trace) -> list[int]:
    """Per layer, the last forward stage through which the model's code holds the output it saved itself once the
    layer does not keep it (`skip_holds`): its last reader's (`code_holds`), or later where the tracer saw the code
    hold it longer (Layer.output_held_until; n: across the loss point too); -1 where the code never does."""
    out = []
    for j, readers in enumerate(trace.saved_output_readers()):
        layer = trace.layers[j]
        held = layer.output_saved and any(code_holds(trace, j, r) for r in readers)
        until = max(readers) if held else -1
        seen = layer.output_held_until
        if layer.output_saved and seen is not None and seen > j + 1:
            # Past the next layer (whose workspace holds an input it saves again): the code's own hold.
            until = max(until, min(seen, trace.n))
        out.append(until)
    return out


def loss_point_skips(trace: Trace, decisions: list[Decision], ends: dict[int, int] | None = None) -> int:
    """Outputs a layer saved itself that the model's code still holds at the loss point (`code_hold_until` = n)
    where the layer does not keep them and no recompute segment holds them as checkpoint inputs (which
    `loss_point_held` counts)."""
    until = code_hold_until(trace)
    earliest = checkpoint_own_inputs(trace, decisions, ends)
    return sum(
        layer.output_saved
        for j, (layer, d) in enumerate(zip(trace.layers, decisions, strict=True))
        if until[j] >= trace.n and d.action != Action.KEEP and j not in earliest
    )


def code_holds(trace: Trace, j: int, r: int) -> bool:
    """Whether layer j's reader r leaves the output j saved itself to the model's code in the forward (see
    `skip_holds`): r lies past the next layer, or it is the next layer and does not save it again (a storage its
    producer saved first is in the reader's workspace at F_r: Layer.shared_input_bytes)."""
    return r > j + 1 or trace.layers[r].shared_input < trace.layers[j].output_saved


def checkpoint_backward_holds(
    trace: Trace, decisions: list[Decision], ends: dict[int, int] | None = None
) -> dict[int, int]:
    """{a: bytes}: checkpoint inputs the segment [a..b] still holds in its own backward stage B_a, beyond what
    its layers' charges there carry. A checkpoint keeps its inputs until its backward is done; checkpoint inputs
    are charged strictly between F_a and B_a because where layer a saves an input (a ResNet block's first
    convolution, a transformer block's first norm) its rematerialised bytes or its workspace (for a storage its
    producer saved first, Layer.shared_input_bytes) hold it at B_a. An output its producer saved itself
    (Layer.output_saved_bytes) that a later layer of the segment reads (a UNet's skip, concatenated by the up
    block) is on the device at B_a besides: counted for the earliest segment that holds it
    (`checkpoint_own_inputs`; a later segment's B_a lies inside that one's hold) (docs/cost-model.md,
    'Checkpoint inputs')."""
    group_end = segment_ends(decisions) if ends is None else ends
    readers = trace.saved_output_readers()
    shared = {a: trace.layers[a].shared_input for a in group_end}
    out: dict[int, int] = {}
    for j, a in checkpoint_own_inputs(trace, decisions, group_end).items():
        own = trace.layers[j].output_saved
        covered = min(shared[a], own) if a in readers[j] else 0  # in a's workspace at B_a
        shared[a] -= covered
        if own > covered:
            out[a] = out.get(a, 0) + own - covered
    return out


def shared_input_holders(trace: Trace, decisions: list[Decision]) -> list[int]:
    """The layers that alone keep storages an earlier layer saved first (Layer.shared_input_bytes): those not
    recomputed that read a recomputed producer. The trace counts such a storage with its producer, whose
    saved bytes a recompute drops; the consumer still holds it from F_c through B_c (docs/cost-model.md,
    'Saved twice'). A recomputed consumer holds it as a checkpoint input, or inside its producer's segment."""
    return [
        c
        for c, (layer, d) in enumerate(zip(trace.layers, decisions, strict=True))
        if layer.shared_input
        and d.action != Action.RECOMPUTE
        and any(decisions[j].action == Action.RECOMPUTE for j in layer.deps)
    ]


def stage_memory(trace: Trace, decisions: list[Decision]) -> list[int]:
    """Non-static bytes at each global stage 0..2n-1 (see docs/cost-model.md, 'Memory'). Stage n-1 (F_{n-1})
    is the larger of the last layer's forward and the loss point after it (`loss_point_bytes`)."""
    return _stage_memory(trace, decisions, loss=True)


def loss_point_bytes(trace: Trace, decisions: list[Decision], ends: dict[int, int] | None = None) -> int:
    """Non-static bytes at the loss point, between the end of F_{n-1} and the start of B_{n-1}: what is held
    across it (`loss_point_held`), every recompute segment's stashed state (`checkpoint_state_bytes`) and
    `loss_point_transient`. `ends`: `segment_ends(decisions)`, when the caller has it."""
    group_end = segment_ends(decisions) if ends is None else ends
    state = checkpoint_state_bytes(trace) * len(group_end)
    side = side_input_hold(trace, decisions, group_end)[1]
    snapshots = sum(
        x.changed_buffers for x, d in zip(trace.layers, decisions, strict=True) if d.action == Action.RECOMPUTE
    )
    held = loss_point_held(trace, decisions, group_end) + loss_point_skips(trace, decisions, group_end)
    return held + state + side + snapshots + loss_point_transient(trace)


def loss_point_held(trace: Trace, decisions: list[Decision], ends: dict[int, int] | None = None) -> int:
    """What is held across the loss point: kept saved bytes, what offloads leave on the device, every
    recompute segment's checkpoint inputs; a recomputed layer's own bytes are gone, its segment's re-run
    starts at B_{n-1} at the earliest. (The saved part of the loss point, without its transient.)"""
    group_end = segment_ends(decisions) if ends is None else ends
    held = 0
    for layer, d in zip(trace.layers, decisions, strict=True):
        if d.action == Action.KEEP:
            held += layer.saved_bytes
        elif d.action == Action.OFFLOAD:
            held += layer.saved_bytes - d.offload_bytes  # done-by <= n-1: every copy is done by now
    for j in checkpoint_inputs(trace, decisions, group_end):
        held += checkpoint_input_bytes(trace, j)
    for j in checkpoint_own_inputs(trace, decisions, group_end):
        held += trace.layers[j].output_saved
    for a, b in group_end.items():
        held += segment_external_bytes(trace, a, b)
    for c in shared_input_holders(trace, decisions):
        held += trace.layers[c].shared_input
    return held


def forward_stage_memory(trace: Trace, decisions: list[Decision], cuts: list[int] | None = None) -> list[int]:
    """Non-static bytes at F_0..F_{n-1}, the last without the loss point folded in (`stage_memory`'s are the
    larger of the two); `cuts`: the recomputed forwards' cuts to use (None: `forward_cuts`)."""
    return _stage_memory(trace, decisions, loss=False, cuts=cuts)[: trace.n]


def forward_cuts(trace: Trace) -> list[int]:
    """Per layer, how much less its forward stage F_i holds when it is recomputed than when it is kept: it runs
    under the checkpoint, which saves nothing for the backward (docs/cost-model.md, 'A recomputed layer's
    forward'). Fitted to the tracer's checkpoint-all step (Layer.checkpointed_forward_bytes): what this model
    charges F_i in that plan without the cut, less what the step measured there, clamped to 0..saved_bytes. So
    every other term the model charges there (checkpoint inputs, stashed RNG states, snapshots) is counted once,
    and checkpoint-all's forward stages come out as measured. 0 where the trace has no measurement."""
    measured = [x.checkpointed_forward_bytes for x in trace.layers]
    if all(m is None for m in measured):
        return [0] * trace.n
    uncut = forward_stage_memory(trace, [recompute() for _ in range(trace.n)], cuts=[0] * trace.n)
    return [
        0 if m is None else min(max(0, charged - m), x.saved_bytes)
        for x, m, charged in zip(trace.layers, measured, uncut, strict=True)
    ]


def stage_saved_bytes(trace: Trace, decisions: list[Decision]) -> list[int]:
    """The saved part of `stage_memory` at each global stage: saved bytes plus checkpoint inputs, without the
    transients (the stage's own, and at F_{n-1} the loss point's) and the checkpoints' stashed RNG states
    (`checkpoint_state_bytes`: not saved tensors, so the ledger does not see them). It is the same fold as
    `stage_memory`'s, moment by moment: F_{n-1}'s is the larger of what the last forward holds and what the
    loss point holds (never the loss point's whole bytes minus F_{n-1}'s transient). The runtime's
    saved-tensor ledger is its counterpart (optimizer/saved_profile.py)."""
    return _stage_memory(trace, decisions, loss=True, transients=False)


def _stage_memory(
    trace: Trace, decisions: list[Decision], loss: bool, transients: bool = True, cuts: list[int] | None = None
) -> list[int]:
    n = trace.n
    last = 2 * n - 1
    diff = [0] * (2 * n + 1)

    def add(lo: int, hi: int, nbytes: int) -> None:
        if nbytes and lo <= hi:
            diff[lo] += nbytes
            diff[hi + 1] -= nbytes

    group_end = segment_ends(decisions)
    if transients and cuts is None and any(d.action == Action.RECOMPUTE for d in decisions):
        cuts = forward_cuts(trace)
    for i, (layer, d) in enumerate(zip(trace.layers, decisions, strict=True)):
        s, fwd, bwd = layer.saved_bytes, i, last - i
        if d.action == Action.KEEP:
            add(fwd, bwd, s)
        elif d.action == Action.OFFLOAD:
            x = d.offload_bytes
            add(fwd, bwd, s - x)
            add(fwd, d.done_by, x)  # still on device until the copy is done, at the end of F_done_by
            add(last - d.prefetch_at, bwd, x)  # prefetch destination allocated when it is issued
        else:
            # Its forward runs under the checkpoint, which saves nothing: F_i holds its saved bytes less its cut
            # (`forward_cuts`), then they are dropped. (The saved profile keeps them whole: the ledger sees the
            # forward's saved tensors pass through the checkpoint.)
            add(fwd, fwd, s - (cuts[i] if transients and cuts else 0))
            a = group_start(decisions, i)
            b = group_end[a]
            add(last - b, bwd, s)  # rematerialised when the segment's backward starts
            if i == a:
                # Its re-run saves its inputs again: the storages its checkpoint holds (`rerun_input_overlap`).
                add(last - b, last - a - 1, -rerun_input_overlap(trace, a, b))
            # Changed buffers: the re-run's private copies, saved for the layer's backward (BatchNorm's running
            # statistics); in the transients, the snapshot kept from F_i until the segment's backward is done.
            m = layer.changed_buffers
            add(last - b, bwd, m)
            if transients:
                add(fwd, last - a, m)
    for j, a in checkpoint_inputs(trace, decisions, group_end).items():
        add(a + 1, last - a - 1, checkpoint_input_bytes(trace, j))
    for j, a in checkpoint_own_inputs(trace, decisions, group_end).items():
        add(a + 1, last - a - 1, trace.layers[j].output_saved)
    for a, b in group_end.items():
        add(a + 1, last - a - 1, segment_external_bytes(trace, a, b))
    # Saved twice: at F_c and B_c the consumer's workspace carries these bytes already (the tracer adds them
    # there), so stage memory adds them strictly between; the saved part, which has no workspace, from F_c
    # through B_c.
    edge = 1 if transients else 0
    for c in shared_input_holders(trace, decisions):
        add(c + edge, last - c - edge, trace.layers[c].shared_input)
    state = checkpoint_state_bytes(trace) if transients else 0
    for a, b in group_end.items():
        add(a, last - a, state)  # stashed at the segment's entry, dropped when its backward is done
        # Forked while the segment re-runs, in B_b (torch.random.fork_rng), with what its layers keep on a ctx.
        add(last - b, last - b, rerun_fork_bytes(trace, a, b) if transients else 0)
    if transients:
        # Side inputs: in the forward the model's code holds them (keep-all's fitted stages carry them); from
        # the loss point on, only checkpoints (and layers that saved them) do. Not saved tensors: the ledger
        # does not see what a checkpoint holds as its inputs, so the saved profile leaves them out.
        a, side = side_input_hold(trace, decisions, group_end)
        add(n, last - a, side)
        for lo, hi, nbytes in skip_holds(trace, decisions, group_end):
            add(lo, hi, nbytes)
        for a, nbytes in checkpoint_backward_holds(trace, decisions, group_end).items():
            add(last - a, last - a, nbytes)
    for i in range(n if transients else 0):
        add(i, i, forward_transient(trace, i))
        add(last - i, last - i, backward_transient(trace, i))
    out, run = [], 0
    for t in range(2 * n):
        run += diff[t]
        out.append(run)
    if loss:
        # The loss sits between F_{n-1} and B_{n-1}: a moment of its own, folded into F_{n-1}'s stage as the
        # larger of the two (a recomputed last layer's bytes are gone by then, so a sum would over-count).
        # Without transients, each moment's saved part: the loss point's is what is held across it.
        point = loss_point_bytes if transients else loss_point_held
        out[n - 1] = max(out[n - 1], point(trace, decisions, group_end))
    return out


def _check(trace: Trace, decisions: list[Decision]) -> None:
    if len(decisions) != trace.n:
        raise ScheduleMismatchError(f"{len(decisions)} decisions for a trace of {trace.n} layers")
    validate_actions(to_actions(trace, decisions), trace)


def default_timing(trace: Trace, decisions: list[Decision], budget_bytes: int | None = None) -> list[Decision]:
    """Fill in unset offload timing: copy right after the forward and wait for it where it is done (or
    earlier where the budget needs the memory back); prefetch as early as the budget allows, in need order.
    Runs in O(n + offloads x stages spanned), so it is usable on traces of thousands of layers."""
    n = trace.n
    last = 2 * n - 1
    out = list(decisions)
    todo = [i for i, d in enumerate(out) if d.action == Action.OFFLOAD and (d.done_by < 0 or d.prefetch_at < 0)]
    if not todo:
        return out
    if not trace.device.concurrent_copies:
        # Copies run on the compute thread and cost their whole time whenever they run: holding the
        # bytes any longer than the layer's own stages buys nothing, so the timing is synchronous.
        for i in todo:
            out[i] = replace(out[i], done_by=i, prefetch_at=i)
        return out
    unset_done = sorted(i for i in todo if out[i].done_by < 0)
    unset_pref = {i for i in todo if out[i].prefetch_at < 0}
    # Done-by: the first forward stage whose compute ends after the copy (no-stall FIFO estimate).
    fwd_end, clock = [], 0.0
    for layer in trace.layers:
        clock += layer.forward_s
        fwd_end.append(clock)
    free = 0.0
    for i, d in enumerate(out):
        if d.action != Action.OFFLOAD:
            continue
        free = max(free, fwd_end[i]) + copy_seconds(trace, d.offload_bytes, D2H)
        if d.done_by < 0:
            k = i
            while k < n - 1 and fwd_end[k] < free:
                k += 1
            out[i] = replace(d, done_by=k)
    # Provisional prefetch at the layer's own stage: undecided layers count at their low memory.
    for i in unset_pref:
        out[i] = replace(out[i], prefetch_at=i)
    limit = None if budget_bytes is None else budget_bytes - trace.static.total
    mem = stage_memory(trace, out)
    if limit is not None:
        # Pull done-by earlier (the copy then stalls) where a forward stage is over budget, earliest layer
        # first. Each layer leaves the queue once, so this is linear in layers plus stages freed.
        pending = deque(unset_done)
        for t in range(1, n):
            while pending and mem[t] > limit and pending[0] < t:
                j = pending.popleft()
                d = out[j]
                if d.done_by >= t:
                    for s in range(t, d.done_by + 1):
                        mem[s] -= d.offload_bytes
                    out[j] = replace(d, done_by=t - 1)
    cap = n - 1
    # Vectorised range search and update (numpy): one O(range) pass per prefetch in C beats an O(log n)
    # tree walked in Python by ~10x at 1,000 layers.
    stages = np.asarray(mem, dtype=np.int64) if limit is not None else None
    for i in sorted(todo, reverse=True):
        if i not in unset_pref:
            cap = min(cap, out[i].prefetch_at)
            continue
        x = out[i].offload_bytes
        p = cap
        if stages is not None and limit is not None and cap > i:
            # Earliest issue stage p (<= cap) such that every stage from B_p up to B_i still fits with x
            # added: the first stage scanning back from B_{i+1} (towards B_cap) that would overflow bounds it.
            lo = last - cap
            over = np.flatnonzero(stages[lo : last - i] > limit - x)
            p = max(i, last - (lo + int(over[-1])) - 1) if over.size else cap
            if p > i:
                stages[last - p : last - i] += x
        out[i] = replace(out[i], prefetch_at=p)
        cap = p
    return out


def simulate(
    trace: Trace,
    schedule: Schedule | list[Decision],
    budget_bytes: int | None = None,
    with_events: bool = True,
    validate: bool = True,
) -> SimResult:
    """Simulate one training step under a schedule (or raw decisions; unset timing gets `default_timing`).
    `validate=False` skips the structural checks of the decisions: only for callers that build them valid
    by construction and simulate thousands (the local search).

    Memory is `stage_memory` (docs/cost-model.md, 'Memory'); time walks the forward stages, the rest of the
    step, then the backward stages over the three streams (docs/cost-model.md, 'Time')."""
    if isinstance(schedule, Schedule):
        check_schedule(schedule, trace)
        decisions = decisions_from_schedule(schedule)
        if budget_bytes is None:
            budget_bytes = schedule.budget_bytes
    else:
        decisions = default_timing(trace, split_at_breaks(trace, schedule), budget_bytes)
    if validate:
        _check(trace, decisions)
    n = trace.n
    events: list[Event] = []
    stage_start = [0.0] * (2 * n)
    stage_end = [0.0] * (2 * n)
    ev = events.append if with_events else (lambda _e: None)
    t, fwd_stall = _forward_stages(trace, decisions, ev, stage_start, stage_end)
    # The loss and the optimizer step take the rest of the measured step; they are placed between the
    # forward and the backward on the timeline (where the loss is), which moves no copy relative to compute
    # in a way that changes stalls: prefetches are issued by backward stages.
    t += other_step_s(trace)
    t, stall, recompute_s = _backward_stages(trace, decisions, t, fwd_stall, ev, stage_start, stage_end)
    return SimResult(
        decisions=decisions,
        static_bytes=trace.static.total,
        stage_bytes=stage_memory(trace, decisions),
        stage_start=stage_start,
        stage_end=stage_end,
        step_s=t,
        keepall_step_s=keepall_step_s(trace),
        stall_s=stall,
        recompute_s=recompute_s,
        events=events,
        budget_bytes=budget_bytes,
    )


def _forward_stages(
    trace: Trace,
    decisions: list[Decision],
    ev: Callable[[Event], None],
    stage_start: list[float],
    stage_end: list[float],
) -> tuple[float, float]:
    """F_0..F_{n-1}: each forward, then its offload enqueued on the device->host stream, then the waits for
    the copies due by the end of this stage. Returns (end of the forward, stall so far)."""
    waits: dict[int, list[int]] = {}  # forward stage -> offloaded layers whose copy must be done by its end
    for i, d in enumerate(decisions):
        if d.action == Action.OFFLOAD:
            waits.setdefault(d.done_by, []).append(i)
    serial = not trace.device.concurrent_copies  # copies on the compute thread (the CPU)
    t = 0.0
    stall = 0.0
    d2h_free = 0.0
    copy_done: dict[int, float] = {}
    for i, layer in enumerate(trace.layers):
        stage_start[i] = t
        ev(Event(COMPUTE, "forward", i, t, t + layer.forward_s))
        t += layer.forward_s
        d = decisions[i]
        if d.action == Action.OFFLOAD:
            start = max(t, d2h_free)
            d2h_free = start + copy_seconds(trace, d.offload_bytes, D2H)
            copy_done[i] = d2h_free
            ev(Event(D2H, "offload", i, start, d2h_free, d.offload_bytes))
            if serial:  # the copy runs on the compute thread: compute waits for all of it, now
                ev(Event(COMPUTE, "stall", i, t, d2h_free))
                stall += d2h_free - t
                t = d2h_free
        for j in waits.get(i, ()):
            if copy_done[j] > t:
                ev(Event(COMPUTE, "stall", j, t, copy_done[j]))
                stall += copy_done[j] - t
                t = copy_done[j]
        stage_end[i] = t
    return t, stall


def _backward_stages(
    trace: Trace,
    decisions: list[Decision],
    t: float,
    stall: float,
    ev: Callable[[Event], None],
    stage_start: list[float],
    stage_end: list[float],
) -> tuple[float, float, float]:
    """B_{n-1}..B_0 from time t: the prefetches issued at this stage (host->device stream, in need order),
    the re-run of a recompute segment ending here, the wait for this layer's own prefetch, then its
    backward. Returns (end of the step, total stall, recompute time)."""
    n = trace.n
    last = 2 * n - 1
    layers = trace.layers
    prefetches: dict[int, list[int]] = {}  # backward stage (layer index) -> layers prefetched at its start
    for i, d in enumerate(decisions):
        if d.action == Action.OFFLOAD:
            prefetches.setdefault(d.prefetch_at, []).append(i)
    segments_ending_at = {b: a for a, b in segment_ends(decisions).items()}
    serial = not trace.device.concurrent_copies
    recompute_s = 0.0
    h2d_free = 0.0
    prefetch_done: dict[int, float] = {}
    for i in range(n - 1, -1, -1):
        s = last - i
        stage_start[s] = t
        for j in sorted(prefetches.get(i, ()), reverse=True):
            start = max(t, h2d_free)
            h2d_free = start + copy_seconds(trace, decisions[j].offload_bytes, H2D)
            prefetch_done[j] = h2d_free
            ev(Event(H2D, "prefetch", j, start, h2d_free, decisions[j].offload_bytes))
            if serial:
                ev(Event(COMPUTE, "stall", j, t, h2d_free))
                stall += h2d_free - t
                t = h2d_free
        if i in segments_ending_at:
            a = segments_ending_at[i]
            for k in range(a, i + 1):
                # The last layer re-runs only up to the checkpoint's early stop; each layer carries its share of
                # the recompute machinery, the first the segment's own (Trace.segment_rerun_s).
                dur = (layers[k].rerun_s if k == i else layers[k].forward_s) + trace.rerun_layer_s
                dur += trace.rerun_segment_s if k == a else 0.0
                ev(Event(COMPUTE, "recompute", k, t, t + dur))
                t += dur
                recompute_s += dur
        if i in prefetch_done and prefetch_done[i] > t:
            ev(Event(COMPUTE, "stall", i, t, prefetch_done[i]))
            stall += prefetch_done[i] - t
            t = prefetch_done[i]
        ev(Event(COMPUTE, "backward", i, t, t + layers[i].backward_s))
        t += layers[i].backward_s
        stage_end[s] = t
    return t, stall, recompute_s


def make_schedule(
    trace: Trace,
    decisions: list[Decision],
    budget_bytes: int,
    policy: str,
    solver: SolverRecord,
) -> Schedule:
    """Build a Schedule whose prediction is the simulator's (the one yardstick for every policy)."""
    sim = simulate(trace, decisions, budget_bytes)
    return Schedule(
        trace_hash=trace.content_hash(),
        layer_names=trace.layer_names,
        budget_bytes=budget_bytes,
        policy=policy,
        actions=to_actions(trace, sim.decisions),
        prediction=sim.prediction(),
        solver=solver,
        traced=TracedWorkload.of(trace),
    )
