"""Export a schedule to the formats users already have (`memsched export`, docs/exports.md): PyTorch checkpoint
wrappers, a selective-activation-checkpointing policy, torchtitan's `[activation_checkpoint]` section, and
Megatron / TransformerEngine's per-layer recompute and offload settings.

Every format here is coarser than a Schedule: none carries offload timing (done-by and prefetch stages) and
only Megatron carries offload at all; only Megatron's uniform method carries recompute segments of several
layers. What a format cannot carry is replaced by what its users' stack would do (`native_decisions`), and
that plan is priced by the simulator against the schedule's own prediction: the export says which layers
lose what and the predicted extra peak and step time, in a warning and in the document's `memsched.lost`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from memsched.errors import MemschedError
from memsched.optimizer.decisions import KEEP, Decision, decisions_from_schedule, offload_all, recompute, segment_ends
from memsched.optimizer.simulate import simulate
from memsched.schema import Action, Schedule, Trace, check_schedule
from memsched.units import format_bytes, format_seconds

FORMATS = ("checkpoint", "sac", "torchtitan", "megatron")
"""The export formats, in the order `memsched export --format` lists them."""


@dataclass
class Lost:
    """What an export drops from the schedule, and what that is predicted to cost."""

    offloaded_layers: list[str]
    """Layers the schedule offloads whose offload the format drops (kept) or re-times (Megatron)."""
    split_segments: list[tuple[str, str]]
    """Recompute segments of several layers (first, last) the format checkpoints one layer at a time."""
    what: list[str]
    """One sentence per thing lost."""
    predicted_peak_bytes: int
    """The simulator's peak for the plan the format really carries out."""
    predicted_step_s: float
    """The simulator's step time for that plan."""
    extra_peak_bytes: int
    """predicted_peak_bytes minus the schedule's predicted peak."""
    extra_step_s: float
    """predicted_step_s minus the schedule's predicted step time (negative: faster, as no copy stalls)."""
    within_budget: bool
    """Whether that plan still fits the schedule's budget."""

    def to_json(self) -> dict[str, Any]:
        return {
            "offloaded_layers": self.offloaded_layers,
            "split_segments": [list(s) for s in self.split_segments],
            "what": self.what,
            "predicted_peak_bytes": self.predicted_peak_bytes,
            "predicted_step_s": self.predicted_step_s,
            "extra_peak_bytes": self.extra_peak_bytes,
            "extra_step_s": self.extra_step_s,
            "within_budget": self.within_budget,
        }

    def warning(self, fmt: str, budget_bytes: int) -> str:
        """The one line the CLI prints."""
        fits = "within" if self.within_budget else "OVER"
        advice = "" if self.within_budget else "; to fit without what is lost, solve with --actions keep,recompute"
        return (
            f"--format {fmt} loses {'; '.join(self.what)}: predicted peak {format_bytes(self.predicted_peak_bytes)} "
            f"({self.extra_peak_bytes:+,} B, {fits} the {format_bytes(budget_bytes)} budget), step "
            f"{format_seconds(self.predicted_step_s)} ({self.extra_step_s * 1e3:+.3f} ms){advice}"
        )


@dataclass
class Export:
    """One schedule in one native format."""

    format: str
    """One of FORMATS."""
    document: dict[str, Any]
    """What is written, as data (JSON formats: exactly; torchtitan: the TOML's tables)."""
    text: str
    """The file's text."""
    lost: Lost | None
    """What the format drops; None when it carries the schedule whole."""
    warnings: list[str] = field(default_factory=list)
    """One line each, for the CLI (the loss, and notes on the format's own behaviour)."""


def native_decisions(schedule: Schedule, fmt: str, trace: Trace) -> list[Decision]:
    """The plan a format's users' stack carries out for `schedule` (module docstring): offload kept (or, for
    Megatron, TransformerEngine's timing: copy done by the next layer's forward, prefetched at the next
    layer's backward), multi-layer segments split into single layers unless Megatron's uniform method holds."""
    n = len(schedule.actions)
    own = decisions_from_schedule(schedule)
    uniform = fmt == "megatron" and _uniform_chunk(schedule) is not None
    out: list[Decision] = []
    for i, d in enumerate(own):
        if d.action == Action.OFFLOAD:
            if fmt == "megatron":
                nxt = min(i + 1, n - 1)
                out.append(offload_all(trace, i, nxt, nxt))
            else:
                out.append(KEEP)
        elif d.action == Action.RECOMPUTE:
            out.append(d if uniform else recompute())
        else:
            out.append(d)
    return out


