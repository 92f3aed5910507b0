"""Cost-model comparison: memsched's schedule vs. every baseline and the greedy heuristic,
and the ILP's proven bound, as the simulator prices them, on the imported PipeDream profiles and on our
recorded traces, at budgets from 90% down to 10% of the keep-all activation memory.

    python -m bench.costmodel [--time-limit 5] [--pipedream-dir /work/shared/data/pipedream] [--traces traces]

Writes bench/results/costmodel.json, costmodel.md and one plot per trace. Inputs are read, never copied.
"""

from __future__ import annotations

import argparse
import json
import logging
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from memsched.errors import InfeasibleBudgetError, MemschedError
from memsched.io import load_trace
from memsched.optimizer.baselines import evaluate_baselines
from memsched.optimizer.budget import keepall_activation_peak, min_feasible_budget, resolve_budget
from memsched.optimizer.heuristic import heuristic
from memsched.optimizer.solve import solve
from memsched.options import SolveOptions
from memsched.schema import Trace
from memsched.service.importers import import_pipedream

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
PIPEDREAM_DIR = Path("/work/shared/data/pipedream")
# The batch sizes the PipeDream profiles were recorded at.
PIPEDREAM_BATCH = {"alexnet": 256, "resnet18": 256, "vgg16": 128, "resnet50": 128, "densenet121": 64, "gnmt": 64}
TRACE_GLOBS = ("traces/*.json", "bench/results/peers-*.trace.json")
"""Our recorded traces: the committed ones, and those the peer benchmark's memsched runs recorded."""
BUDGETS_PCT = (90, 80, 70, 60, 50, 40, 30, 20, 10)


@dataclass
class Point:
    """One trace at one budget."""

    budget_pct: int
    budget_bytes: int
    policies: dict[str, dict[str, Any]]
    """policy -> {feasible, overhead_pct, peak_bytes}; memsched carries solver status, bound and wall time."""

    def to_json(self) -> dict[str, Any]:
        return {"budget_pct": self.budget_pct, "budget_bytes": self.budget_bytes, "policies": self.policies}


def load_traces(pipedream_dir: Path, trace_globs: list[str]) -> list[tuple[str, Trace]]:
    out: list[tuple[str, Trace]] = []
    for name, batch in PIPEDREAM_BATCH.items():
        p = pipedream_dir / f"{name}.graph.txt"
        if p.is_file():
            out.append((f"pipedream/{name} (batch {batch})", import_pipedream(p, batch_size=batch)))
        else:
            log.warning("%s not found: skipped", p)
    paths = sorted({p for g in trace_globs for p in REPO.glob(g)} if trace_globs else set())
    for p in paths:
        try:
            tr = load_trace(p)
        except MemschedError as e:  # a file in traces/ that is not a trace is skipped and said so
            log.warning("%s: not a trace (%s); skipped", p, e)
            continue
        rel = p.relative_to(REPO) if p.is_relative_to(REPO) else p
        seq = f", seq {tr.seq_len}" if tr.seq_len else ""
        out.append((f"{rel} ({tr.model}, batch {tr.batch_size}{seq}, {tr.device.name})", tr))
    return out


def evaluate(trace: Trace, pct: int, time_limit_s: float) -> Point:
    budget = resolve_budget(f"{pct}%", trace)
    pol: dict[str, dict[str, Any]] = {}
    for r in evaluate_baselines(trace, budget):
        pol[r.policy] = {"feasible": r.feasible, "overhead_pct": r.sim.overhead_pct, "peak_bytes": r.sim.peak_bytes}
    minimum = min_feasible_budget(trace)
    if budget < minimum:
        pol["heuristic"] = {"feasible": False, "reason": "below the smallest feasible budget"}
        pol["memsched"] = {"feasible": False, "reason": f"infeasible: smallest feasible budget is {minimum} bytes"}
        return Point(pct, budget, pol)
    h = heuristic(trace, budget)
    pol["heuristic"] = {"feasible": h.sim.feasible, "overhead_pct": h.sim.overhead_pct, "peak_bytes": h.sim.peak_bytes}
    t0 = time.perf_counter()
    try:
        sc = solve(trace, budget, SolveOptions(time_limit_s=time_limit_s))
    except InfeasibleBudgetError as e:
        pol["memsched"] = {"feasible": False, "reason": str(e)}
        return Point(pct, budget, pol)
    wall = time.perf_counter() - t0
    base = sc.prediction.keepall_step_s
    bound = sc.solver.best_bound_s
    pol["memsched"] = {
        "feasible": True,
        "overhead_pct": sc.prediction.overhead_pct,
        "peak_bytes": sc.prediction.peak_bytes,
        "status": sc.solver.status.value,
        "backend": sc.solver.backend,
        "policy": sc.policy,
        "bound_pct": None if bound is None or base <= 0 else 100 * bound / base,
        "gap": sc.solver.gap,
        "wall_s": wall,
        "actions": sc.action_counts(),
    }
    return Point(pct, budget, pol)


_ORDER = [
    "memsched",
    "heuristic",
    "keep-all",
    "checkpoint-all",
    "sqrt-segments",
    "offload-all-sync",
    "offload-all-overlapped",
]


