"""`memsched measure`: replay a schedule on the workload it was made for and compare with the prediction.

The runtime (memsched.runtime) measures the whole step: every live tensor byte (CUDA's allocator, or the CPU
allocator's events: `peak_source`) and the median step time with the torch thread count fixed. The
prediction comes from the schedule and, for keep-all and the ledger's counterpart, from the simulator
(memsched.optimizer.saved_profile). That is why this lives in memsched/ and not in runtime/: the runtime never
imports the optimizer.

One process measures the in-core keep-all step and the scheduled step on the same model at the same batch,
their steps interleaved (memsched.runtime.measure.measure_side_by_side), so the slowdown is a ratio measured
side by side (docs/cost-model.md, 'Measurement').
"""

from __future__ import annotations

import contextlib
import logging
import platform
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from memsched.errors import MemschedError, ScheduleMismatchError
from memsched.schema import Schedule, Trace, TracedWorkload

if TYPE_CHECKING:  # torch stays out of `memsched --help`
    from memsched.runtime import Measurement, Workload
    from memsched.runtime.measure import SideBySide

log = logging.getLogger(__name__)

PEAK_TARGET = 0.05
"""Measured whole-step peak within 5% of the predicted peak."""
STAGE_NOTE = 0.05
"""A stage whose measured peak departs from its prediction by more than this fraction of the predicted peak
gets a note under the table."""
STEP_TARGET = 0.10
"""Measured step time within 10% of the predicted step time."""


@dataclass
class WorkloadArgs:
    """How to build the workload: the same flags as `memsched trace`, so a trace and its replay match."""

    model: str
    """A built-in model name or package.module:factory."""
    batch_size: int | None = None
    """None: the built-in's default (2) or the factory's own; likewise every field below that may be None, so a
    factory is never handed a flag the user did not give (docs/factory.md)."""
    seq_len: int | None = None
    num_layers: int | None = None
    small: bool | None = None
    device: str | None = None
    dtype: str | None = None
    dropout: float | None = None
    optimizer: str | None = None
    layer_pattern: list[str] | None = None
    compile: bool | None = None
    """Each block compiled on its own (--compile; None: not asked for)."""
    autocast: str | None = None
    """The forward under autocast, bf16 | fp16 (--autocast)."""


_FROM_TRACE = {"batch_size": "--batch-size", "seq_len": "--seq-len", "dtype": "--dtype"}
"""Workload flags a trace records, by WorkloadArgs field."""


@dataclass(frozen=True)
class Overrides:
    """Flags that overrode what the trace records (`workload_args`)."""

    fields: frozenset[str] = frozenset()
    """The WorkloadArgs fields they set: not held against the trace."""
    notes: tuple[str, ...] = ()
    """One line per override, for the report."""


def workload_args(trace: Trace | None, schedule: Schedule | None, **given: Any) -> tuple[WorkloadArgs, Overrides]:
    """The workload to measure: what the trace records (batch size, sequence length, dtype; the layers by their
    exact names, from the schedule or the trace) unless a flag was given (`given`, None where absent), which
    wins with a note. Without a trace, the flags or WorkloadArgs' defaults. Returns the args and the overrides."""
    fields = {k: v for k, v in given.items() if v is not None}
    notes: list[str] = []
    overridden: set[str] = set()
    # Without the trace, the schedule's record of it (Schedule.traced), where the schedule has one.
    source = trace if trace is not None else schedule.traced if schedule is not None else None
    if source is not None:
        for name, flag in _FROM_TRACE.items():
            recorded = getattr(source, name)
            if recorded is None:
                continue
            if name not in fields:
                fields[name] = recorded
            elif fields[name] != recorded:
                overridden.add(name)
                notes.append(
                    f"{flag} {fields[name]} overrides the trace's {recorded}: the trace's predictions are for "
                    f"{recorded}, so compare with care (or re-trace at {fields[name]})"
                )
    names = list(schedule.layer_names) if schedule is not None else [x.name for x in trace.layers] if trace else []
    if "layer_pattern" not in fields and names:
        # The exact layers the plan was made for, whatever pattern selected them when tracing.
        fields["layer_pattern"] = [re.escape(n) for n in names]
    return WorkloadArgs(**fields), Overrides(frozenset(overridden), tuple(notes))


