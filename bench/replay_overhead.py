"""What the replay itself costs a step, against the user's plain step: kept layers with the replay's saved-tensor
hooks on every one (the rule before 2026-12-07) and without them where nothing needs their claims
(`replay.bare_kept_layers`), on models the tracer traces on this CPU.

Run: .venv/bin/python bench/replay_overhead.py [--models gpt2,bert-base,resnet50,vit-base] [--rounds 12]

Per model: one trace (one torch thread, built-in `small` configs), then four plans:
  keep-all       every layer kept
  each           every layer a segment of its own (checkpoint-all)
  offload-first  the first layer offloaded, the rest kept
  offload-each   every layer but the last offloaded
Each plan runs under both rules, and where the model has its own gradient checkpointing (transformers'
`gradient_checkpointing_enable()`), that too: the user's alternative to the plan `each`. A round times, for
each plan under each rule, a block of steps of the plain model and then a block under the schedule (applied once
per block, as a training loop applies it once), and takes the second block's median step over the first's. The
table gives the median ratio over the rounds, and the simulator's predicted ratio over keep-all for reference.
Writes bench/results/replay_overhead.{md,json} (the .md's hand-written notes, from its first '## ' heading, are
kept).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
from solver_bench import _meta, kept_notes, results_header  # run by path (bench/ on sys.path)

from memsched.optimizer.decisions import KEEP, Decision, offload_all, recompute
from memsched.optimizer.simulate import make_schedule, simulate
from memsched.runtime import builtin_workload, replay, trace_workload
from memsched.schema import Schedule, SolverRecord, SolverStatus, Trace

RESULTS = Path(__file__).resolve().parent / "results"
RULES = ("hooked", "bare")
"""hooked: every kept layer enters the saved-tensor hooks; bare: `replay.bare_kept_layers` (the rule now)."""


def plans(trace: Trace) -> dict[str, list[Decision]]:
    n = trace.n
    return {
        "keep-all": [KEEP] * n,
        "each": [recompute(group=k) for k in range(n)],
        "offload-first": [offload_all(trace, 0, 0, 0)] + [KEEP] * (n - 1),
        "offload-each": [offload_all(trace, i, i, i) for i in range(n - 1)] + [KEEP],
    }


def _block(step: Callable[[], object], steps: int) -> float:
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def run_model(name: str, rounds: int, steps: int) -> list[dict[str, object]]:
    w = builtin_workload(name, small=True)
    tr, _report = trace_workload(w)
    record = SolverRecord(backend="heuristic", status=SolverStatus.FEASIBLE, wall_s=0.0)
    decisions = plans(tr)
    scheds: dict[str, Schedule] = {p: make_schedule(tr, plan, 10**15, p, record) for p, plan in decisions.items()}
    bare_rule = replay.bare_kept_layers
    ratios: dict[tuple[str, str], list[float]] = {(p, r): [] for p in scheds for r in RULES}
    bare_layers: dict[str, int] = {}
    for _ in range(steps):
        w.step()  # warm-up
    framework: list[float] = []  # the model's own gradient checkpointing (torch.utils.checkpoint per block)
    can_checkpoint = bool(getattr(w.model, "supports_gradient_checkpointing", False))
    for k in range(rounds):
        if can_checkpoint:
            plain = _block(w.step, steps)
            w.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            try:
                w.step()
                framework.append(_block(w.step, steps) / plain)
            finally:
                w.model.gradient_checkpointing_disable()
        for p, sched in scheds.items():
            for rule in RULES if k % 2 == 0 else RULES[::-1]:  # neither rule always runs first
                # The plain block right before each block: this CPU runs whole seconds of steps slower at times.
                plain = _block(w.step, steps)
                replay.bare_kept_layers = (
                    bare_rule if rule == "bare" else (lambda plan, trace, counting: [False] * plan.n)
                )
                try:
                    with replay.apply_schedule(w.model, sched, trace=tr) as sm:
                        bare_layers[p] = sum(bare_rule(sm.plan, tr, counting=False))
                        w.step(sm)  # the schedule's first step (its pool's buffers) is not timed
                        ratios[p, rule].append(_block(lambda: w.step(sm), steps) / plain)
                finally:
                    replay.bare_kept_layers = bare_rule
    rows: list[dict[str, object]] = []
    for p, sched in scheds.items():
        sim = simulate(tr, decisions[p], None, with_events=False)
        row: dict[str, object] = {
            "model": name,
            "layers": tr.n,
            "plan": p,
            "bare_kept_layers": bare_layers[p],
            "kept_layers": sum(a.action == "keep" for a in sched.actions),
            "predicted_over_keep_all": sim.step_s / sim.keepall_step_s,
        }
        for rule in RULES:
            row[f"{rule}_over_plain"] = statistics.median(ratios[p, rule])
            row[f"{rule}_rounds"] = ratios[p, rule]
        if p == "each" and framework:
            row["framework_checkpointing_over_plain"] = statistics.median(framework)
            row["framework_checkpointing_rounds"] = framework
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if not k.endswith("_rounds")}))
    return rows


def _framework(row: dict[str, object]) -> str:
    got = row.get("framework_checkpointing_over_plain")
    return "" if got is None else f"{float(got):.3f}"  # type: ignore[arg-type]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="gpt2,bert-base,resnet50,vit-base")
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--steps", type=int, default=5, help="timed steps per block")
    args = ap.parse_args()
    torch.set_num_threads(1)
    meta = _meta(("memsched", "torch", "transformers"))
    rows = [row for name in args.models.split(",") for row in run_model(name, args.rounds, args.steps)]
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "replay_overhead.json").write_text(json.dumps({**meta, "rows": rows}, indent=1) + "\n")
    lines = results_header("The replay's own cost: a step under a schedule over the plain step", meta)
    lines += [
        "",
        "One torch thread; built-in `small` configs. Median over rounds of (median step of a block under the",
        "schedule) / (median step of the plain model's block in the same round). hooked: every kept layer enters",
        "the replay's saved-tensor hooks (the rule before 2026-12-07); bare: only those `replay.bare_kept_layers`",
        "leaves hooked.",
        "Predicted: the simulator's step over its keep-all step on the trace (what the plan adds to keep-all).",
        "Framework: the model's own `gradient_checkpointing_enable()` (non-reentrant torch.utils.checkpoint around",
        "each block: the plan `each` without memsched), timed in the same rounds; blank where the model has none.",
        "",
        "| model (layers) | plan | kept layers (bare) | predicted over keep-all | hooked over plain | "
        "bare over plain | framework over plain |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} ({r['layers']}) | {r['plan']} | {r['kept_layers']} ({r['bare_kept_layers']}) | "
            f"{float(r['predicted_over_keep_all']):.3f} | {float(r['hooked_over_plain']):.3f} | "  # type: ignore[arg-type]
            f"{float(r['bare_over_plain']):.3f} | {_framework(r)} |"  # type: ignore[arg-type]
        )
    md = RESULTS / "replay_overhead.md"
    md.write_text("\n".join(lines) + "\n" + kept_notes(md))


if __name__ == "__main__":
    main()
