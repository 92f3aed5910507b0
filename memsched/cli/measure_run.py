"""`memsched measure`: replay a schedule on the workload it was made for and compare with the prediction.

The runtime (memsched.runtime) measures; the prediction comes from the schedule and, for the CPU ledger's
counterpart and the keep-all prediction, from the simulator. That is why this lives in memsched/cli/ and not in
runtime/: the runtime never imports the optimizer.

One process measures the in-core keep-all step and the scheduled step on the same model at the same batch,
alternating rounds, so the slowdown is a ratio measured side by side (docs/architecture.md, 'Benchmarks, not
timed tests').
"""

from __future__ import annotations

import logging
import platform
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from memsched.errors import MemschedError, ScheduleMismatchError
from memsched.schema import Schedule, Trace

if TYPE_CHECKING:  # torch stays out of `memsched --help`
    from memsched.runtime import Measurement, Workload

log = logging.getLogger(__name__)

PEAK_TARGET = 0.05
"""Measured peak within 5% of the predicted peak (the GPU evidence's target: bench/gpu/README.md)."""
STEP_TARGET = 0.10
"""Measured step time within 10% of the predicted step time."""


@dataclass
class WorkloadArgs:
    """How to build the workload: the same flags as `memsched trace`, so a trace and its replay match."""

    model: str
    batch_size: int = 2
    seq_len: int = 128
    num_layers: int | None = None
    small: bool = False
    device: str = "cpu"
    dtype: str = "float32"
    dropout: float | None = None
    optimizer: str = "adamw"
    layer_pattern: list[str] | None = None


@dataclass
class Side:
    """One measured configuration (keep-all or the schedule): predicted against measured."""

    predicted_peak_bytes: int | None
    measured_peak_bytes: int
    predicted_step_s: float | None
    measured_step_s: float
    measured_step_rounds_s: list[float] = field(default_factory=list)
    """The median step time of each round (the reported one is the fastest round's)."""
    saved_peak_bytes: int | None = None
    """CPU: the ledger's peak of live saved bytes; None on CUDA."""

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
            "measured_step_rounds_s": self.measured_step_rounds_s,
            "saved_peak_bytes": self.saved_peak_bytes,
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
    memory_basis: str
    """'max_memory_allocated' (CUDA) or 'cpu-ledger' (static + live saved tensors of the traced layers)."""
    policy: str
    """The schedule's policy, or 'keep-all'."""
    actions: dict[str, int]
    budget_bytes: int | None
    static_bytes: int | None
    scheduled: Side | None
    keep_all: Side | None
    versions: dict[str, str]
    command: str = ""

    def derived(self) -> dict[str, Any]:
        """Slowdown, fits-budget, oversubscription and the target checks."""
        d: dict[str, Any] = {}
        s, k, b = self.scheduled, self.keep_all, self.budget_bytes
        if s is not None and k is not None:
            d["slowdown_pct"] = 100.0 * (s.measured_step_s / k.measured_step_s - 1.0)
            if s.predicted_step_s and k.predicted_step_s:
                d["predicted_slowdown_pct"] = 100.0 * (s.predicted_step_s / k.predicted_step_s - 1.0)
        if s is not None and b is not None:
            d["fits_budget"] = s.measured_peak_bytes <= b
            d["budget_headroom_bytes"] = b - s.measured_peak_bytes
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

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "batch_size": self.batch_size,
            "seq_len": self.seq_len,
            "dtype": self.dtype,
            "device": self.device,
            "device_name": self.device_name,
            "memory_basis": self.memory_basis,
            "policy": self.policy,
            "actions": self.actions,
            "budget_bytes": self.budget_bytes,
            "static_bytes": self.static_bytes,
            "scheduled": None if self.scheduled is None else self.scheduled.to_json(),
            "keep_all": None if self.keep_all is None else self.keep_all.to_json(),
            **self.derived(),
            "targets": {"peak_within": PEAK_TARGET, "step_within": STEP_TARGET},
            "versions": self.versions,
            "command": self.command,
        }


def check_trace_matches(trace: Trace, w: Workload, dtype: str, device_type: str) -> None:
    """The trace must describe the workload being built: same model id, batch, sequence, dtype, device kind."""
    mine = {"model": w.model_id, "batch_size": w.batch_size, "seq_len": w.seq_len, "dtype": dtype}
    theirs = {"model": trace.model, "batch_size": trace.batch_size, "seq_len": trace.seq_len, "dtype": trace.dtype}
    for key, value in mine.items():
        if theirs[key] != value:
            raise ScheduleMismatchError(
                f"--trace: the trace's {key} is {theirs[key]!r} but this run builds {value!r}; pass the flags the "
                "trace was recorded with (--batch-size, --seq-len, --layers, --small, --dtype)"
            )
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


def _keepall_prediction(trace: Trace | None, cpu: bool) -> tuple[int | None, float | None]:
    """The simulator's keep-all peak and step time for the trace (CPU: static + the saved part)."""
    if trace is None:
        return None, None
    from memsched.optimizer.baselines import keep_all
    from memsched.optimizer.simulate import simulate

    sim = simulate(trace, keep_all(trace), with_events=False)
    if cpu:
        from memsched.cli.demo import saved_profile

        return trace.static.total + max(saved_profile(trace, sim.decisions)), sim.step_s
    return sim.peak_bytes, sim.step_s