@dataclass
class StageDeparture:
    """Where a replayed step departs most from the plan: one stage's measured whole-step peak against the
    simulator's prediction for it (static + the stage's bytes: the terms whose maximum is the predicted peak)."""

    stage: str
    """'F3' (layer 3's forward) or 'B3' (its backward)."""
    layer: str
    """The traced layer the stage belongs to."""
    predicted_bytes: int
    measured_bytes: int
    predicted_peak_bytes: int
    """The predicted whole-step peak (the maximum over stages), the scale of `departure`."""

    @property
    def difference_bytes(self) -> int:
        """Measured minus predicted: positive where the step holds more than the plan says."""
        return self.measured_bytes - self.predicted_bytes

    @property
    def departure(self) -> float:
        """The difference as a fraction of the predicted peak."""
        return self.difference_bytes / self.predicted_peak_bytes if self.predicted_peak_bytes else 0.0

    @property
    def notable(self) -> bool:
        """Departs by more than STAGE_NOTE of the predicted peak."""
        return abs(self.departure) > STAGE_NOTE

    def to_json(self) -> dict[str, Any]:
        return {
            "stage": self.stage,
            "layer": self.layer,
            "predicted_bytes": self.predicted_bytes,
            "measured_bytes": self.measured_bytes,
            "difference_bytes": self.difference_bytes,
            "fraction_of_predicted_peak": self.departure,
            "notable": self.notable,
        }


def stage_name(n: int, t: int) -> tuple[str, int]:
    """Global stage t of an n-layer step (the simulator's order: F_0..F_{n-1}, then B_{n-1}..B_0) as the
    runtime's stage name ('F3', 'B3') and the layer index it belongs to."""
    return (f"F{t}", t) if t < n else (f"B{2 * n - 1 - t}", 2 * n - 1 - t)


def predicted_stage_peaks(static_bytes: int, stage_bytes: Sequence[int]) -> dict[str, int]:
    """The simulator's whole-step bytes per stage, by the runtime's stage names: static + the stage's bytes, the
    terms whose maximum is the predicted peak (SimResult.peak_bytes)."""
    n = len(stage_bytes) // 2
    return {stage_name(n, t)[0]: static_bytes + b for t, b in enumerate(stage_bytes)}


def measured_stage_peaks(stage_peak_bytes: dict[str, int]) -> dict[str, int]:
    """The measured whole-step peak per stage, on the simulator's stages: the part of the step before the first
    layer ('pre': zero_grad, embeddings) is F_0's, the optimizer step is B_0's, as the tracer attributes them
    when it fits the layers' workspace (runtime/tracer.py, fit_workspace)."""
    out = {k: v for k, v in stage_peak_bytes.items() if k[:1] in "FB" and k[1:].isdigit()}
    for extra, stage in (("pre", "F0"), ("optimizer", "B0")):
        if extra in stage_peak_bytes and stage in out:
            out[stage] = max(out[stage], stage_peak_bytes[extra])
    return out


def worst_stage(
    predicted: dict[str, int], measured: dict[str, int], layer_names: Sequence[str]
) -> StageDeparture | None:
    """The stage where the measured whole-step peak departs most from the prediction: the largest excess over
    the plan (the direction that breaks a budget); when no stage holds more than predicted, the largest shortfall.
    Both in bytes per stage (`predicted_stage_peaks`, `measured_stage_peaks`); ties go to the earlier stage.
    None when no stage is on both sides."""
    n = len(layer_names)
    order = [stage_name(n, t) for t in range(2 * n)]
    common = [(name, i) for name, i in order if name in predicted and name in measured]
    if not common or not predicted:
        return None

    def diff(item: tuple[str, int]) -> int:
        return measured[item[0]] - predicted[item[0]]

    over = [c for c in common if diff(c) > 0]
    name, i = max(over, key=diff) if over else min(common, key=diff)  # max/min keep the first of equals
    return StageDeparture(
        stage=name,
        layer=layer_names[i],
        predicted_bytes=predicted[name],
        measured_bytes=measured[name],
        predicted_peak_bytes=max(predicted.values()),
    )


