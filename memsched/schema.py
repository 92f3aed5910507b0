"""The contracts between the parts: Trace (what the tracer measured) and Schedule (what the optimizer chose).

Units are seconds and bytes everywhere. Both models carry a `schema_version`; readers reject versions they
do not know instead of guessing. Cross-checks that need both a trace and a schedule live in `check_schedule`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from memsched.errors import ScheduleMismatchError

TRACE_SCHEMA_VERSION = "1"
SCHEDULE_SCHEMA_VERSION = "1"

# Units by type, constraints only: a description here would hide every field's own docstring in the JSON Schema.
Seconds = Annotated[float, Field(ge=0, allow_inf_nan=False)]
Bytes = Annotated[int, Field(ge=0)]
PositiveBytes = Annotated[int, Field(gt=0)]
PositiveRate = Annotated[float, Field(gt=0, allow_inf_nan=False)]


class _Strict(BaseModel):
    # Each field's docstring is its description in docs/*.schema.json and in the API's OpenAPI document.
    model_config = ConfigDict(extra="forbid", frozen=False, validate_assignment=False, use_attribute_docstrings=True)


def _check_version(value: str, supported: str, what: str) -> str:
    if value != supported:
        raise ValueError(
            f"unknown {what} schema_version {value!r}; this memsched reads version {supported!r}. "
            f"Re-export the {what} with this memsched version or upgrade memsched"
        )
    return value


# --------------------------------------------------------------------------------------------------------------
# Trace
# --------------------------------------------------------------------------------------------------------------


class DeviceInfo(_Strict):
    """The device the trace was measured on, with its copy engine's measured speeds."""

    name: str = Field(min_length=1)
    """Device name as the framework reports it, e.g. 'NVIDIA H100 80GB HBM3' or 'cpu'."""
    memory_bytes: PositiveBytes
    """Total device memory capacity, bytes."""
    h2d_bytes_per_s: PositiveRate
    """Measured pinned host->device copy bandwidth, bytes per second (the prefetch speed)."""
    d2h_bytes_per_s: PositiveRate
    """Measured pinned device->host copy bandwidth, bytes per second (the offload speed)."""
    copy_latency_s: Seconds = 0.0
    """Fixed per-copy latency added to every transfer, seconds."""
    concurrent_copies: bool = True
    """True when copies overlap compute (a GPU's copy engines). False when they run on the compute thread
    (the CPU): every offload is then synchronous and its whole copy time is stall."""

    @property
    def is_host(self) -> bool:
        """Measured on the CPU (the tracer names it 'cpu (...)'): host memory is this device's memory, so an
        offload moves bytes without lowering the process's peak."""
        return self.name.lower().startswith("cpu")


class StaticBytes(_Strict):
    """Memory no schedule can move: parameters, their gradients and optimizer state."""

    params: Bytes = 0
    """Parameter bytes."""
    grads: Bytes = 0
    """Gradient bytes (same as params for dense training)."""
    optimizer_state: Bytes = 0
    """Optimizer state bytes (e.g. 2x params for Adam)."""
    other: Bytes = 0
    """Bytes of anything else resident for the whole step (input batch, buffers, allocator reserve)."""
    saved_before_layers: Bytes = 0
    """Bytes the step itself saves outside every traced layer before the first one runs (an embedding's, a CNN
    stem's saved tensors). They live to the end of the backward and no schedule moves them, so the planner
    treats them as static; but the step allocates them, so to the user they are activations, and a percentage
    budget counts them as such (optimizer/budget.py). 0 in traces written before this field (there they are
    in `other`)."""
    saved_held_by_code: Bytes = 0
    """Bytes that traced layers save and that the model's own code also holds past the layer's forward: an
    embedding output or rotary table a forward keeps in a local variable, autocast's cache of weight casts. Moving
    them frees nothing while the code holds them, so each sits in its layer's save order with 0 bytes (no plan
    moves it) and is counted here, for the whole step: what the tracer measured (docs/cost-model.md, 'Storages
    the model's code holds'). Activations to the user, like saved_before_layers. 0 in traces written before this
    field."""

    @property
    def total(self) -> int:
        return (
            self.params
            + self.grads
            + self.optimizer_state
            + self.other
            + self.saved_before_layers
            + self.saved_held_by_code
        )

    @property
    def saved_static(self) -> int:
        """Activations no schedule moves: saved_before_layers + saved_held_by_code."""
        return self.saved_before_layers + self.saved_held_by_code

    @property
    def resident(self) -> int:
        """What the device holds when the step begins (total without the activations in saved_static)."""
        return self.total - self.saved_static


# How far below the sum of its layers' forward + backward times a trace's measured step may be (see
# Trace._baseline_step). The traces recorded so far have step / layers between 1.02 and 2.3.
STEP_BELOW_LAYERS_FACTOR = 2.0

MAX_DEVICE_BYTES = 2**62
"""The most bytes any budget or trace may add up to: far beyond any device, and what a 64-bit database column
(BIGINT) holds. More is a unit mistake, and the cost model's sums would overflow."""