def run_measure(
    args: WorkloadArgs,
    schedule: Schedule | None,
    trace: Trace | None = None,
    *,
    steps: int = 5,
    warmup: int = 2,
    rounds: int = 1,
    baseline: bool = True,
    command: str = "",
) -> MeasureReport:
    """Build the workload, check the schedule (and trace) against it, and measure keep-all and the schedule.

    schedule None measures keep-all only (the in-core baseline). baseline False skips keep-all when a schedule
    is given. rounds > 1 alternates keep-all and scheduled rounds and keeps each one's fastest (a shared CPU).
    """
    import torch

    from memsched.runtime import find_layers, measure, workload
    from memsched.runtime.device import device_name, framework_versions
    from memsched.runtime.models import parse_dtype

    if steps < 1 or warmup < 0 or rounds < 1:
        raise MemschedError(f"--steps and --rounds must be >= 1 and --warmup >= 0 (got {steps}, {rounds}, {warmup})")
    if schedule is None and not baseline:
        raise MemschedError("nothing to measure: give a SCHEDULE, or drop --no-baseline to measure keep-all")
    dtype = str(parse_dtype(args.dtype)).removeprefix("torch.")
    dev = _device(args.device)
    w = workload(
        args.model,
        batch_size=args.batch_size,
        seq_len=args.seq_len,
        num_layers=args.num_layers,
        small=args.small,
        device=dev,
        dropout=args.dropout,
        optimizer=args.optimizer,
        dtype=dtype,
    )
    if trace is not None:
        check_trace_matches(trace, w, dtype, dev.type)
    names = [n for n, _ in find_layers(w.model, args.layer_pattern)]
    cpu = dev.type != "cuda"
    predicted_saved: int | None = None
    sched_pred_peak: int | None = None
    if schedule is not None:
        check_schedule_matches(schedule, names)
        if trace is not None:
            from memsched.schema import check_schedule

            check_schedule(schedule, trace)
        if cpu:
            # The CPU has no allocator: the measured peak is static + the saved-tensor ledger, and its
            # prediction the simulator's saved part of stage memory (needs the trace).
            if trace is not None:
                from memsched.cli.demo import predicted_saved_profile

                predicted_saved = max(predicted_saved_profile(trace, schedule))
                sched_pred_peak = trace.static.total + predicted_saved
        else:
            sched_pred_peak = schedule.prediction.peak_bytes
    keep_pred_peak, keep_pred_step = _keepall_prediction(trace, cpu)

    def step(m: Any) -> None:
        w.step(m)

    oom = getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)  # torch < 2.5 has only the latter

    def one(sched: Schedule | None, what: str) -> Measurement:
        try:
            return measure(
                w.model,
                step,
                sched,
                trace=trace if sched is not None else None,
                layers=args.layer_pattern,
                optimizer=w.optimizer,
                steps=steps,
                warmup=warmup,
                predicted_saved_peak_bytes=predicted_saved if sched is not None else None,
            )
        except oom as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else "out of memory"
            raise MemschedError(
                f"{what}: CUDA out of memory at batch {args.batch_size} ({first[:160]}); lower --batch-size"
            ) from None

    keeps: list[Measurement] = []
    gots: list[Measurement] = []
    for _ in range(rounds):
        if baseline:
            keeps.append(one(None, "keep-all"))
            _release(dev)
        if schedule is not None:
            gots.append(one(schedule, f"schedule {schedule.policy}"))
            _release(dev)

    static = trace.static.total if trace is not None else (keeps or gots)[0].static_bytes

    def side(ms: list[Measurement], pred_peak: int | None, pred_step: float | None) -> Side | None:
        if not ms:
            return None
        best = min(ms, key=lambda m: m.step_s)
        # CPU: static + ledger, with the trace's static bytes when there is one (they include what is saved
        # outside the traced layers, which a keep-all run without the trace cannot attribute).
        peak = static + max(m.saved_peak_bytes or 0 for m in ms) if cpu else max(m.peak_bytes for m in ms)
        return Side(
            predicted_peak_bytes=pred_peak,
            measured_peak_bytes=peak,
            predicted_step_s=pred_step,
            measured_step_s=best.step_s,
            measured_step_rounds_s=[m.step_s for m in ms],
            saved_peak_bytes=max(m.saved_peak_bytes or 0 for m in ms) if cpu else None,
        )

    return MeasureReport(
        model=w.model_id,
        batch_size=w.batch_size,
        seq_len=w.seq_len,
        dtype=dtype,
        device=dev.type,
        device_name=device_name(dev),
        memory_basis="cpu-ledger" if cpu else "max_memory_allocated",
        policy=schedule.policy if schedule is not None else "keep-all",
        actions=_counts(schedule),
        budget_bytes=schedule.budget_bytes if schedule is not None else None,
        static_bytes=static,
        scheduled=side(gots, sched_pred_peak, schedule.prediction.step_s if schedule is not None else None),
        keep_all=side(keeps, keep_pred_peak, keep_pred_step),
        versions={**framework_versions(), "platform": platform.platform()},
        command=command,
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