@dataclass
class Side:
    """One measured configuration (keep-all or the schedule): predicted against measured."""

    predicted_peak_bytes: int | None
    measured_peak_bytes: int
    predicted_step_s: float | None
    measured_step_s: float
    measured_step_times_s: list[float] = field(default_factory=list)
    """Every timed step, in order (interleaved with the other side's; `measured_step_s` is their median)."""
    saved_peak_bytes: int | None = None
    """The ledger's peak of live saved bytes of the traced layers (attribution; not the peak)."""
    predicted_saved_peak_bytes: int | None = None
    """The simulator's counterpart of the ledger (memsched.optimizer.saved_profile), when a trace is given."""
    host_bytes: int = 0
    """Host copies made by offloading (not device bytes; not in the peak)."""
    predicted_host_peak_bytes: int | None = None
    """The schedule's predicted host peak (Prediction.host_peak_bytes), where it records one."""
    stage_peak_bytes: dict[str, int] = field(default_factory=dict)
    """The whole-step peak per stage, of the run with the highest peak."""
    predicted_stage_peak_bytes: dict[str, int] = field(default_factory=dict)
    """The simulator's whole-step bytes per stage ('F3', 'B3'), when a trace is given."""
    worst_stage: StageDeparture | None = None
    """The stage that departs most from the plan (`worst_stage`), when a trace is given."""

    def ratios(self) -> dict[str, float | None]:
        def r(m: float, p: float | None) -> float | None:
            return None if not p else m / p

        return {
            "peak": r(self.measured_peak_bytes, self.predicted_peak_bytes),
            "step": r(self.measured_step_s, self.predicted_step_s),
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "predicted_peak_bytes": self.predicted_peak_bytes,
            "measured_peak_bytes": self.measured_peak_bytes,
            "predicted_step_s": self.predicted_step_s,
            "measured_step_s": self.measured_step_s,
            "measured_step_times_s": self.measured_step_times_s,
            "saved_peak_bytes": self.saved_peak_bytes,
            "predicted_saved_peak_bytes": self.predicted_saved_peak_bytes,
            "host_bytes": self.host_bytes,
            "predicted_host_peak_bytes": self.predicted_host_peak_bytes,
            "stage_peak_bytes": self.stage_peak_bytes,
            "predicted_stage_peak_bytes": self.predicted_stage_peak_bytes,
            "worst_stage": None if self.worst_stage is None else self.worst_stage.to_json(),
            "ratio_measured_over_predicted": self.ratios(),
        }