class Baseline(_Strict):
    """The unscheduled (keep-all) training step as measured."""

    step_s: Seconds
    """Median measured step time (forward + backward + optimizer), seconds."""
    peak_bytes: Bytes
    """Measured device-memory peak of the step, bytes."""


class RerunOverhead(_Strict):
    """What a recompute costs beyond its layers' own re-runs (forward_s, Layer.rerun_s): torch.utils.checkpoint's
    frame, its unpack hooks and the replay's bookkeeping around each segment, and each re-run layer's share of
    them. The tracer measures it side by side with the keep-all step: steps with every layer a segment of its
    own and steps with the longest segments the trace allows (docs/cost-model.md, 'What a re-run costs')."""

    per_segment_s: Seconds = 0.0
    """Seconds each recompute segment costs once, in its B_b, beyond its layers' re-runs."""
    per_layer_s: Seconds = 0.0
    """Seconds each re-run layer of a segment costs beyond its forward_s (rerun_s for the segment's last)."""


class Layer(_Strict):
    """One traced layer, in forward order. Its saved tensors follow the attribution rule
    (docs/architecture.md, 'Trace')."""

    name: str = Field(min_length=1)
    """Module path in the model, e.g. 'transformer.h.3' (unique within the trace)."""
    kind: str = ""
    """Module class name or operator kind, e.g. 'GPT2Block'."""
    forward_s: Seconds
    """Forward compute time of this layer, seconds."""
    backward_s: Seconds
    """Backward compute time of this layer, seconds: its gradient computation, not the forward re-run of a
    recompute (that costs forward_s again)."""
    saved_bytes: Bytes
    """Bytes autograd keeps for this layer's backward, deduplicated by storage."""
    saved_tensor_bytes: list[Bytes] = Field(default_factory=list)
    """Sizes of the individual saved tensors (sum == saved_bytes); empty means one tensor of saved_bytes."""
    input_bytes: Bytes = 0
    """Bytes of the tensors this layer reads (its gradient is produced during backward)."""
    output_bytes: Bytes = 0
    """Bytes of this layer's output (kept as a checkpoint input when a consumer is recomputed)."""
    workspace_bytes: Bytes = 0
    """Transient bytes allocated and freed inside the layer's forward or backward."""
    deps: list[int] = Field(default_factory=list)
    """Indices of earlier layers whose outputs this layer consumes (a DAG: residuals are real)."""
    recompute_s: Seconds | None = None
    """Seconds to re-run this layer's forward as the LAST layer of a checkpointed segment: torch.utils.checkpoint
    (non-reentrant, early stop) stops the re-run at the layer's last op that saves a tensor, so a layer ending
    in ops that save nothing new (a GPT-2 block's c_proj + residual add) re-runs for less than forward_s.
    None means forward_s (a layer ending in a saving op re-runs whole). At most forward_s. A segment [a..b]
    re-runs for forward_s of a..b-1 plus this of b (docs/cost-model.md, 'What a re-run costs')."""
    forward_workspace_bytes: Bytes | None = None
    """Bytes F_i needs beyond the layer model (its forward stage's share of workspace_bytes, which is the larger
    of the forward's and the backward's need). None means workspace_bytes (traces written before this field
    price as before). At most workspace_bytes."""

    shared_input_bytes: Bytes | None = None
    """Bytes of storages this layer saves that an earlier layer saved first, so the trace counts them with that
    layer (a ResNet block's last ReLU output, saved again as the next block's convolution input). When a
    producer among `deps` is recomputed and this layer is not, this layer alone keeps them alive, from F_i
    through B_i (docs/cost-model.md, 'Saved twice'). None means 0 (traces written before this field price as
    before). The tracer also adds them to this layer's workspace, for F_i and B_i."""

    resaved_from: list[int] | None = None
    """Forward indices of the earlier layers that first saved a storage this layer saves too, whatever its bytes
    (the one in shared_input_bytes, or a static one such as a mask the model's code made, saved by every block).
    The replay numbers a layer's saved storages in the order it claims them, so where one of two such layers
    offloads, both run with the replay's saved-tensor hooks; a kept layer that shares with none runs without
    them (memsched.runtime.replay). None: not recorded (traces written before this field): every kept layer of a
    plan that offloads runs with the hooks."""

    side_input_bytes: Bytes | None = None
    """Bytes of the tensors this layer reads that need no gradient and that neither a traced layer nor the
    process before the step made: the step's own masks, rotary tables and position ids, created before the
    layers (deduplicated by storage within the layer). A recompute segment's checkpoint keeps its layers' inputs
    until its backward is done, so after the forward these live on while any segment holds them (docs/
    cost-model.md, 'Side inputs'). None means 0 (traces written before this field price as before)."""

    changed_buffer_bytes: Bytes | None = None
    """Bytes of the buffers this layer's forward changes (BatchNorm's running statistics and its batch count).
    Recomputing it keeps a snapshot of them from F_i until its segment's backward is done, so the re-run reads
    what the forward read, and re-runs on private copies of them, which the layer's backward may keep as saved
    tensors (BatchNorm does) from the re-run in B_b through B_i (docs/cost-model.md, 'What a recomputation
    holds'). None means 0 (traces written before this field price as before)."""

    output_saved_bytes: Bytes | None = None
    """Bytes of this layer's outputs that its own saved tensors hold (ResNet: a bottleneck's last ReLU saves its
    result). While the layer is kept they stay on the device in its saved bytes, so a recompute segment reading
    that output holds only the rest as its checkpoint input (docs/cost-model.md, 'Checkpoint inputs'). At most
    output_bytes. None means 0 (traces written before this field price as before)."""

    checkpointed_forward_bytes: Bytes | None = None
    """Device bytes above static memory at the peak of this layer's forward stage F_i (its forward and the code
    after it up to the next layer) in the tracer's checkpoint-all step, where every layer is recomputed on its own.
    The cost model fits what a recomputed layer's forward holds to it (simulate.forward_cuts; docs/cost-model.md,
    'A recomputed layer's forward'). None: not measured (priced as a kept forward, as before this field)."""

    output_saved_readers: list[int] | None = None
    """Forward indices of the later layers that read the outputs counted in output_saved_bytes (a UNet down block
    saves its skip and hands its pooled map to the next block: the skip's reader is the up block). The model's
    code keeps such an output in the forward until its last reader, and a recompute segment of a reader holds it
    through its own backward (docs/cost-model.md, 'Outputs the model keeps'). None: the layers that read any of
    its outputs (deps)."""

    output_held_until: int | None = Field(default=None, ge=0)
    """Where the model's code lets go of the outputs counted in output_saved_bytes: the forward index of the last
    layer whose forward starts while the code still holds one of them, or the number of layers where one is still
    held when the backward starts (a local variable of a forward that computes the loss: a UNet's last skip, left
    in its loop variable). The tracer sees it in its memory step. Where this layer is not kept, autograd lets go
    of the output and the code holds it until then (docs/cost-model.md, 'Outputs the model keeps'). None: until its
    last reader (output_saved_readers)."""

    input_saved_bytes: Bytes | None = None
    """Bytes of this layer's own saved tensors (counted in saved_bytes) that are its inputs: a convolution's or a
    norm's input, saved as is. A recompute segment starting at this layer holds its inputs in its checkpoint, and
    the layer's re-run saves those same storages again, so from B_b through B_{a+1} the checkpoint and the
    rematerialised bytes are one storage (docs/cost-model.md, 'Checkpoint inputs'). At most input_bytes and
    saved_bytes. None means 0 (traces written before this field price as before)."""

    ctx_held_bytes: Bytes | None = None
    """Bytes of tensors this layer's forward stores as attributes of a custom autograd Function's `ctx` instead of
    through `ctx.save_for_backward` (8-bit and 4-bit matmuls keep their quantisation state so). No saved-tensor hook
    sees them, so no schedule offloads or frees them: they live from F_i through B_i under every plan, which the
    tracer's workspace fit prices, and a recompute segment's re-run makes them again while the forward's are still
    held, at the segment's last layer's backward B_b (docs/cost-model.md, 'Tensors kept on a ctx'). None means 0
    (traces written before this field price as before)."""

    code_after_saves: bool = False
    """Whether the model's code between this layer's forward and the next layer's saves tensors for backward: a
    norm or a residual op between sub-module layers (attention and MLP traced apart). The replay re-runs only
    traced layers, so a recompute segment cannot run past this layer: its re-run would not redo those saves
    (Trace.segment_last). Their bytes are priced in the later layers' workspace, as the tracer measured them.
    False in traces written before this field (their plans are checked again at replay)."""

    @property
    def ctx_held(self) -> int:
        """ctx_held_bytes, or 0 where None."""
        return self.ctx_held_bytes or 0

    @property
    def input_saved(self) -> int:
        """input_saved_bytes, or 0 where None."""
        return self.input_saved_bytes or 0

    @property
    def output_saved(self) -> int:
        """output_saved_bytes, or 0 where None."""
        return self.output_saved_bytes or 0

    @model_validator(mode="after")
    def _output_saved_within(self) -> Layer:
        v = self.output_saved_bytes
        if v is not None and not v <= min(self.output_bytes, self.saved_bytes):
            raise ValueError(
                f"output_saved_bytes = {v} exceeds output_bytes = {self.output_bytes} or saved_bytes = "
                f"{self.saved_bytes}; it counts the outputs the layer's own saved tensors hold: set it at most "
                "the smaller of the two, or leave it null (null means 0)"
            )
        return self

    @model_validator(mode="after")
    def _input_saved_within(self) -> Layer:
        v = self.input_saved_bytes
        if v is not None and not v <= min(self.input_bytes, self.saved_bytes):
            raise ValueError(
                f"input_saved_bytes = {v} exceeds input_bytes = {self.input_bytes} or saved_bytes = "
                f"{self.saved_bytes}; it counts the inputs the layer's own saved tensors hold: set it at most "
                "the smaller of the two, or leave it null (null means 0)"
            )
        return self

    @property
    def changed_buffers(self) -> int:
        """changed_buffer_bytes, or 0 where None."""
        return self.changed_buffer_bytes or 0

    @property
    def side_input(self) -> int:
        """side_input_bytes, or 0 where None."""
        return self.side_input_bytes or 0

    @property
    def shared_input(self) -> int:
        """shared_input_bytes, or 0 where None."""
        return self.shared_input_bytes or 0

    @property
    def forward_workspace(self) -> int:
        """Workspace bytes charged at F_i: forward_workspace_bytes, or workspace_bytes where None."""
        return self.workspace_bytes if self.forward_workspace_bytes is None else self.forward_workspace_bytes

    @model_validator(mode="after")
    def _forward_workspace_within(self) -> Layer:
        fw = self.forward_workspace_bytes
        if fw is not None and not 0 <= fw <= self.workspace_bytes:
            raise ValueError(
                f"forward_workspace_bytes = {fw} is outside 0..workspace_bytes = {self.workspace_bytes}; "
                "workspace_bytes is the larger of the forward's and backward's need: set 0 <= "
                "forward_workspace_bytes <= workspace_bytes, or leave it null (null means workspace_bytes)"
            )
        return self

    @property
    def rerun_s(self) -> float:
        """What re-running this layer costs as a segment's last layer: recompute_s, or forward_s where None."""
        return self.forward_s if self.recompute_s is None else self.recompute_s

    @model_validator(mode="after")
    def _rerun_within_forward(self) -> Layer:
        if self.recompute_s is not None and self.recompute_s > self.forward_s:
            raise ValueError(
                f"recompute_s = {self.recompute_s:g} s exceeds forward_s = {self.forward_s:g} s; a re-run up to the "
                "checkpoint's early stop is part of the forward: set recompute_s <= forward_s, or leave it null "
                "(null means forward_s)"
            )
        return self

    @model_validator(mode="after")
    def _tensors_sum(self) -> Layer:
        if self.saved_tensor_bytes and sum(self.saved_tensor_bytes) != self.saved_bytes:
            raise ValueError(
                f"saved_tensor_bytes sum to {sum(self.saved_tensor_bytes)} but saved_bytes is {self.saved_bytes}; "
                "make saved_bytes the sum of the individual tensors (or leave saved_tensor_bytes empty)"
            )
        return self

    @property
    def tensors(self) -> list[int]:
        """The saved tensors' sizes; a layer with no breakdown counts as one tensor."""
        if self.saved_tensor_bytes:
            return list(self.saved_tensor_bytes)
        return [self.saved_bytes] if self.saved_bytes else []