def plot(name: str, trace: Trace, points: list[Point], path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(8, 5))
    for pol in _ORDER:
        xs = [p.budget_pct for p in points if p.policies.get(pol, {}).get("feasible")]
        ys = [p.policies[pol]["overhead_pct"] for p in points if p.policies.get(pol, {}).get("feasible")]
        if xs:
            ax.plot(
                xs,
                ys,
                marker="o" if pol == "memsched" else ".",
                lw=2.2 if pol == "memsched" else 1.2,
                label=pol,
                zorder=3 if pol == "memsched" else 2,
            )
    bx = [p.budget_pct for p in points if p.policies.get("memsched", {}).get("bound_pct") is not None]
    by = [
        p.policies["memsched"]["bound_pct"]
        for p in points
        if p.policies.get("memsched", {}).get("bound_pct") is not None
    ]
    if bx:
        ax.plot(bx, by, ls="--", color="black", lw=1, label="ILP lower bound")
    infeasible = [p.budget_pct for p in points if not p.policies.get("memsched", {}).get("feasible")]
    for x in infeasible:
        ax.axvspan(x - 5, x + 5, color="#DDDDDD", zorder=0)
    ax.set_xlabel("budget: % of keep-all activation memory (grey: infeasible for every schedule)")
    ax.set_ylabel("predicted step-time overhead vs keep-all, % (symlog)")
    ax.set_yscale("symlog", linthresh=1)
    ax.invert_xaxis()
    ax.set_title(f"{name}: {trace.n} layers, device {trace.device.name}", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def _cell(d: dict[str, Any] | None) -> str:
    if not d or not d.get("feasible"):
        return "—"
    return f"{d['overhead_pct']:.1f}"


def report(results: list[dict[str, Any]], out_dir: Path, command: str, time_limit_s: float) -> Path:
    lines = [
        "# Cost-model comparison: memsched vs. baselines and the heuristic, as the simulator prices them\n",
        f"Command: `{command}` (exact solver: auto backend, time limit {time_limit_s:g} s per budget).  ",
        "Budgets: N% = static bytes + N% of the trace's keep-all activation peak (docs/architecture.md). "
        "Cells: predicted overhead in % of the keep-all step; — = infeasible at that budget. "
        "`bound` is the ILP's proven lower bound on the overhead "
        "(blank when the heuristic or a baseline was returned, or keep-all fits). "
        "PipeDream profiles carry no device: the importer's default (16 GiB, 12 GB/s PCIe copies) is used; "
        "our CPU traces carry the CPU's memcpy speed as their 'copy bandwidth'.\n",
    ]
    for res in results:
        lines.append(f"## {res['name']}\n")
        lines.append(
            f"{res['layers']} layers; keep-all activation peak {res['keepall_activation_bytes'] / 2**20:.1f} "
            f"MiB; smallest feasible budget {res['min_feasible_pct']:.1f}% ; copy bandwidth "
            f"{res['h2d_bytes_per_s'] / 1e9:.1f} GB/s\n"
        )
        pols = [p for p in _ORDER if any(p in pt["policies"] for pt in res["points"])]
        head = "| budget | " + " | ".join(pols) + " | bound | memsched status | solve s | memsched actions |"
        lines += [head, "|" + "---|" * (head.count("|") - 1)]
        for pt in res["points"]:
            m = pt["policies"].get("memsched", {})
            bound = m.get("bound_pct")
            acts = m.get("actions") or {}
            lines.append(
                f"| {pt['budget_pct']}% | "
                + " | ".join(_cell(pt["policies"].get(p)) for p in pols)
                + f" | {'' if bound is None else f'{bound:.1f}'} | {m.get('status', '-')} "
                f"{'(' + m['policy'] + ')' if m.get('policy') and m.get('policy') != 'ilp' else ''} | "
                f"{m.get('wall_s', 0):.1f} | " + ", ".join(f"{v} {k}" for k, v in acts.items() if v) + " |"
            )
        lines.append(f"\n![{res['name']}]({res['plot']})\n")
    out = out_dir / "costmodel.md"
    out.write_text("\n".join(lines))
    return out


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(
        prog="python -m bench.costmodel", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--time-limit", type=float, default=5.0, help="exact solver limit per budget, seconds")
    ap.add_argument("--pipedream-dir", type=Path, default=PIPEDREAM_DIR)
    ap.add_argument(
        "--traces",
        action="append",
        help=f"glob of recorded traces, relative to the repository (repeatable; default: {' and '.join(TRACE_GLOBS)})",
    )
    ap.add_argument("--only", action="append", help="only traces whose name contains this (repeatable)")
    ap.add_argument("--out", type=Path, default=RESULTS)
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    a.out.mkdir(parents=True, exist_ok=True)
    results = []
    for name, tr in load_traces(a.pipedream_dir, a.traces or list(TRACE_GLOBS)):
        if a.only and not any(o in name for o in a.only):
            continue
        t0 = time.perf_counter()
        points = [evaluate(tr, pct, a.time_limit) for pct in BUDGETS_PCT]
        first = name.split(" ")[0]
        slug = first.replace("/", "-") if first.startswith("pipedream/") else Path(first).name.removesuffix(".json")
        png = plot(name, tr, points, a.out / f"costmodel-{slug}.png")
        act = keepall_activation_peak(tr)
        results.append(
            {
                "name": name,
                "model": tr.model,
                "layers": tr.n,
                "keepall_activation_bytes": act,
                "static_bytes": tr.static.total,
                "min_feasible_pct": 100 * (min_feasible_budget(tr) - tr.static.total) / act if act else 0.0,
                "h2d_bytes_per_s": tr.device.h2d_bytes_per_s,
                "points": [p.to_json() for p in points],
                "plot": png.name,
            }
        )
        log.info("%s: %d budgets in %.1f s", name, len(points), time.perf_counter() - t0)
    command = "python -m bench.costmodel " + shlex.join(argv)
    (a.out / "costmodel.json").write_text(
        json.dumps({"command": command, "time_limit_s": a.time_limit, "results": results}, indent=1) + "\n"
    )
    print(f"wrote {report(results, a.out, command, a.time_limit)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