@dataclass
class MeasureReport:
    """What `memsched measure` prints (--json) and writes (-o)."""

    model: str
    batch_size: int
    seq_len: int | None
    dtype: str
    device: str
    device_name: str
    peak_source: str
    """'cuda-allocator' (max_memory_allocated) or 'cpu-all-tensors' (the CPU allocator's events)."""
    threads: int
    """torch's intra-op thread count during the measurement."""
    clock: str
    """What the step times are: 'wall time' or 'process CPU time' (one CPU thread; memsched.runtime.clock)."""
    policy: str
    """The schedule's policy, or 'keep-all'."""
    actions: dict[str, int]
    budget_bytes: int | None
    static_bytes: int | None
    scheduled: Side | None
    keep_all: Side | None
    versions: dict[str, str]
    command: str = ""
    predicted_overhead_pct: float | None = None
    """The schedule's predicted overhead over keep-all (the simulator's)."""
    paired_ratio: float | None = None
    """Median over rounds of scheduled step / the keep-all step beside it (drift cancels within a pair)."""
    step_order: list[str] = field(default_factory=list)
    """Which side each timed step measured, in the order they ran (interleaved)."""
    prediction_note: str | None = None
    notes: list[str] = field(default_factory=list)
    """What the run took from the trace against a flag (a flag that overrides the trace's batch, say)."""
    """Set when the schedule's stored prediction differs from its simulation against the trace (which is
    what the measurement is compared with)."""

    def derived(self) -> dict[str, Any]:
        """Slowdown, fits-budget, oversubscription and the target checks."""
        d: dict[str, Any] = {}
        s, k, b = self.scheduled, self.keep_all, self.budget_bytes
        if s is not None and k is not None:
            d["slowdown_pct"] = 100.0 * (s.measured_step_s / k.measured_step_s - 1.0)
            d["measured_step_ratio"] = s.measured_step_s / k.measured_step_s
            d["measured_step_ratio_paired"] = self.paired_ratio
            if s.predicted_step_s and k.predicted_step_s:
                d["predicted_step_ratio"] = s.predicted_step_s / k.predicted_step_s
            if s.predicted_step_s and k.predicted_step_s:
                d["predicted_slowdown_pct"] = 100.0 * (s.predicted_step_s / k.predicted_step_s - 1.0)
        if s is not None and b is not None:
            d["fits_budget"] = s.measured_peak_bytes <= b
            d["budget_headroom_bytes"] = b - s.measured_peak_bytes
            if self.device == "cpu" and s.host_bytes:
                # On the CPU the host copies live in the same memory as the step's tensors: the offload is an
                # emulation of the GPU path, and the process holds both.
                d["offload_emulated"] = True
                d["process_peak_bytes_with_host_copies"] = s.measured_peak_bytes + s.host_bytes
            ratios = s.ratios()
            d["peak_within_target"] = None if ratios["peak"] is None else abs(ratios["peak"] - 1) <= PEAK_TARGET
            d["step_within_target"] = None if ratios["step"] is None else abs(ratios["step"] - 1) <= STEP_TARGET
        if k is not None and b:
            # Whole-device oversubscription: what keep-all needs over what the schedule was allowed.
            d["oversubscription"] = k.measured_peak_bytes / b
            if self.static_bytes is not None and b > self.static_bytes:
                # Activation oversubscription: keep-all's activations over the room the budget leaves them
                # (2x at a 50% budget, 4x at 25%, by the budget's definition; measured here).
                d["activation_oversubscription"] = (k.measured_peak_bytes - self.static_bytes) / (b - self.static_bytes)
        return d

    def headline(self) -> dict[str, Any]:
        """The rows every report leads with: the scheduled step (keep-all when there is no schedule)."""
        side = self.scheduled or self.keep_all
        assert side is not None, "a report measures at least one side"
        s, k = self.scheduled, self.keep_all
        measured_overhead = None if s is None or k is None else 100.0 * (s.measured_step_s / k.measured_step_s - 1)
        return {
            "predicted_peak_bytes": side.predicted_peak_bytes,
            "measured_peak_bytes": side.measured_peak_bytes,
            "peak_source": self.peak_source,
            "budget_bytes": self.budget_bytes,
            "predicted_step_s": side.predicted_step_s,
            "measured_step_s": side.measured_step_s,
            "predicted_overhead_pct": self.predicted_overhead_pct if s is not None else None,
            "measured_overhead_pct": measured_overhead,
            "worst_stage": None if side.worst_stage is None else side.worst_stage.to_json(),
            "threads": self.threads,
            "step_clock": self.clock,
        }

    def to_json(self) -> dict[str, Any]:
        return {
            **self.headline(),
            "model": self.model,
            "batch_size": self.batch_size,
            "seq_len": self.seq_len,
            "dtype": self.dtype,
            "device": self.device,
            "device_name": self.device_name,
            "policy": self.policy,
            "actions": self.actions,
            "static_bytes": self.static_bytes,
            "scheduled": None if self.scheduled is None else self.scheduled.to_json(),
            "keep_all": None if self.keep_all is None else self.keep_all.to_json(),
            **self.derived(),
            "targets": {"peak_within": PEAK_TARGET, "step_within": STEP_TARGET},
            "step_order": self.step_order,
            "prediction_note": self.prediction_note,
            "notes": self.notes,
            "versions": self.versions,
            "command": self.command,
        }