class Trace(_Strict):
    """A layer-level cost trace of one training step (docs/architecture.md, 'Trace')."""

    schema_version: str = TRACE_SCHEMA_VERSION
    """Trace format version; unknown versions are rejected."""
    model: str = Field(min_length=1)
    """Model identifier, e.g. 'gpt2' or 'pipedream/resnet50'."""
    batch_size: int = Field(ge=1)
    """Batch size the trace was measured at."""
    seq_len: int | None = Field(default=None, ge=1)
    """Sequence length for sequence models, else None."""
    dtype: str = "float32"
    """Activation dtype, e.g. 'float32' or 'bfloat16'."""
    framework: dict[str, str] = Field(default_factory=dict)
    """Versions of the software that produced the trace, e.g. {'torch': '2.13.0'}."""
    source: str = "tracer"
    """What produced the trace: 'tracer', 'import:pipedream', 'synthetic', ..."""
    device: DeviceInfo
    """The device the trace was measured on."""
    static: StaticBytes = Field(default_factory=StaticBytes)
    """Memory no schedule can move."""
    baseline: Baseline
    """Measured keep-all step time and peak."""
    layers: list[Layer]
    """Layers in forward order."""
    rerun_overhead: RerunOverhead | None = None
    """Measured cost of the recompute machinery (RerunOverhead). None: not measured (imported and synthetic
    traces, traces written before this field): re-runs cost their layers' times alone."""

    @field_validator("schema_version")
    @classmethod
    def _version(cls, v: str) -> str:
        return _check_version(v, TRACE_SCHEMA_VERSION, "trace")

    @field_validator("layers")
    @classmethod
    def _layers(cls, layers: list[Layer]) -> list[Layer]:
        if not layers:
            raise ValueError("the trace has no layers; trace at least one layer (check the layer patterns)")
        seen: dict[str, int] = {}
        for i, layer in enumerate(layers):
            if layer.name in seen:
                raise ValueError(
                    f"layers[{i}].name {layer.name!r} repeats layers[{seen[layer.name]}].name; "
                    "layer names must be unique module paths"
                )
            seen[layer.name] = i
            for k, d in enumerate(layer.deps):
                if not 0 <= d < i:
                    earlier = f"indices of earlier layers (0..{i - 1})" if i else "empty: layer 0 has no earlier layer"
                    raise ValueError(
                        f"layers[{i}].deps[{k}] = {d} points "
                        f"{'forward or at itself' if d >= i else 'out of range'}; deps must be {earlier}"
                    )
            if len(set(layer.deps)) != len(layer.deps):
                raise ValueError(f"layers[{i}].deps {layer.deps} repeats an index; list each producer once")
            for k, r in enumerate(layer.output_saved_readers or []):
                if not i < r < len(layers):
                    raise ValueError(
                        f"layers[{i}].output_saved_readers[{k}] = {r} is not a later layer; list indices of the "
                        f"layers that read its outputs ({i + 1}..{len(layers) - 1}), or leave it null"
                    )
            for k, j in enumerate(layer.resaved_from or []):
                if not 0 <= j < i:
                    raise ValueError(
                        f"layers[{i}].resaved_from[{k}] = {j} is not an earlier layer; list indices of the layers "
                        f"that first saved a storage it saves too (0..{i - 1}), or leave it null"
                    )
        return layers

    @model_validator(mode="after")
    def _bytes_fit_a_device(self) -> Trace:
        # Sizes each within range can still add up past any device (2**62 per layer's saved bytes, say): refused
        # here, naming the units, rather than later as a budget "larger than any device".
        total = self.static.total + sum(x.saved_bytes + x.output_bytes + x.workspace_bytes for x in self.layers)
        if total > MAX_DEVICE_BYTES:
            raise ValueError(
                f"the trace's bytes (static, and each layer's saved, output and workspace bytes) add up to "
                f"{float(total):.3g}, beyond any device ({MAX_DEVICE_BYTES} at most); fix: give sizes in bytes, or "
                "re-trace"
            )
        return self

    @model_validator(mode="after")
    def _baseline_step(self) -> Trace:
        # The simulator charges the step's time outside the layers as baseline.step_s minus the layers'
        # forward + backward, clamped at 0, and measures every overhead against that keep-all step: a step_s
        # of 0 (or far below its own parts) silently drops the optimizer and loss time and inflates every
        # overhead percentage. Per-layer timing may read somewhat high (hooks, synchronisation), so a step
        # below its parts is tolerated down to half of them; a trace beyond that was not measured as one step.
        parts = sum(x.forward_s + x.backward_s for x in self.layers)
        step = self.baseline.step_s
        if step <= 0:
            raise ValueError(
                f"baseline.step_s = {step:g} s: the measured step time must be > 0; "
                f"fix: record the whole step's time (the layers' forward + backward alone sum to {parts:.6g} s)"
            )
        if step < parts / STEP_BELOW_LAYERS_FACTOR:
            raise ValueError(
                f"baseline.step_s = {step:.6g} s is less than 1/{STEP_BELOW_LAYERS_FACTOR:g} of the layers' "
                f"forward + backward ({parts:.6g} s), which it includes; fix: record the whole step's time "
                "(forward, backward and optimizer) in seconds, or re-trace"
            )
        return self

    @property
    def n(self) -> int:
        return len(self.layers)

    @property
    def layer_names(self) -> list[str]:
        return [layer.name for layer in self.layers]

    def saved_output_readers(self) -> list[list[int]]:
        """Per layer, the later layers that read the outputs it saved itself (Layer.output_saved_readers), or where
        the trace does not say, every layer that reads any of its outputs (deps)."""
        readers: list[list[int]] = [[] for _ in range(self.n)]
        for c, layer in enumerate(self.layers):
            for j in layer.deps:
                readers[j].append(c)
        return [r if (r := x.output_saved_readers) is not None else readers[j] for j, x in enumerate(self.layers)]

    def segment_last(self) -> list[int]:
        """Per layer a, the last layer a recompute segment starting at a may end at: the first layer from a on
        after which the model's code saves tensors for backward (Layer.code_after_saves), else the last layer.
        Every planner and the schedule check use this rule."""
        out = [0] * self.n
        last = self.n - 1
        for a in range(self.n - 1, -1, -1):
            if self.layers[a].code_after_saves:
                last = a
            out[a] = last
        return out

    @property
    def rerun_segment_s(self) -> float:
        """Seconds each recompute segment costs once beyond its layers' re-runs (RerunOverhead.per_segment_s)."""
        return self.rerun_overhead.per_segment_s if self.rerun_overhead is not None else 0.0

    @property
    def rerun_layer_s(self) -> float:
        """Seconds each re-run layer costs beyond its own time (RerunOverhead.per_layer_s)."""
        return self.rerun_overhead.per_layer_s if self.rerun_overhead is not None else 0.0

    def least_rerun_s(self, i: int) -> float:
        """The least re-running layer i costs in any recompute segment (Trace.segment_rerun_s): whole inside one, or
        to the checkpoint's early stop with the segment's share as its last, and its own share either way. The
        bounds that price a recomputed layer alone use it, so they stay bounds."""
        layer = self.layers[i]
        return min(layer.forward_s, layer.rerun_s + self.rerun_segment_s) + self.rerun_layer_s

    def segment_rerun_s(self, a: int, b: int) -> float:
        """Seconds a recompute segment [a..b] re-runs in B_b: the whole forwards of layers a..b-1, the last
        layer's re-run up to the checkpoint's early stop (Layer.rerun_s), and the recompute machinery's measured
        cost, once for the segment and once per layer (RerunOverhead). Every pricer uses this rule."""
        machinery = self.rerun_segment_s + (b - a + 1) * self.rerun_layer_s
        return sum(x.forward_s for x in self.layers[a:b]) + self.layers[b].rerun_s + machinery

    def content_hash(self) -> str:
        """sha256 of the canonical JSON form: identical traces hash identically, whatever the key order.
        Fields added after version 1 enter the hash only when they differ from their default, so traces
        (and the schedules that name their hash) written before a field existed keep their hash."""
        doc = self.model_dump(mode="json")
        if doc["device"].get("concurrent_copies", True):
            doc["device"].pop("concurrent_copies", None)
        for key in ("saved_before_layers", "saved_held_by_code"):
            if not doc["static"].get(key):
                doc["static"].pop(key, None)
        if doc.get("rerun_overhead", 0) is None:
            doc.pop("rerun_overhead")
        for layer in doc["layers"]:
            for key in (
                "recompute_s",
                "forward_workspace_bytes",
                "shared_input_bytes",
                "resaved_from",
                "side_input_bytes",
                "changed_buffer_bytes",
                "output_saved_bytes",
                "checkpointed_forward_bytes",
                "output_saved_readers",
                "input_saved_bytes",
                "output_held_until",
                "ctx_held_bytes",
            ):
                if layer.get(key, 0) is None:
                    layer.pop(key)
            if not layer.get("code_after_saves", False):
                layer.pop("code_after_saves", None)
        payload = json.dumps(doc, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(payload.encode()).hexdigest()


# --------------------------------------------------------------------------------------------------------------
# Schedule
# --------------------------------------------------------------------------------------------------------------


class Action(StrEnum):
    KEEP = "keep"
    OFFLOAD = "offload"
    RECOMPUTE = "recompute"


class SolverStatus(StrEnum):
    OPTIMAL = "optimal"
    """Proven optimal within the requested gap."""
    FEASIBLE = "feasible"
    """A valid schedule, with a bound and a gap, but not proven optimal in the time limit."""
    HEURISTIC = "heuristic"
    """A valid schedule from the heuristic or a baseline; no bound was proven."""
    INFEASIBLE = "infeasible"
    """No schedule fits the budget."""


class JobStatus(StrEnum):
    """Where a solve job of the service stands (the API's job bodies, its database rows, the client)."""

    QUEUED = "queued"
    """Waiting for a solver."""
    RUNNING = "running"
    """A solver has it."""
    DONE = "done"
    """Finished with a schedule."""
    FAILED = "failed"
    """Finished without one (the job's `reason` says why)."""
    CANCELLED = "cancelled"
    """Cancelled by its owner; a solve already running ends at its time limit and its answer is discarded."""

    @classmethod
    def finished(cls) -> tuple[JobStatus, ...]:
        """The states a job does not leave by itself (asking the same question again retries failed and
        cancelled jobs)."""
        return (cls.DONE, cls.FAILED, cls.CANCELLED)


class OffloadPlan(_Strict):
    """Which of a layer's saved tensors go to host memory, and when the copies happen."""

    tensors: list[int]
    """Indices into the layer's saved_tensor_bytes that are offloaded (memory object sectioning)."""
    bytes: Bytes
    """Sum of the offloaded tensors' sizes, bytes."""
    done_by_layer: int = Field(ge=0)
    """Forward stage (layer index >= this layer) at whose end the device->host copy must be done and freed."""
    prefetch_at_layer: int = Field(ge=0)
    """Backward stage (layer index >= this layer) at whose start the host->device prefetch is issued."""


class LayerAction(_Strict):
    """What the runtime does with one layer's saved tensors."""

    layer: str
    """Layer name (module path), as in the trace."""
    action: Action
    """keep | offload | recompute."""
    offload: OffloadPlan | None = None
    """Present iff action == offload."""
    recompute_group: int | None = None
    """For recompute: index of the first layer of the checkpointed segment this layer belongs to
    (None = a segment of its own). A segment keeps only its input and recomputes all its layers."""

    @model_validator(mode="after")
    def _consistent(self) -> LayerAction:
        if (self.action == Action.OFFLOAD) != (self.offload is not None):
            raise ValueError(
                f"layer {self.layer!r}: 'offload' must be given exactly when action is 'offload' "
                f"(action is {self.action.value!r})"
            )
        if self.recompute_group is not None and self.action != Action.RECOMPUTE:
            raise ValueError(f"layer {self.layer!r}: recompute_group is only allowed with action 'recompute'")
        return self


class PlannedDevice(_Strict):
    """The device and host link a schedule was planned for (what `--link` and `--ranks-per-link` made of the
    trace's device; memsched/hardware.py)."""

    name: str
    """The trace's device name."""
    link: str
    """'measured' (the trace's own copy rates), a preset (pcie3, pcie4, pcie5, gh200) or the rate given."""
    ranks_per_link: int = Field(default=1, ge=1)
    """GPUs sharing the link; the rates below are one GPU's share."""
    h2d_bytes_per_s: PositiveRate
    """Host -> device copy rate the plan assumed, bytes per second (one GPU's share)."""
    d2h_bytes_per_s: PositiveRate
    """Device -> host copy rate the plan assumed, bytes per second (one GPU's share)."""


class Prediction(_Strict):
    """What the simulator predicts for the schedule."""

    peak_bytes: Bytes
    """Predicted device-memory peak, bytes (static + activations + in-flight copies + workspace)."""
    step_s: Seconds
    """Predicted step time, seconds."""
    keepall_step_s: Seconds
    """Predicted step time of the in-core (keep-all) step, seconds."""
    overhead_s: Seconds
    """step_s - keepall_step_s = stall_s + recompute_s, seconds."""
    overhead_pct: float
    """overhead_s as a percentage of keepall_step_s."""
    stall_s: Seconds
    """Time compute waits for copies, seconds."""
    recompute_s: Seconds
    """Time spent re-running forwards, seconds."""
    host_peak_bytes: Bytes | None = None
    """Predicted host-memory peak, bytes: the most offloaded copies the plan holds on the host at once (pinned
    buffers; each from its layer's forward through its backward, so every offloaded byte at the loss point).
    None in schedules written before this field existed."""


class SolverRecord(_Strict):
    """How the schedule was obtained."""

    backend: str
    """'cbc', 'highs', 'cpsat', 'heuristic' or a baseline policy name."""
    status: SolverStatus
    """optimal / feasible / heuristic / infeasible."""
    objective_s: float | None = None
    """Solver objective (predicted overhead in seconds) of the returned schedule."""
    best_bound_s: float | None = None
    """Best proven lower bound on the overhead, when the backend proves one."""
    gap: float | None = None
    """Relative gap (objective - bound) / objective, when a bound is known."""
    wall_s: Seconds = 0.0
    """Wall-clock time spent solving, seconds."""
    message: str = ""
    """One plain sentence for the user: what was proven about this schedule and what limited the proof (or
    why a fallback was taken)."""
    details: list[str] = Field(default_factory=list)
    """The solver's own notes, one per phase that had something to say (bound sources, backends' statuses,
    where a sweep stopped), for reproduction and bug reports."""


class TracedWorkload(_Strict):
    """The workload a trace was recorded at, as a schedule made from it records it: what a replay must build for
    the schedule's predictions to hold (`memsched measure` checks it where no trace is given)."""

    model: str
    """Trace.model: the model id (a built-in's name and size, or the factory's)."""
    batch_size: int = Field(ge=1)
    """Trace.batch_size."""
    seq_len: int | None = Field(default=None, ge=1)
    """Trace.seq_len (None: no sequence)."""
    dtype: str
    """Trace.dtype."""

    @classmethod
    def of(cls, trace: Trace) -> TracedWorkload:
        return cls(model=trace.model, batch_size=trace.batch_size, seq_len=trace.seq_len, dtype=trace.dtype)


class Schedule(_Strict):
    """A keep / offload / recompute plan for every layer of one trace under one budget."""

    schema_version: str = SCHEDULE_SCHEMA_VERSION
    """Schedule format version; unknown versions are rejected."""
    trace_hash: str = Field(min_length=1)
    """Trace.content_hash() of the trace this schedule was made for."""
    layer_names: list[str]
    """The trace's layer names, in forward order."""
    budget_bytes: PositiveBytes
    """The device-memory budget (whole peak) in bytes."""
    host_budget_bytes: Bytes | None = None
    """The host-memory budget the plan was made under (SolveOptions.host_budget), bytes: the replay's pinned
    pool refuses to grow past it. None: no limit."""
    policy: str = "ilp"
    """Which policy produced it: 'ilp', 'heuristic', 'keep-all', 'checkpoint-all', ..."""
    actions: list[LayerAction]
    """One action per layer, in forward order."""
    prediction: Prediction
    """The simulator's prediction for this schedule."""
    solver: SolverRecord
    """How it was obtained."""
    planned_for: PlannedDevice | None = None
    """The device and link the plan assumed (None: the trace's device as measured, in schedules written before
    this field existed or outside the service)."""
    traced: TracedWorkload | None = None
    """The workload the trace was recorded at (None in schedules written before this field): a replay at another
    batch or sequence does not get the predicted peak."""

    @field_validator("schema_version")
    @classmethod
    def _version(cls, v: str) -> str:
        return _check_version(v, SCHEDULE_SCHEMA_VERSION, "schedule")

    @model_validator(mode="after")
    def _names(self) -> Schedule:
        if len(self.actions) != len(self.layer_names):
            raise ValueError(
                f"actions has {len(self.actions)} entries but layer_names has {len(self.layer_names)}; "
                "give exactly one action per layer"
            )
        for i, (a, name) in enumerate(zip(self.actions, self.layer_names, strict=True)):
            if a.layer != name:
                raise ValueError(f"actions[{i}].layer is {a.layer!r} but layer_names[{i}] is {name!r}")
        return self

    def action_counts(self) -> dict[str, int]:
        """How many layers keep, offload and recompute (every action named, in that order)."""
        counts = dict.fromkeys((a.value for a in Action), 0)
        for a in self.actions:
            counts[a.action.value] += 1
        return counts


def recompute_segment_ends(starts: Iterable[tuple[int, int]]) -> dict[int, int]:
    """The recompute segments as {first layer: last layer}, from (layer, first layer of its segment) for every
    recomputed layer (a layer starts a segment of its own when `LayerAction.recompute_group` is None).
    The optimizer's cost model and the runtime's replay read their segments from here."""
    ends: dict[int, int] = {}
    for i, a in starts:
        ends[a] = max(ends.get(a, a), i)
    return ends


def validate_trace(data: object) -> Trace:
    """A trace from parsed JSON, as every reader takes it (files, the REST service): strictly, since the schema
    promises integers for byte counts and lax mode would quietly take `true`, `"14172160"` or `1.5e9` as bytes
    (ints are still accepted where floats are due). Raises pydantic's ValidationError."""
    return Trace.model_validate(data, strict=True)


def check_schedule(schedule: Schedule, trace: Trace) -> None:
    """Raise ScheduleMismatchError naming the first way the schedule does not fit the trace."""
    if schedule.layer_names != trace.layer_names:
        if len(schedule.layer_names) != trace.n:
            raise ScheduleMismatchError(
                f"schedule has {len(schedule.layer_names)} layers but the trace has {trace.n}; "
                "solve again for this trace"
            )
        for i, (a, b) in enumerate(zip(schedule.layer_names, trace.layer_names, strict=True)):
            if a != b:
                raise ScheduleMismatchError(
                    f"schedule layer_names[{i}] is {a!r} but the trace's layer {i} is {b!r}; solve again for this trace"
                )
    h = trace.content_hash()
    if schedule.trace_hash != h:
        raise ScheduleMismatchError(
            f"schedule trace_hash {schedule.trace_hash[:12]}... does not match the trace ({h[:12]}...): "
            "the schedule was made for a different trace; solve again for this trace"
        )
    validate_actions(schedule.actions, trace)


def validate_actions(actions: list[LayerAction], trace: Trace) -> None:
    """Structural checks of actions against the trace: indices, bytes, stages, segments, prefetch order."""
    n = trace.n
    last_prefetch: tuple[int, int] | None = None  # (layer index, prefetch stage) of the last offloaded layer
    for i, a in enumerate(actions):
        layer = trace.layers[i]
        where = f"actions[{i}] ({layer.name})"
        if a.offload is not None:
            o = a.offload
            tensors = layer.tensors
            if not o.tensors or len(set(o.tensors)) != len(o.tensors):
                raise ScheduleMismatchError(f"{where}.offload.tensors must list distinct tensor indices")
            bad = [t for t in o.tensors if not 0 <= t < len(tensors)]
            if bad:
                raise ScheduleMismatchError(
                    f"{where}.offload.tensors {bad} out of range: the layer has {len(tensors)} saved tensors"
                )
            if sum(tensors[t] for t in o.tensors) != o.bytes:
                raise ScheduleMismatchError(
                    f"{where}.offload.bytes is {o.bytes} but the listed tensors sum to "
                    f"{sum(tensors[t] for t in o.tensors)}"
                )
            for fld, v in (("done_by_layer", o.done_by_layer), ("prefetch_at_layer", o.prefetch_at_layer)):
                if not i <= v < n:
                    raise ScheduleMismatchError(f"{where}.offload.{fld} = {v} must be in [{i}, {n - 1}]")
            if last_prefetch is not None and o.prefetch_at_layer < last_prefetch[1]:
                # Backward runs from layer n-1 down to 0: a lower layer's prefetch may not be issued
                # before that of a higher one, so the single host->device stream serves them in need order.
                raise ScheduleMismatchError(
                    f"{where}.offload.prefetch_at_layer = {o.prefetch_at_layer} is issued earlier in backward "
                    f"than the prefetch of layer {last_prefetch[0]} ({last_prefetch[1]}); prefetches must be "
                    f"issued in the order backward needs them"
                )
            last_prefetch = (i, o.prefetch_at_layer)
        if a.recompute_group is not None:
            g = a.recompute_group
            if not 0 <= g <= i:
                raise ScheduleMismatchError(f"{where}.recompute_group = {g} must be in [0, {i}]")
            for j in range(g, i):
                aj = actions[j]
                if aj.action != Action.RECOMPUTE or (aj.recompute_group if aj.recompute_group is not None else j) != g:
                    raise ScheduleMismatchError(
                        f"{where}.recompute_group = {g} but layer {j} is not in that segment; "
                        "a segment is a contiguous run of recompute layers sharing one group index"
                    )
            if g < i and trace.layers[i - 1].code_after_saves:
                raise ScheduleMismatchError(
                    f"{where}.recompute_group = {g} runs the segment past layer {i - 1} "
                    f"({trace.layers[i - 1].name}), after which the model's code saves tensors for backward "
                    "(code_after_saves in the trace); the replay re-runs only traced layers, so a segment cannot "
                    "cross it: solve the schedule again from this trace"
                )


def json_schema(kind: Literal["trace", "schedule"]) -> dict[str, Any]:
    model: type[BaseModel] = Trace if kind == "trace" else Schedule
    return model.model_json_schema()
