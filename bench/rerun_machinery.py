"""What pricing the recompute machinery changes (Trace.rerun_overhead): recompute plans predicted with and without
it, against `measure`'s side-by-side steps, on models the tracer traces on this CPU.

Run: .venv/bin/python bench/rerun_machinery.py [--models gpt2,bert-base,resnet50,vit-base] [--steps 12]

Per model: one trace (one torch thread, built-in `small` configs), then five plans, each measured side by side
with keep-all through the same hooks (`measure_side_by_side`, paired ratio):
  each           every layer a segment of its own (checkpoint-all)
  pairs          segments of two layers (where the trace allows; Trace.segment_last)
  one            the longest segments the trace allows
  offload-each   every layer but the last offloaded (on the CPU, synchronous copies on the compute thread)
  offload-first  the first layer alone offloaded
Predicted: the simulator's step over its keep-all step on that trace, and on the same trace as it was priced
before: `rerun_overhead` None and the copy probe's latency (TraceReport.probe_copy_latency_s). Writes
bench/results/rerun_machinery.{md,json} (the .md's hand-written notes, from its first '## ' heading, are kept).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch
from solver_bench import _meta, kept_notes, results_header  # run by path (bench/ on sys.path)

from memsched.optimizer.decisions import KEEP, Decision, offload_all, recompute
from memsched.optimizer.simulate import make_schedule, simulate
from memsched.runtime import builtin_workload, trace_workload
from memsched.runtime.measure import measure_side_by_side
from memsched.schema import SolverRecord, SolverStatus, Trace

RESULTS = Path(__file__).resolve().parent / "results"


def plans(trace: Trace) -> dict[str, list[Decision]]:
    """Recompute-only plans of 1, 2 and the most layers a segment (none across Trace.segment_last), and two
    offload plans."""
    last = trace.segment_last()
    out: dict[str, list[Decision]] = {}
    for name, longest in (("each", 1), ("pairs", 2), ("one", trace.n)):
        ds: list[Decision] = []
        a = 0
        for k in range(trace.n):
            if k > a and (k - a >= longest or k > last[a]):
                a = k
            ds.append(recompute(group=a))
        out[name] = ds
    assert all(len(p) == trace.n and KEEP not in p for p in out.values())  # recompute only so far
    # Copies: every layer but the last offloaded (synchronous on the CPU), and the first alone.
    out["offload-each"] = [offload_all(trace, i, i, i) for i in range(trace.n - 1)] + [KEEP]
    out["offload-first"] = [offload_all(trace, 0, 0, 0)] + [KEEP] * (trace.n - 1)
    return out


def predicted_ratio(trace: Trace, plan: list[Decision]) -> float:
    sim = simulate(trace, plan, None, with_events=False)
    return sim.step_s / sim.keepall_step_s


def run_model(name: str, steps: int) -> list[dict[str, object]]:
    w = builtin_workload(name, small=True)
    tr, report = trace_workload(w)
    # Before: re-runs priced by the layers alone, and copies at the copy probe's latency.
    device = tr.device
    if report.probe_copy_latency_s is not None:
        device = device.model_copy(update={"copy_latency_s": report.probe_copy_latency_s})
    bare = tr.model_copy(update={"rerun_overhead": None, "device": device})
    rows = []
    for plan_name, plan in plans(tr).items():
        record = SolverRecord(backend="heuristic", status=SolverStatus.FEASIBLE, wall_s=0.0)
        sched = make_schedule(tr, plan, 10**15, plan_name, record)
        side = measure_side_by_side(w.model, w.step, sched, trace=tr, optimizer=w.optimizer, steps=steps)
        assert side.keep_all is not None and side.scheduled is not None
        rows.append(
            {
                "model": name,
                "layers": tr.n,
                "plan": plan_name,
                "segments": len({d.group for d in plan if d.group >= 0}),
                "copy_latency_s": tr.device.copy_latency_s,
                "probe_copy_latency_s": report.probe_copy_latency_s,
                "per_segment_s": tr.rerun_segment_s,
                "per_layer_s": tr.rerun_layer_s,
                "predicted_before": predicted_ratio(bare, plan),
                "predicted_now": predicted_ratio(tr, plan),
                "measured": side.ratio,
                "measured_paired": side.paired_ratio,
                "keep_all_step_s": statistics.median(side.keep_all.step_times_s),
            }
        )
        print(json.dumps(rows[-1]))
    return rows


def _latency(row: dict[str, object]) -> str:
    now = float(row["copy_latency_s"]) * 1e6  # type: ignore[arg-type]
    probe = row["probe_copy_latency_s"]
    return f"{now:.0f} us" if probe is None else f"{float(probe) * 1e6:.0f} -> {now:.0f} us"  # type: ignore[arg-type]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="gpt2,bert-base,resnet50,vit-base")
    ap.add_argument("--steps", type=int, default=12)
    args = ap.parse_args()
    torch.set_num_threads(1)
    meta = _meta(("memsched", "torch", "transformers"))
    rows = [row for name in args.models.split(",") for row in run_model(name, args.steps)]
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "rerun_machinery.json").write_text(json.dumps({**meta, "rows": rows}, indent=1) + "\n")
    title = "Recompute and offload plans, priced with and without the machinery and the calibrated copies"
    lines = results_header(title, meta)
    lines += [
        "",
        "One torch thread; built-in `small` configs; steps over keep-all (through the same hooks). Predicted before:",
        "the same trace with `rerun_overhead` None and the copy probe's latency (before -> after the calibration).",
        "Error: predicted / measured (paired) - 1.",
        "",
        "| model (layers) | machinery: a segment / a layer; copy latency | plan (segments) | predicted before | "
        "predicted now | "
        "measured (paired) | error before | error now |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        paired = float(r["measured_paired"])  # type: ignore[arg-type]
        before, now = float(r["predicted_before"]), float(r["predicted_now"])  # type: ignore[arg-type]
        lines.append(
            f"| {r['model']} ({r['layers']}) | {float(r['per_segment_s']) * 1e3:.3f} / "  # type: ignore[arg-type]
            f"{float(r['per_layer_s']) * 1e3:.3f} ms; {_latency(r)} | {r['plan']} ({r['segments']}) | "  # type: ignore[arg-type]
            f"{before:.3f} | {now:.3f} | "
            f"{float(r['measured']):.3f} ({paired:.3f}) | {before / paired - 1:+.1%} | {now / paired - 1:+.1%} |"  # type: ignore[arg-type]
        )
    md = RESULTS / "rerun_machinery.md"
    md.write_text("\n".join(lines) + "\n" + kept_notes(md))


if __name__ == "__main__":
    main()