def check_trace_matches(
    trace: Trace | TracedWorkload,
    w: Workload,
    dtype: str,
    device_type: str | None,
    overridden: frozenset[str] = frozenset(),
) -> None:
    """The trace (or a schedule's record of it, Schedule.traced) must describe the workload being built: same
    model id, batch, sequence, dtype, device kind (except what a flag deliberately `overridden`, which the caller
    has noted). `device_type` None: not checked (a schedule's record has no device)."""
    whose = "--trace: the trace's" if isinstance(trace, Trace) else "the schedule's trace's"
    mine = {"model": w.model_id, "batch_size": w.batch_size, "seq_len": w.seq_len, "dtype": dtype}
    theirs = {"model": trace.model, "batch_size": trace.batch_size, "seq_len": trace.seq_len, "dtype": trace.dtype}
    for key, value in mine.items():
        if theirs[key] != value and key not in overridden:
            raise ScheduleMismatchError(
                f"{whose} {key} is {theirs[key]!r} but this run builds {value!r}: its predictions are for the "
                "other; pass the flags the trace was recorded with (--batch-size, --seq-len, --layers, --small, "
                "--dtype, --compile, --autocast)"
            )
    if not isinstance(trace, Trace) or device_type is None:
        return
    traced_on_cpu = trace.device.name.lower().startswith("cpu")
    if traced_on_cpu != (device_type == "cpu"):
        raise ScheduleMismatchError(
            f"--trace was recorded on {trace.device.name!r} but this run measures on {device_type}: its times and "
            "bytes do not predict this device; trace on the device you measure on"
        )


def check_schedule_matches(schedule: Schedule, names: Sequence[str]) -> None:
    """The schedule's layers must be the model's traced layers, in order."""
    if list(schedule.layer_names) == list(names):
        return
    if len(schedule.layer_names) != len(names):
        raise ScheduleMismatchError(
            f"the schedule has {len(schedule.layer_names)} layers but this model has {len(names)} "
            f"({names[0] if names else '-'} ...); build the model the schedule was solved for (--layers, --small)"
        )
    i, (a, b) = next((i, ab) for i, ab in enumerate(zip(schedule.layer_names, names, strict=True)) if ab[0] != ab[1])
    raise ScheduleMismatchError(
        f"schedule layer_names[{i}] is {a!r} but the model's layer {i} is {b!r}; "
        "build the model the schedule was solved for (or pass the same --layer-pattern)"
    )


def _counts(schedule: Schedule | None) -> dict[str, int]:
    return {} if schedule is None else schedule.action_counts()


@dataclass
class Predictions:
    """What the simulator says about the two sides, where a trace (and a schedule) are given."""

    keep_peak: int | None = None
    keep_step: float | None = None
    keep_saved: int | None = None
    sched_peak: int | None = None
    sched_step: float | None = None
    sched_saved: int | None = None
    overhead_pct: float | None = None
    keep_stages: dict[str, int] = field(default_factory=dict)
    """The simulator's whole-step bytes per stage of keep-all (`predicted_stage_peaks`)."""
    sched_stages: dict[str, int] = field(default_factory=dict)
    """The same for the schedule, simulated against the trace."""
    layer_names: list[str] = field(default_factory=list)
    """The trace's layers, in forward order."""
    note: str | None = None
    """Set when the schedule file's stored prediction differs from the simulation of its actions against
    the trace (the schedule was edited, or solved by an earlier cost model): says both."""