def export_schedule(schedule: Schedule, fmt: str, trace: Trace | None = None, *, toml: bool = True) -> Export:
    """`schedule` in format `fmt` (FORMATS). `trace`, the one the schedule was solved from, is checked against
    it and prices what the format loses; an export that loses something needs it. `toml`: torchtitan's
    config as TOML (else JSON)."""
    if fmt not in FORMATS:
        raise MemschedError(f"--format {fmt!r} is not an export format; use one of {', '.join(FORMATS)}")
    if trace is not None:
        check_schedule(schedule, trace)
    lost = _lost(schedule, fmt, trace)
    head: dict[str, Any] = {
        "format": fmt,
        "trace_hash": schedule.trace_hash,
        "policy": schedule.policy,
        "budget_bytes": schedule.budget_bytes,
        "predicted_peak_bytes": schedule.prediction.peak_bytes,
        "predicted_step_s": schedule.prediction.step_s,
        "exact": lost is None,
        "lost": None if lost is None else lost.to_json(),
    }
    warnings = [] if lost is None else [lost.warning(fmt, schedule.budget_bytes)]
    builder = {"checkpoint": _checkpoint, "sac": _sac, "torchtitan": _torchtitan, "megatron": _megatron}[fmt]
    document, notes = builder(schedule)
    document["memsched"] = head
    warnings += notes
    text = _toml(document) if fmt == "torchtitan" and toml else json.dumps(document, indent=2) + "\n"
    return Export(fmt, document, text, lost, warnings)


# -- what is lost ---------------------------------------------------------------------------------------------


def _lost(schedule: Schedule, fmt: str, trace: Trace | None) -> Lost | None:
    names = schedule.layer_names
    offloaded = [a.layer for a in schedule.actions if a.action == Action.OFFLOAD]
    own = decisions_from_schedule(schedule)
    keep_segments = fmt == "megatron" and _uniform_chunk(schedule) is not None
    split = [] if keep_segments else [(names[s], names[e]) for s, e in sorted(segment_ends(own).items()) if s != e]
    what = []
    if offloaded:
        if fmt == "megatron":
            what.append(
                f"the offload timing of {', '.join(offloaded)} (TransformerEngine copies out during the next "
                "layer's forward and prefetches at the next layer's backward)"
            )
            if not _first_layers(schedule, Action.OFFLOAD, trace) or len(offloaded) >= len(names):
                what.append("the offloaded set (TransformerEngine offloads whole layers, the first N < all)")
        else:
            what.append(f"the offload of {', '.join(offloaded)} (kept: {fmt} has no offload)")
    if split:
        what.append(
            "multi-layer recompute segments "
            + ", ".join(f"{a}..{b}" for a, b in split)
            + " (each layer checkpointed on its own: the inner layers' inputs are held)"
        )
    if not what:
        return None
    if trace is None:
        raise MemschedError(
            f"--format {fmt} cannot carry this schedule whole ({'; '.join(what)}); give --trace TRACE (the trace "
            "it was solved from) so the export can predict what that costs"
        )
    sim = simulate(trace, native_decisions(schedule, fmt, trace), schedule.budget_bytes)
    return Lost(
        offloaded_layers=offloaded,
        split_segments=split,
        what=what,
        predicted_peak_bytes=sim.peak_bytes,
        predicted_step_s=sim.step_s,
        extra_peak_bytes=sim.peak_bytes - schedule.prediction.peak_bytes,
        extra_step_s=sim.step_s - schedule.prediction.step_s,
        within_budget=sim.peak_bytes <= schedule.budget_bytes,
    )


def _recomputed(schedule: Schedule) -> list[int]:
    return [i for i, a in enumerate(schedule.actions) if a.action == Action.RECOMPUTE]


def _uniform_chunk(schedule: Schedule) -> int | None:
    """Megatron's uniform method: every layer recomputed, in segments of c layers from layer 0 (the last may be
    shorter). Returns c, or None when the schedule is not of that shape."""
    n = len(schedule.actions)
    if len(_recomputed(schedule)) != n:
        return None
    ends = sorted(segment_ends(decisions_from_schedule(schedule)).items())
    c = ends[0][1] - ends[0][0] + 1
    expected = [(s, min(s + c, n) - 1) for s in range(0, n, c)]
    return c if ends == expected else None


def _first_layers(schedule: Schedule, action: Action, trace: Trace | None) -> bool:
    """Whether the layers with `action` are exactly the first k (and, for offload, each offloaded whole)."""
    idx = [i for i, a in enumerate(schedule.actions) if a.action == action]
    if idx != list(range(len(idx))):
        return False
    if action == Action.OFFLOAD and trace is not None:
        for i in idx:
            o = schedule.actions[i].offload
            assert o is not None  # the schema guarantees it
            if len(o.tensors) != len(trace.layers[i].tensors):
                return False
    return True


# -- the formats ----------------------------------------------------------------------------------------------


def _checkpoint(schedule: Schedule) -> tuple[dict[str, Any], list[str]]:
    layers = [schedule.layer_names[i] for i in _recomputed(schedule)]
    doc = {
        "torch.utils.checkpoint": {"use_reentrant": False, "checkpoint_modules": layers},
        "apply": "memsched.runtime.export.apply_checkpoint_wrappers(model, schedule)",
    }
    return doc, []


