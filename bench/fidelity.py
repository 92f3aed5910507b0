"""Fidelity of memsched's predictions over the whole step: predicted vs measured peak and step time.

For each model: trace it (keep-all whole-step peak, per-layer costs), solve at 75 / 50 / 25% and at the
smallest feasible budget, and replay each schedule with `memsched measure`'s code (memsched.service.measure):
the measured whole-step peak (every live tensor byte: `cpu-all-tensors` here, `cuda-allocator` on a GPU)
against the predicted one and the budget, and the median step time against the predicted one. Keep-all is
measured beside every schedule, their steps alternating in one process (memsched.runtime.measure
.measure_side_by_side), so the measured overhead is a ratio of steps taken in the same minutes.

    python -m bench.fidelity                     # the four models, the --quick shapes of bench/peers
    python -m bench.fidelity --models gpt2 --small  # the narrow test versions (a minute)

Writes bench/results/fidelity.{md,json} and fidelity.png (predicted against measured).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger("bench.fidelity")

MODELS = ("gpt2", "bert-base", "vit-base", "resnet50")
SHAPES = {"gpt2": (1, 512), "bert-base": (1, 512), "vit-base": (2, 224), "resnet50": (2, 224)}
"""(batch, sequence) per model: bench/peers' --quick shapes; the vision models' image side is the config's
224 px (the built-in workloads fix it), so ResNet-50 runs batch 2 at 224 px instead of batch 4 at 128 px."""
BUDGETS = ("75%", "50%", "25%", "min")
PEAK_TARGET = 0.05
STEP_TARGET = 0.10
OVERHEAD_TARGET_POINTS = 5.0


@dataclass
class Row:
    """One model at one budget."""

    model: str
    budget: str
    budget_bytes: int
    policy: str
    actions: dict[str, int]
    predicted_peak_bytes: int
    measured_peak_bytes: int
    peak_source: str
    host_bytes: int
    predicted_step_s: float
    measured_step_s: float
    predicted_overhead_pct: float
    measured_overhead_pct: float
    keepall_predicted_peak_bytes: int
    keepall_measured_peak_bytes: int
    keepall_predicted_step_s: float
    keepall_measured_step_s: float
    measured_step_ratio_paired: float | None = None
    """Median over rounds of scheduled step / the keep-all step beside it."""
    step_times_s: list[float] = field(default_factory=list)
    """The scheduled side's timed steps, in order (interleaved with keep-all's)."""
    keepall_step_times_s: list[float] = field(default_factory=list)
    """The keep-all steps taken beside them."""

    @property
    def peak_ratio(self) -> float:
        return self.measured_peak_bytes / self.predicted_peak_bytes

    @property
    def step_ratio(self) -> float:
        return self.measured_step_s / self.predicted_step_s

    @property
    def fits(self) -> bool:
        return self.measured_peak_bytes <= self.budget_bytes

    def checks(self) -> dict[str, bool]:
        return {
            "peak_within_5pct": abs(self.peak_ratio - 1) <= PEAK_TARGET,
            "fits_budget": self.fits,
            "step_within_10pct": abs(self.step_ratio - 1) <= STEP_TARGET,
            "overhead_within_5_points": abs(self.measured_overhead_pct - self.predicted_overhead_pct)
            <= OVERHEAD_TARGET_POINTS,
            "overhead_within_5_points_paired": self.paired_overhead_pct is not None
            and abs(self.paired_overhead_pct - self.predicted_overhead_pct) <= OVERHEAD_TARGET_POINTS,
        }

    @property
    def paired_overhead_pct(self) -> float | None:
        """The measured overhead from the median of the per-round ratios."""
        r = self.measured_step_ratio_paired
        return None if r is None else 100 * (r - 1)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "peak_ratio": self.peak_ratio, "step_ratio": self.step_ratio, **self.checks()}


def run_model(
    name: str, small: bool, steps: int, warmup: int, time_limit: float, infeasible: list[dict[str, Any]]
) -> list[Row]:
    """Trace, solve per budget, measure keep-all and each schedule; budgets below the smallest feasible one
    are answers too (appended to `infeasible`)."""
    from memsched.errors import InfeasibleBudgetError
    from memsched.optimizer.budget import min_feasible_budget
    from memsched.options import SolveOptions
    from memsched.runtime import builtin_workload, trace_workload
    from memsched.service import solve_trace
    from memsched.service.measure import WorkloadArgs, run_measure

    batch, seq = (2, 128) if small else SHAPES[name]
    w = builtin_workload(name, batch_size=batch, seq_len=seq, small=small, dropout=0.0)
    log.info("%s: tracing (batch %d, seq %d)", w.model_id, batch, seq)
    tr, _ = trace_workload(w, steps=steps, warmup=warmup)
    del w
    args = WorkloadArgs(name, batch_size=batch, seq_len=seq, small=small, dropout=0.0)
    rows: list[Row] = []
    keep_peak: int | None = None  # keep-all's whole-step peak, measured with the first budget's run
    for label in BUDGETS:
        spec: str | int = min_feasible_budget(tr) if label == "min" else label
        try:
            sched = solve_trace(tr, spec, SolveOptions(time_limit_s=time_limit))
        except InfeasibleBudgetError as e:
            infeasible.append(
                {"model": tr.model, "budget": label, "budget_bytes": e.budget_bytes, "min_bytes": e.min_feasible_bytes}
            )
            continue
        log.info("%s %s: %s, measuring", w_id(tr), label, sched.policy)
        # Keep-all is measured again beside every schedule, steps interleaved (measure_side_by_side): the
        # overhead is the ratio of steps taken in the same minutes, not of runs minutes apart.
        rep = run_measure(args, sched, tr, steps=steps, warmup=1, keep_all_memory=keep_peak is None)
        s, k = rep.scheduled, rep.keep_all
        assert s is not None and s.predicted_peak_bytes is not None and s.predicted_step_s is not None
        assert k is not None and k.predicted_peak_bytes is not None and k.predicted_step_s is not None
        if keep_peak is None:
            keep_peak = k.measured_peak_bytes
        rows.append(
            Row(
                model=tr.model,
                budget=label,
                budget_bytes=sched.budget_bytes,
                policy=f"{sched.policy} ({sched.solver.status.value})",
                actions=rep.actions,
                predicted_peak_bytes=s.predicted_peak_bytes,
                measured_peak_bytes=s.measured_peak_bytes,
                peak_source=rep.peak_source,
                host_bytes=s.host_bytes,
                predicted_step_s=s.predicted_step_s,
                measured_step_s=s.measured_step_s,
                predicted_overhead_pct=sched.prediction.overhead_pct,
                measured_overhead_pct=100.0 * (s.measured_step_s / k.measured_step_s - 1),
                keepall_predicted_peak_bytes=k.predicted_peak_bytes,
                keepall_measured_peak_bytes=keep_peak,
                keepall_predicted_step_s=k.predicted_step_s,
                keepall_measured_step_s=k.measured_step_s,
                measured_step_ratio_paired=rep.paired_ratio,
                step_times_s=s.measured_step_times_s,
                keepall_step_times_s=k.measured_step_times_s,
            )
        )
    return rows


def w_id(tr: Any) -> str:
    return str(tr.model)


def _mib(x: int) -> str:
    return f"{x / 2**20:.1f}"


def _pct(ratio: float | None) -> str:
    """A measured ratio as an overhead, or '-'."""
    return "-" if ratio is None else f"{100 * (ratio - 1):+.1f}%"


def write_markdown(rows: list[Row], infeasible: list[dict[str, Any]], meta: dict[str, Any], path: Path) -> None:
    lines = [
        "# Fidelity: predicted vs measured over the whole step",
        "",
        f"Command: `{meta['command']}`  ",
        f"Machine: {meta['machine']}; load before / after: {meta['load_before']} / {meta['load_after']}  ",
        f"Versions: {meta['versions']}; memsched commit {meta['commit']}  ",
        f"torch threads: {meta['threads']}; step clock: {meta['clock']}; steps: median of {meta['steps']} after "
        f"warm-up; wall time of the run {meta['seconds']:.0f} s",
        "",
        "Peak: every live tensor byte of the step (`peak_source`: `cpu-all-tensors` is the CPU allocator's "
        "events under the profiler, the meaning of CUDA's max_memory_allocated); host copies made by offloading "
        "are not device bytes and are listed apart. Predicted: the schedule's prediction from the trace "
        "(the simulator). Targets: peak within 5% and <= the budget, step within 10%, overhead within 5 points. "
        "Step times: the median of the timed steps of each side; keep-all and the schedule alternate step by step "
        "in one process; `measured overhead` is the ratio of the two medians, `paired` the median over rounds of "
        "each scheduled step over the keep-all step beside it.",
        "",
        "| model | budget | budget MiB | schedule | predicted peak MiB | measured peak MiB | measured / predicted "
        "| fits | host copies MiB | predicted step s | measured step s | measured / predicted "
        "| keep-all measured step s (beside it) | predicted overhead | measured overhead | paired |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        acts = ", ".join(f"{v} {k}" for k, v in sorted(r.actions.items()))
        lines.append(
            f"| {r.model} | {r.budget} | {_mib(r.budget_bytes)} | {r.policy}: {acts} | {_mib(r.predicted_peak_bytes)} "
            f"| {_mib(r.measured_peak_bytes)} | {r.peak_ratio:.3f} | {'yes' if r.fits else '**NO**'} "
            f"| {_mib(r.host_bytes)} | {r.predicted_step_s:.3f} | {r.measured_step_s:.3f} | {r.step_ratio:.3f} "
            f"| {r.keepall_measured_step_s:.3f} | {r.predicted_overhead_pct:+.1f}% | {r.measured_overhead_pct:+.1f}% "
            f"| {_pct(r.measured_step_ratio_paired)} |"
        )
    for x in infeasible:
        lines.append(
            f"| {x['model']} | {x['budget']} | {_mib(x['budget_bytes'])} | infeasible: the smallest feasible budget "
            f"is {_mib(x['min_bytes'])} MiB (the `min` row) | | | | | | | | | | | | |"
        )
    lines += [
        "",
        "Keep-all (in core), per model (measured step: the median over the model's rows of the keep-all steps "
        "taken beside each schedule):",
        "",
        "| model | predicted peak MiB | measured peak MiB | "
        "measured / predicted | predicted step s | measured step s | measured / predicted |",
        "|---|---|---|---|---|---|---|",
    ]
    for model in dict.fromkeys(r.model for r in rows):
        mine = [r for r in rows if r.model == model]
        r = mine[0]
        step = statistics.median(x.keepall_measured_step_s for x in mine)
        lines.append(
            f"| {r.model} | {_mib(r.keepall_predicted_peak_bytes)} | {_mib(r.keepall_measured_peak_bytes)} "
            f"| {r.keepall_measured_peak_bytes / r.keepall_predicted_peak_bytes:.3f} "
            f"| {r.keepall_predicted_step_s:.3f} | {step:.3f} "
            f"| {step / r.keepall_predicted_step_s:.3f} |"
        )
    totals = {c: sum(r.checks()[c] for r in rows) for c in rows[0].checks()} if rows else {}
    lines += ["", "Targets met: " + ", ".join(f"{c} {n}/{len(rows)}" for c, n in totals.items()), ""]
    lines += ["![predicted vs measured](fidelity.png)", ""]
    path.write_text("\n".join(lines) + "\n")


def plot(rows: list[Row], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 5))
    for ax, (what, p, m, unit) in zip(
        axes,
        (
            (
                "whole-step peak",
                lambda r: r.predicted_peak_bytes / 2**20,
                lambda r: r.measured_peak_bytes / 2**20,
                "MiB",
            ),
            ("step time", lambda r: r.predicted_step_s, lambda r: r.measured_step_s, "s"),
        ),
        strict=True,
    ):
        for model in dict.fromkeys(r.model for r in rows):
            sel = [r for r in rows if r.model == model]
            ax.scatter([p(r) for r in sel], [m(r) for r in sel], label=model)
        lo = min(min(p(r), m(r)) for r in rows)
        hi = max(max(p(r), m(r)) for r in rows)
        ax.plot([lo, hi], [lo, hi], "k--", lw=1, label="measured = predicted")
        tol = PEAK_TARGET if unit == "MiB" else STEP_TARGET
        ax.fill_between([lo, hi], [lo * (1 - tol), hi * (1 - tol)], [lo * (1 + tol), hi * (1 + tol)], alpha=0.1)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(f"predicted {what} ({unit})")
        ax.set_ylabel(f"measured {what} ({unit})")
        ax.set_title(f"{what}: band = ±{tol:.0%}")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def compare_sources(path: Path) -> None:
    """Which CPU measurement is exact: the profiler's allocator events (memsched.runtime.memory) against
    torch.distributed._tools.mem_tracker's MemTracker (a TorchDispatchMode), on two steps whose peak is known:
    a hand-built sequence of allocations, and an embedding's forward + backward (whose CPU kernel allocates
    buffers inside itself)."""
    import torch
    from torch.distributed._tools.mem_tracker import MemTracker

    from memsched.runtime.memory import measure_step_memory

    mib = 1 << 20
    torch.manual_seed(0)
    emb = torch.nn.Embedding(4096, 256)  # 4 MiB of weight
    ids = torch.randint(0, 4096, (64, 128))

    def known() -> None:  # start + 3 + 5 - 3 + 4: peak = start + 9 MiB
        a = torch.empty(3 * mib, dtype=torch.uint8)
        b = torch.empty(5 * mib, dtype=torch.uint8)
        del a
        c = torch.empty(4 * mib, dtype=torch.uint8)
        del b, c

    def embedding() -> None:
        emb.weight.grad = None
        emb(ids).sum().backward()

    lines = [
        "# Whole-step memory on the CPU: which source is exact",
        "",
        "Command: `python -m bench.fidelity --sources`. Two steps whose allocations are known, measured by the",
        "profiler's CPU allocator events (memsched.runtime.memory, `cpu-all-tensors`) and by PyTorch's MemTracker",
        "(`torch.distributed._tools.mem_tracker`, a TorchDispatchMode that tracks the storages operators return).",
        "",
        "| step | expected peak MiB | profiler events MiB | MemTracker MiB |",
        "|---|---|---|---|",
    ]
    for name, step in (("hand-built allocations", known), ("embedding forward + backward", embedding)):
        step()
        m = measure_step_memory(step, torch.device("cpu"))
        mt = MemTracker()
        mt.track_external(emb)
        with mt:
            step()
        tracked = sum(v.get("Total", 0) for v in mt.get_tracker_snapshot("peak").values())
        # known: +3 +5 -3 +4; embedding: the old gradient freed (-4), the output (+8), the new gradient (+4)
        expected = f"{(m.start_bytes + (9 if step is known else 8) * mib) / mib:.3f}"
        lines.append(f"| {name} | {expected} | {m.peak_bytes / mib:.3f} | {tracked / mib:.3f} |")
    lines += [
        "",
        "Both steps start with the embedding's weight (4 MiB), its gradient (4 MiB, the embedding step only) and",
        "the ids (64 KiB) live. Expected: the hand-built step adds +3 +5 -3 +4 MiB (peak start + 9); the embedding",
        "step frees the old gradient (-4), holds its output (+8) and allocates the new gradient (+4): start + 8.",
        "The allocator's events match both (to the bytes of the loss scalar). MemTracker reads low: it counts",
        "only what modules and operators hand it (not the ids, nor the gradient the autograd engine",
        "accumulates outside the dispatcher's view), so it is not CUDA's max_memory_allocated; the",
        "allocator-level source is.",
        "",
    ]
    path.write_text("\n".join(lines))
    print(path.read_text())


def _meta(a: argparse.Namespace, seconds: float, load_before: str) -> dict[str, Any]:
    import torch

    from memsched.runtime.clock import cpu_clock_name
    from memsched.runtime.device import framework_versions

    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
        # The results this run writes after each model are not changes to the code that runs.
        status = ["git", "status", "--porcelain", "--", ".", f":!{a.out}"]
        dirty = subprocess.run(status, capture_output=True, text=True, check=True).stdout
        commit += " (+uncommitted changes)" if dirty.strip() else ""
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    cmd = "python -m bench.fidelity " + " ".join(
        [f"--models {' '.join(a.models)}", f"--steps {a.steps}", f"--threads {a.threads}"]
        + (["--small"] if a.small else [])
    )
    return {
        "command": cmd,
        "machine": f"{platform.platform()}, {platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        "versions": framework_versions(),
        "commit": commit,
        "threads": torch.get_num_threads(),
        "clock": cpu_clock_name(),
        "steps": a.steps,
        "seconds": seconds,
        "load_before": load_before,
        "load_after": _load(),
    }


def _load() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    p.add_argument("--small", action="store_true", help="the narrow test versions (hidden size 64)")
    p.add_argument("--steps", type=int, default=5, help="timed steps per measurement (median)")
    p.add_argument("--warmup", type=int, default=2, help="warm-up steps of the trace")
    p.add_argument("--threads", type=int, default=1, help="torch threads (fixed for the whole run)")
    p.add_argument("--time-limit", type=float, default=10.0, help="solver time limit per budget, seconds")
    p.add_argument("--out", type=Path, default=Path("bench/results"), help="results directory")
    p.add_argument("--sources", action="store_true", help="only compare the CPU measurement sources")
    p.add_argument("--render", action="store_true", help="only rewrite the markdown and the plot from the JSON")
    p.add_argument("-v", "--verbose", action="store_true")
    a = p.parse_args(argv)
    if a.sources:
        compare_sources(a.out / "fidelity-sources.md")
        return
    if a.render:  # the markdown and the plot again, from the JSON of a run
        doc = json.loads((a.out / "fidelity.json").read_text())
        names = set(Row.__dataclass_fields__)
        rows = [Row(**{k: v for k, v in r.items() if k in names}) for r in doc["rows"]]
        write_markdown(rows, doc["infeasible"], doc["meta"], a.out / "fidelity.md")
        plot(rows, a.out / "fidelity.png")
        return
    logging.basicConfig(level=logging.INFO if a.verbose else logging.WARNING, format="%(name)s: %(message)s")
    import torch
    from transformers.utils import logging as tf_logging

    tf_logging.set_verbosity_error()
    torch.set_num_threads(a.threads)
    load_before = _load()
    t0 = time.perf_counter()
    rows: list[Row] = []
    infeasible: list[dict[str, Any]] = []
    a.out.mkdir(parents=True, exist_ok=True)
    for m in a.models:
        rows += run_model(m, a.small, a.steps, a.warmup, a.time_limit, infeasible)
        write_results(rows, infeasible, _meta(a, time.perf_counter() - t0, load_before), a.out)  # after each model
    print((a.out / "fidelity.md").read_text())


def write_results(rows: list[Row], infeasible: list[dict[str, Any]], meta: dict[str, Any], out: Path) -> None:
    doc = {"meta": meta, "rows": [r.to_json() for r in rows], "infeasible": infeasible}
    (out / "fidelity.json").write_text(json.dumps(doc, indent=2) + "\n")
    write_markdown(rows, infeasible, meta, out / "fidelity.md")
    if rows:
        plot(rows, out / "fidelity.png")


if __name__ == "__main__":
    main()