def predictions(trace: Trace | None, schedule: Schedule | None) -> Predictions:
    """Keep-all from the simulator; the schedule simulated against the trace when one is given (else the
    prediction stored in the schedule file: nothing else can price it); the ledger's counterparts."""
    from memsched.optimizer.baselines import keep_all
    from memsched.optimizer.saved_profile import predicted_saved_profile, saved_profile
    from memsched.optimizer.simulate import simulate
    from memsched.units import format_bytes, format_seconds

    p = Predictions()
    if schedule is not None:
        p.sched_peak, p.sched_step = schedule.prediction.peak_bytes, schedule.prediction.step_s
        p.overhead_pct = schedule.prediction.overhead_pct
    if trace is None:
        return p
    sim = simulate(trace, keep_all(trace), with_events=False)
    p.keep_peak, p.keep_step = sim.peak_bytes, sim.step_s
    p.keep_saved = max(saved_profile(trace, sim.decisions))
    p.keep_stages = predicted_stage_peaks(sim.static_bytes, sim.stage_bytes)
    p.layer_names = [x.name for x in trace.layers]
    if schedule is not None:
        mine = simulate(trace, schedule, with_events=False)
        stored = schedule.prediction
        if mine.peak_bytes != stored.peak_bytes or abs(mine.step_s - stored.step_s) > 1e-9 * max(1.0, mine.step_s):
            p.note = (
                f"the schedule file's stored prediction (peak {format_bytes(stored.peak_bytes)}, step "
                f"{format_seconds(stored.step_s)}) differs from its actions simulated against this trace (peak "
                f"{format_bytes(mine.peak_bytes)}, step {format_seconds(mine.step_s)}): compared with the simulation"
            )
            log.warning("%s", p.note)
        p.sched_peak, p.sched_step, p.overhead_pct = mine.peak_bytes, mine.step_s, mine.overhead_pct
        p.sched_saved = max(predicted_saved_profile(trace, schedule))
        p.sched_stages = predicted_stage_peaks(mine.static_bytes, mine.stage_bytes)
    return p


def trace_threads(trace: Trace | None) -> int | None:
    """The torch thread count a CPU trace names in its device (`cpu (..., N torch threads)`), if any."""
    if trace is None:
        return None
    m = re.search(r"(\d+) torch threads?\b", trace.device.name)
    return int(m.group(1)) if m else None


@contextlib.contextmanager
def fixed_threads(n: int | None) -> Iterator[int]:
    """torch's intra-op thread count set to n (kept when None) for the block, restored after; yields it."""
    import torch

    previous = torch.get_num_threads()
    if n is not None:
        if n < 1:
            raise MemschedError(f"--threads must be >= 1, got {n}")
        torch.set_num_threads(n)
    try:
        yield torch.get_num_threads()
    finally:
        torch.set_num_threads(previous)


def _build(args: WorkloadArgs) -> tuple[Workload, str, Any]:
    """The workload, its dtype name and its device."""
    from memsched.runtime import workload
    from memsched.runtime.models import parse_dtype

    dtype = str(parse_dtype(args.dtype)).removeprefix("torch.") if args.dtype is not None else None
    dev = _device(args.device) if args.device is not None else None
    w = workload(
        args.model,
        batch_size=args.batch_size,
        seq_len=args.seq_len,
        num_layers=args.num_layers,
        small=args.small or None,
        device=dev,
        dropout=args.dropout,
        optimizer=args.optimizer,
        dtype=dtype,
        compile=args.compile,
        autocast=args.autocast,
    )
    first = next(w.model.parameters(), None)
    if dtype is None:  # the model's own: what its parameters are
        dtype = str(first.dtype).removeprefix("torch.") if first is not None else "float32"
    if dev is None:  # the model's own device (a built-in's is the CPU)
        dev = first.device if first is not None else _device("cpu")
    return w, dtype, dev


