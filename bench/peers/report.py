"""Plots and the markdown report (bench/results/peers.md) from the results files the runs wrote."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from bench.peers.approaches import APPROACHES, LABELS
from bench.peers.models import MODELS

log = logging.getLogger(__name__)

_MIB = float(2**20)
_MARKERS = {
    "keep-all": "s",
    "checkpoint-blocks": "^",
    "checkpoint-sqrt": "v",
    "save_on_cpu": "D",
    "torch.compile-budget": "P",
    "sac-milp": "X",
    "memsched": "o",
    "memsched-recompute": "*",
}


def load_results(out_dir: Path) -> list[dict[str, Any]]:
    found = []
    for p in out_dir.glob("peers-*.json"):
        if ".trace" in p.name or p.name.endswith(".schedule.json"):
            continue
        data = json.loads(p.read_text())
        if isinstance(data, dict) and "rows" in data:
            found.append(data)
    order = {m: i for i, m in enumerate(MODELS)}
    return sorted(found, key=lambda d: (order.get(d["model"], len(order)), d["model"]))


def _use_cpu_time(res: dict[str, Any]) -> bool:
    return res["settings"]["device"] == "cpu" and res.get("keepall_cpu_s") is not None


def _time_kind(res: dict[str, Any]) -> str:
    return "process CPU time per step" if _use_cpu_time(res) else "step time"


def _time_ratio(r: dict[str, Any], res: dict[str, Any]) -> float:
    """On a (shared) CPU the CPU-time ratio; wall time otherwise."""
    if _use_cpu_time(res) and r.get("cpu_ratio") is not None:
        return float(r["cpu_ratio"])
    return float(r["time_ratio"])


def _ok_rows(res: dict[str, Any], name: str) -> list[dict[str, Any]]:
    return [r for r in res["rows"] if r["approach"] == name and r["status"] == "ok"]


def pareto_plot(res: dict[str, Any], path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(8.5, 5.5))
    for name in APPROACHES:
        rows = sorted(_ok_rows(res, name), key=lambda r: r["peak_ratio"])
        if not rows:
            continue
        xs = [r["peak_ratio"] for r in rows]
        ys = [(_time_ratio(r, res) - 1) * 100 for r in rows]
        (line,) = ax.plot(xs, ys, marker=_MARKERS.get(name, "o"), ms=8, lw=1.5, label=LABELS.get(name, name))
        for r, x, y in zip(rows, xs, ys, strict=True):
            if r["budget"] is not None:
                ax.annotate(
                    f"{round(r['budget'] * 100)}%",
                    (x, y),
                    textcoords="offset points",
                    xytext=(5, 4),
                    fontsize=7,
                    color=line.get_color(),
                )
            if not r.get("grad", {}).get("ok", False):
                ax.plot([x], [y], marker="x", color="red", ms=14, mew=2)
    for b in res["settings"]["budgets"]:
        ax.axvline(b, color="#999999", ls=":", lw=1)
        ax.text(
            b,
            1.0,
            f" {round(b * 100)}% budget",
            transform=ax.get_xaxis_transform(),
            fontsize=7,
            color="#666666",
            va="top",
            rotation=90,
        )
    ax.axhline(0, color="#444444", lw=0.8)
    ax.set_yscale("symlog", linthresh=10)
    ax.set_xlabel("measured peak activation memory / keep-all (lower is better)")
    ax.set_ylabel(f"{_time_kind(res)} overhead vs keep-all, % (symlog)")
    shape = ", ".join(f"{k} {v}" for k, v in res["shape"].items())
    ax.set_title(f"{res['model']} ({shape}) on {res['settings']['device'].upper()}: memory vs time, measured")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=3, frameon=False)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path


def timeline_plots(res: dict[str, Any], out_dir: Path) -> list[tuple[str, Path]]:
    """memsched's schedules at the middle budget (or the nearest feasible one), simulated on the trace. (On the
    CPU the recompute-only variant is not run: memsched's default plans keep + recompute there.)"""
    from memsched.io import load_schedule, load_trace
    from memsched.service.plot import plot_timeline

    budgets = sorted(res["settings"]["budgets"])
    mid = budgets[len(budgets) // 2]
    variants = [("memsched", "trace", "as traced"), ("memsched-recompute", "trace", "recompute only")]
    out: list[tuple[str, Path]] = []
    for tag, trace_name, label in variants:
        tp = out_dir / f"peers-{res['model']}.{trace_name}.json"
        # The middle budget first, then the others nearest to it (a budget may have been infeasible).
        for b in sorted(budgets, key=lambda x: abs(x - mid)):
            sp = out_dir / f"peers-{res['model']}-{tag}-{round(b * 100)}.schedule.json"
            if sp.is_file() and tp.is_file():
                suffix = "" if not out else f"-{tag}"
                png = out_dir / f"peers-{res['model']}-timeline{suffix}.png"
                tr, sc = load_trace(tp), load_schedule(sp)
                title = (
                    f"{res['model']}: memsched ({label}) at {round(b * 100)}% — {sc.policy}, predicted "
                    f"+{sc.prediction.overhead_pct:.1f}%, peak {sc.prediction.peak_bytes / 2**30:.2f} GiB of "
                    f"{sc.budget_bytes / 2**30:.2f} GiB (static {tr.static.total / 2**30:.2f} GiB)"
                )
                plot_timeline(tr, sc, png, title=title)
                out.append((f"{label}, {round(b * 100)}% budget", png))
                break
    return out


def _pred(pct: float) -> str:
    return f"{pct:+.1f}%"


def _fmt_s(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def _mib(x: int | None) -> str:
    return "-" if x is None else f"{x / _MIB:.1f}"


def _fmt_ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def _grad_cell(r: dict[str, Any]) -> str:
    g = r.get("grad")
    if not g:
        return "-"
    if g["bitwise"]:
        return "yes (bitwise)"
    return f"{'yes' if g['ok'] else '**NO**'} (rel err {g['max_rel_err']:.1e})"


def model_section(res: dict[str, Any], out_dir: Path) -> str:
    budgets = res["settings"]["budgets"]
    lines = []
    shape = ", ".join(f"{k} {v}" for k, v in res["shape"].items())
    lines.append(f"### {res['model']} ({shape}; {res['n_blocks']} blocks, {res['params'] / 1e6:.1f} M parameters)\n")
    lines.append(
        f"Command: `{res['command']}` (torch threads: {res['machine']['torch_threads']}; memsched "
        f"{res['machine']['memsched_commit']})  \n"
        f"Keep-all: peak activation memory **{res['keepall_peak_bytes'] / _MIB:.1f} MiB**, step "
        f"**{res['keepall_step_s']:.3f} s** (median of {res['settings']['steps']} after "
        f"{res['settings']['warmup']} warm-up).\n"
    )
    keep = next(r for r in res["rows"] if r["approach"] == "keep-all")
    if keep.get("times_end_s"):
        fmt = ", ".join
        lines.append(
            f"Keep-all was timed at the start ({fmt(f'{t:.2f}' for t in keep['times_s'])} s) and again at the end "
            f"({fmt(f'{t:.2f}' for t in keep['times_end_s'])} s) of the run; the ratios use the median of both: "
            "their spread is the noise of this shared machine.\n"
        )
    ok = [r for r in res["rows"] if r["status"] == "ok"]
    ck = next((r for r in ok if r["approach"] == "checkpoint-blocks"), None)
    if ck is not None:
        lines.append(
            f"Checkpointing every block leaves **{ck['peak_ratio']:.0%}** of the keep-all peak: roughly the floor set "
            "by memory outside the blocks (embeddings, the output head and its vocabulary-sized gradients, "
            "transients), which no block-level plan moves; a budget below it is out of reach for every approach "
            "here.\n"
        )
    head = (
        "| approach | budget | peak MiB | peak / keep-all | end-of-forward MiB | step s | time / keep-all | "
        "CPU s | CPU time / keep-all | "
        + " | ".join(f"fits {round(b * 100)}%" for b in budgets)
        + " | gradients | notes |"
    )
    lines += [head, "|" + "---|" * (head.count("|") - 1)]
    for r in res["rows"]:
        label = LABELS.get(r["approach"], r["approach"])
        bud = "-" if r["budget"] is None else f"{round(r['budget'] * 100)}%"
        if r["status"] != "ok":
            cells = ["-"] * (7 + len(budgets) + 1)
            lines.append(f"| {label} | {bud} | " + " | ".join(cells) + f" | {r['status']}: {r.get('reason', '')} |")
            continue
        fits = []
        for b in budgets:
            v = r["fits"].get(str(b))
            fits.append("-" if v is None else ("yes" if v else "no"))
        notes = "; ".join(r.get("notes", []))
        pool = r.get("extra", {}).get("pool_resident_bytes")
        if pool and res["settings"]["device"] == "cpu":
            notes += f"; includes {pool / _MIB:.1f} MiB of host-pool buffers (same RAM on CPU)"
        elif pool:
            notes += f"; {pool / _MIB:.1f} MiB of host-pool buffers (pinned host memory, not in the peak)"
        lines.append(
            f"| {label} | {bud} | {r['effective_peak_bytes'] / _MIB:.1f} | {_fmt_ratio(r['peak_ratio'])} | "
            f"{_mib(r.get('forward_end_bytes'))} | {r['step_s']:.3f} | {_fmt_ratio(r['time_ratio'])} | "
            f"{_fmt_s(r.get('cpu_s'))} | {_fmt_ratio(r.get('cpu_ratio'))} | "
            + " | ".join(fits)
            + f" | {_grad_cell(r)} | {notes} |"
        )
    lines.append("")
    pareto = pareto_plot(res, out_dir / f"peers-{res['model']}-pareto.png")
    lines.append(f"![{res['model']} Pareto]({pareto.name})\n")
    lines.append("A red × marks a run whose gradient check failed; the dotted lines are the budgets.\n")
    ms = [r for r in res["rows"] if r["approach"].startswith("memsched") and r["status"] == "ok"]
    if ms:
        lines.append("memsched's own figures (trace once, solve per budget; predictions are the simulator's):\n")
        lines.append(
            "| variant | budget | schedule | solver | solve s | predicted act. peak MiB | measured MiB | "
            "runtime ledger saved-peak MiB | predicted overhead | measured overhead (CPU time on CPU) |"
        )
        lines.append("|---|---|---|---|---|---|---|---|---|---|")
        for r in ms:
            e = r.get("extra", {})
            s = e.get("solver", {})
            acts = ", ".join(f"{v} {k}" for k, v in sorted(e.get("actions", {}).items()))
            led = e.get("ledger_saved_peak_bytes")
            lines.append(
                f"| {r['approach']} | {round(r['budget'] * 100)}% | {e.get('policy')}: {acts} | "
                f"{s.get('backend')} ({s.get('status')}) | {e.get('solve_s', 0):.1f} | "
                f"{e.get('predicted_activation_peak_bytes', 0) / _MIB:.1f} | {r['effective_peak_bytes'] / _MIB:.1f} | "
                f"{'-' if led is None else f'{led / _MIB:.1f}'} | {_pred(e.get('predicted_overhead_pct', 0))} | "
                f"{(_time_ratio(r, res) - 1) * 100:+.1f}% |"
            )
        lines.append("")
    for label, png in timeline_plots(res, out_dir):
        lines.append(f"memsched's schedule ({label}), as its simulator sees it:\n")
        lines.append(f"![{res['model']} {label}]({png.name})\n")
    return "\n".join(lines)


def write_report(out_dir: Path) -> Path:
    results = load_results(out_dir)
    out = out_dir / "peers.md"
    parts = ["# memsched vs. what users would pick instead — measured side by side\n"]
    if all(r["settings"]["device"] == "cpu" for r in results):
        parts.append(
            "**These are CPU numbers: they show the recompute side of the trade.** On a CPU-only machine host "
            "memory *is* device memory, so offloading (save_on_cpu, memsched's offload actions) cannot lower the "
            "measured peak, and recompute is priced at CPU compute speed. GPU numbers — where offload overlaps "
            "with compute over PCIe/NVLink — come from the GPU evidence issue, not from this file.\n"
        )
    else:
        parts.append(
            "**GPU numbers**: the peak is the device's (`max_memory_allocated`); offloaded bytes live in pinned "
            "host memory, outside it.\n"
        )
    findings = out_dir / "peers-findings.md"
    if findings.is_file():  # hand-written conclusions for the committed run (the rest of this file is generated)
        parts.append(findings.read_text())
    if results:
        mi = results[0]["machine"]
        parts.append("## Machine and versions\n")
        parts.append(
            f"- platform: {mi['platform']}\n- CPU: {mi['cpu']} ({mi['cores']} cores; torch threads "
            f"{mi['torch_threads']})\n- python {mi['python']}, torch {mi['torch']}, transformers "
            f"{mi['transformers']}\n- memsched commit: {mi['memsched_commit']}\n"
        )
        parts.append(
            "Each model ran in one process (`python -m bench.peers --model M ...`; the exact command is "
            "above each table). The full run: `python -m bench.peers --model all` (batch and sequence "
            "per model in `bench/peers/__main__.py`, FULL); `--quick` is what `python -m bench.peers "
            "--quick` runs.\n"
        )
    parts.append(METHOD)
    parts.append("## Results\n")
    if not results:
        parts.append("No results yet: run `python -m bench.peers --quick`.\n")
    for res in results:
        parts.append(model_section(res, out_dir))
    cm = out_dir / "costmodel.md"
    if cm.is_file():
        parts.append(
            "## Cost-model comparison\n\nThe simulator's view on imported PipeDream profiles and our "
            f"recorded traces, 90% .. 10% budgets: [costmodel.md]({cm.name}).\n"
        )
    out.write_text("\n".join(parts))
    return out


METHOD = """## How it is measured

- **Budgets**: X% means X% of the *measured* keep-all peak activation bytes of the same model, batch and
  process. An approach **fits** when its measured peak activation bytes are <= that.
- **Peak activation bytes**: one profiled step per run, after the warm-up and with gradients allocated and zeroed in
  place: on CPU the kineto profiler's allocator events (`profile_memory=True`, running sum of `[memory]`
  events), peak minus the bytes live at the step start; on CUDA `max_memory_allocated` minus
  `memory_allocated` before the step. Parameters, gradients and the batch are therefore excluded; transients
  (logits, softmax, workspace) are included — they are real and no block-level plan moves them. For memsched
  on CPU the host buffer pool's resident bytes are added (they outlive the step, in the same RAM).
- **End-of-forward bytes**: in the same profiled step, the bytes live when `loss.backward()` starts (a profiler
  range marks it): what the forward left behind for the backward — the quantity checkpointing and offloading act
  on, before the backward's own transients (gradients of activations and weights) add to it.
- **Step time**: forward + loss + backward (no optimizer update, which is the same for every approach), median of
  N timed steps after the warm-up (torch.compile compiles in the warm-up). The profiled step is not timed. Both
  wall time and this process's CPU time (all its threads; `time.process_time`) are recorded. The 2 cores are
  shared with other jobs, which inflates wall time at random; CPU time does not count waiting for a core, so on
  CPU the Pareto plots and memsched's "measured overhead" use the CPU-time ratio. Both ratios are in the tables.
  Runs with `--threads 1` (torch_threads above) avoid OpenMP worker threads spinning while they wait for a shared
  core, which would count as CPU time.
- **Gradients**: every run's parameter gradients from the profiled step are compared with keep-all's on the
  same weights and batch, dropout off: `ok` when every parameter's relative L2 error
  ||g - g_ref|| / max(||g_ref||, 1e-3 · rms · sqrt(numel)) <= 1e-4 and no gradient is missing ("bitwise" when all
  are identical). `rms` is the model's per-element gradient scale: the floor keeps gradients that are
  mathematically zero and numerically rounding noise (attention's key bias: softmax ignores a per-row constant)
  from counting as 100% errors.
- **Blocks**: GPT-2 `transformer.h.*`, BERT `bert.encoder.layer.*`, ViT `vit.layers.*`, ResNet-50
  `resnet.encoder.stages.*.layers.*`. checkpoint_sequential uses round(sqrt(n)) segments; the last is not
  checkpointed (torch's rule).
- **torch.compile**: `torch._functorch.config.activation_memory_budget` = the budget fraction, backend
  `aot_eager_decomp_partition` on CPU (inductor on GPU), `torch._dynamo.reset()` between runs. Its fraction is of
  the partitioner's own activation estimate, not of our measured peak.
- **SAC MILP**: `torch.distributed._tools` MemTracker + RuntimeEstimator + SACEstimator on a fake copy, then
  `sac_milp` over the blocks and `get_optimal_checkpointing_policy_per_module`, applied with selective
  checkpointing (what `auto_sac` does).
- **memsched**: `memsched.runtime.trace` once, `solve` per budget (`N%` = the memory at the step's start + N% of
  the trace's keep-all step activations, the harness's own definition), replay under `apply_schedule`. On the
  CPU the default plans keep and recompute only (offload frees nothing where host memory is device memory).
  `memsched, recompute only` solves with `actions=keep,recompute` (on a GPU; on the CPU it is the default, so
  that row is not run).
- Timings on a shared 2-core machine are noisy: compare ratios within one model's table (one process, same
  minutes), not across tables.
"""