def _sac(schedule: Schedule) -> tuple[dict[str, Any], list[str]]:
    policy = {a.layer: "PREFER_RECOMPUTE" if a.action == Action.RECOMPUTE else "MUST_SAVE" for a in schedule.actions}
    doc = {
        "torch.utils.checkpoint.create_selective_checkpoint_contexts": {
            "use_reentrant": False,
            "policy": policy,
            "checkpoint_modules": [schedule.layer_names[i] for i in _recomputed(schedule)],
        },
        "apply": "memsched.runtime.export.apply_selective_checkpointing(model, schedule)",
    }
    return doc, []


def _torchtitan(schedule: Schedule) -> tuple[dict[str, Any], list[str]]:
    """torchtitan's `[activation_checkpoint]`: mode 'full' checkpoints every block, 'selective' with an integer
    `selective_ac_option` N checkpoints block k when (k + 1) % N == 0, 'none' nothing. A set of no such shape
    is written as the per-block list `memsched_blocks` (not a torchtitan key)."""
    n = len(schedule.actions)
    rec = _recomputed(schedule)
    section: dict[str, Any] = {}
    notes = []
    if not rec:
        section["mode"] = "none"
    elif len(rec) == n:
        section["mode"] = "full"
    else:
        section["mode"] = "selective"
        every = [m for m in range(2, n + 1) if rec == [k for k in range(n) if (k + 1) % m == 0]]
        if every:
            section["selective_ac_option"] = str(every[0])
        else:
            notes.append(
                "torchtitan: no selective_ac_option checkpoints exactly blocks "
                f"{rec}; the per-block list memsched_blocks says which (wrap those blocks in your apply_ac)"
            )
    section["memsched_blocks"] = rec
    if rec:
        notes.append("torchtitan's wrapper passes preserve_rng_state=False: a model with dropout needs it True")
    return {"activation_checkpoint": section, "memsched_layer_names": list(schedule.layer_names)}, notes


def _megatron(schedule: Schedule) -> tuple[dict[str, Any], list[str]]:
    """Megatron-Core TransformerConfig fields: recompute_granularity 'full' with recompute_method 'uniform'
    (every layer, in chunks of recompute_num_layers, each chunk one checkpoint) or 'block' (the first
    recompute_num_layers layers, each its own checkpoint); cpu_offloading_num_layers N offloads the first N
    layers' activations (TransformerEngine's get_cpu_offload_context). Other sets go in the per-layer lists."""
    n = len(schedule.actions)
    rec = _recomputed(schedule)
    off = [i for i, a in enumerate(schedule.actions) if a.action == Action.OFFLOAD]
    notes = []
    doc: dict[str, Any] = {
        "recompute_granularity": None,
        "recompute_method": None,
        "recompute_num_layers": None,
        "recompute_layers": rec,
        "cpu_offloading": bool(off),
        "cpu_offloading_num_layers": len(off),
        "cpu_offloading_activations": bool(off),
        "cpu_offloading_weights": False,
        "offload_layers": off,
    }
    chunk = _uniform_chunk(schedule)
    singles = all(s == e for s, e in segment_ends(decisions_from_schedule(schedule)).items())
    if chunk is not None:
        doc.update(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=chunk)
    elif rec and singles and _first_layers(schedule, Action.RECOMPUTE, None):
        doc.update(recompute_granularity="full", recompute_method="block", recompute_num_layers=len(rec))
    elif rec:
        doc["recompute_granularity"] = "full"
        notes.append(
            f"megatron: no recompute_method recomputes exactly layers {rec}; recompute_layers lists them "
            "(checkpoint those layers in your TransformerBlock)"
        )
    if off and (off != list(range(len(off))) or len(off) >= n):
        notes.append(
            f"megatron: cpu_offloading_num_layers offloads the first N layers (at most {n - 1}); offload_layers "
            f"lists the schedule's {off}"
        )
    return doc, notes


def _toml(document: dict[str, Any]) -> str:
    """The torchtitan document as TOML: one table per top-level dict, values of the simple kinds it holds."""
    lines = [f"# memsched export (docs/exports.md): {document['memsched']['format']}"]
    scalars = {k: v for k, v in document.items() if not isinstance(v, dict)}
    for k, v in scalars.items():
        lines.append(f"{k} = {_toml_value(v)}")
    for table, values in document.items():
        if isinstance(values, dict):
            lines.append(f"\n[{table}]")
            for k, v in values.items():
                if isinstance(v, dict):
                    lines.append(f"{k} = {json.dumps(json.dumps(v))}")  # a nested record, as a JSON string
                elif v is not None:
                    lines.append(f"{k} = {_toml_value(v)}")
    return "\n".join(lines) + "\n"


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise AssertionError(f"no TOML form for {type(v).__name__}")