def _check_inputs(
    args: WorkloadArgs,
    w: Workload,
    dtype: str,
    dev: Any,
    schedule: Schedule | None,
    trace: Trace | None,
    overridden: frozenset[str] = frozenset(),
) -> None:
    """The trace and the schedule must describe the workload being built."""
    from memsched.runtime import find_layers

    if trace is not None:
        check_trace_matches(trace, w, dtype, dev.type, overridden)
    if schedule is not None:
        check_schedule_matches(schedule, [n for n, _ in find_layers(w.model, args.layer_pattern)])
        if trace is None and schedule.traced is not None:  # the layers match: the batch, sequence and dtype?
            check_trace_matches(schedule.traced, w, dtype, None, overridden)
        if trace is not None:
            from memsched.schema import check_schedule

            check_schedule(schedule, trace)


def _measure(
    w: Workload,
    args: WorkloadArgs,
    schedule: Schedule | None,
    trace: Trace | None,
    pred: Predictions,
    *,
    steps: int,
    warmup: int,
    baseline: bool,
    keep_all_memory: bool,
) -> SideBySide:
    """Keep-all and the schedule, their steps interleaved in one process (memsched.runtime.measure)."""
    from memsched.runtime.measure import measure_side_by_side
    from memsched.runtime.tracer import out_of_memory

    dev = next(w.model.parameters()).device
    try:
        return measure_side_by_side(
            w.model,
            w.step,
            schedule,
            baseline=baseline,
            trace=trace,
            layers=args.layer_pattern,
            optimizer=w.optimizer,
            steps=steps,
            warmup=warmup,
            predicted_saved_peak_bytes=pred.sched_saved,
            keep_all_predicted_saved_peak_bytes=pred.keep_saved,
            keep_all_memory=keep_all_memory,
        )
    except (RuntimeError, MemoryError) as e:
        if not out_of_memory(e):
            raise
        first = str(e).strip().splitlines()[0] if str(e).strip() else "out of memory"
        where = "CUDA" if dev.type == "cuda" else "host"
        raise MemschedError(
            f"{where} out of memory at batch {args.batch_size} ({first[:160]}); lower --batch-size or --seq-len"
        ) from None
    finally:
        _release(dev)


def _side(
    m: Measurement | None,
    peak: int | None,
    step: float | None,
    saved: int | None,
    stages: dict[str, int] | None = None,
    layer_names: Sequence[str] = (),
) -> Side | None:
    """One side's figures: the median of its interleaved steps, its memory step's peak, and where its stages
    depart most from the simulator's (`stages`, empty without a trace). A side whose memory step was skipped
    (keep_all_memory False: no stage was measured) has no departure."""
    if m is None:
        return None
    worst = worst_stage(stages, measured_stage_peaks(m.stage_peak_bytes), layer_names) if stages else None
    return Side(
        predicted_peak_bytes=peak,
        measured_peak_bytes=m.peak_bytes,
        predicted_step_s=step,
        measured_step_s=m.step_s,
        measured_step_times_s=list(m.step_times_s),
        saved_peak_bytes=m.saved_peak_bytes,
        predicted_saved_peak_bytes=saved,
        host_bytes=m.host_bytes,
        stage_peak_bytes=m.stage_peak_bytes,
        predicted_stage_peak_bytes=dict(stages or {}),
        worst_stage=worst,
    )


def _with_host_prediction(side: Side | None, schedule: Schedule | None) -> Side | None:
    """The scheduled side with its schedule's predicted host peak."""
    if side is not None and schedule is not None:
        side.predicted_host_peak_bytes = schedule.prediction.host_peak_bytes
    return side


def run_measure(
    args: WorkloadArgs,
    schedule: Schedule | None,
    trace: Trace | None = None,
    *,
    steps: int = 5,
    warmup: int = 2,
    baseline: bool = True,
    threads: int | None = None,
    command: str = "",
    keep_all_memory: bool = True,
    overrides: Overrides | None = None,
) -> MeasureReport:
    """Build the workload, check the schedule (and trace) against it, and measure keep-all and the schedule.

    schedule None measures keep-all only (the in-core baseline). baseline False skips keep-all when a schedule
    is given. Both sides' steps alternate in one process (`warmup` rounds, then `steps` rounds of one keep-all
    and one scheduled step); each side's step time is the median of its `steps` steps
    (memsched.runtime.measure.measure_side_by_side, the one function `memsched measure`, the demo and
    bench/fidelity.py share). threads: torch's CPU thread count for the run; None takes the trace's (its
    device names it), else keeps torch's current one. keep_all_memory False skips keep-all's memory step
    (its measured peak is then 0: for a caller that measured it already). overrides: workload_args' (flags that
    override the trace): what they set is not held against the trace, and their notes are reported.
    """
    from memsched.runtime.device import device_name, framework_versions

    if steps < 1 or warmup < 0:
        raise MemschedError(f"--steps must be >= 1 and --warmup >= 0 (got {steps}, {warmup})")
    if schedule is None and not baseline:
        raise MemschedError("nothing to measure: give a SCHEDULE, or drop --no-baseline to measure keep-all")
    with fixed_threads(threads if threads is not None else trace_threads(trace)) as n_threads:
        w, dtype, dev = _build(args)
        overrides = overrides or Overrides()
        _check_inputs(args, w, dtype, dev, schedule, trace, overrides.fields)
        pred = predictions(trace, schedule)
        got = _measure(
            w,
            args,
            schedule,
            trace,
            pred,
            steps=steps,
            warmup=warmup,
            baseline=baseline,
            keep_all_memory=keep_all_memory,
        )
        name = device_name(dev)
    from memsched.runtime.memory import peak_source

    first = got.keep_all or got.scheduled
    assert first is not None, "measure_side_by_side measures at least one side"
    return MeasureReport(
        model=w.model_id,
        batch_size=w.batch_size,
        seq_len=w.seq_len,
        dtype=dtype,
        device=dev.type,
        device_name=name,
        peak_source=peak_source(dev),
        threads=n_threads,
        clock=first.clock,
        policy=schedule.policy if schedule is not None else "keep-all",
        actions=_counts(schedule),
        budget_bytes=schedule.budget_bytes if schedule is not None else None,
        static_bytes=trace.static.total if trace is not None else first.static_bytes,
        scheduled=_with_host_prediction(
            _side(
                got.scheduled, pred.sched_peak, pred.sched_step, pred.sched_saved, pred.sched_stages, pred.layer_names
            ),
            schedule,
        ),
        keep_all=_side(
            got.keep_all,
            pred.keep_peak,
            pred.keep_step,
            pred.keep_saved,
            pred.keep_stages if keep_all_memory else None,
            pred.layer_names,
        ),
        versions={**framework_versions(), "platform": platform.platform()},
        command=command,
        predicted_overhead_pct=pred.overhead_pct,
        paired_ratio=got.paired_ratio,
        step_order=got.order,
        prediction_note=pred.note,
        notes=list(overrides.notes),
    )


def _device(name: str) -> Any:
    import torch

    try:
        dev = torch.device(name)
    except RuntimeError:
        raise MemschedError(f"--device {name!r} is not a device; use cpu or cuda[:N]") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise MemschedError(f"--device {name}: CUDA is not available on this machine; use --device cpu")
    if dev.type not in ("cpu", "cuda"):
        raise MemschedError(f"--device {name!r}: only cpu and cuda[:N] are supported")
    return dev


def _release(dev: Any) -> None:
    """Between measurements: return cached blocks so one run's fragmentation does not shape the next's peak
    (max_memory_allocated counts allocated bytes, but a fresh cache is what a user's first step sees)."""
    import gc

    import torch

    gc.collect()
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        torch.cuda.empty_cache()
