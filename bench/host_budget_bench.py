"""Host-budget benchmark: what a limit on pinned host memory costs. For PipeDream ResNet-50 (batch 128) at device
budgets of 50% and 25%, the plan solved without a host budget, then under host budgets of 75%, 50%, 25% and 0% of
that plan's host peak: each answer's overhead, host peak, status, bound and gap, and the solve's wall time; a host
budget no plan meets is answered with the smallest one that works (InfeasibleHostBudgetError), also timed.
Writes bench/results/host_budget.{md,json} naming the machine, versions, command and commit.

    python bench/host_budget_bench.py [--shared /work/shared] [--limit 10] [--budgets 50%,25%]

The profile is read from SHARED/data/pipedream (read-only), never copied into the project. Every point solves
through memsched.service.solve_trace, the function the CLI and the API call.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from solver_bench import _meta as bench_meta  # run by path (python bench/host_budget_bench.py): bench/ is on sys.path

from memsched.errors import InfeasibleHostBudgetError
from memsched.options import SolveOptions
from memsched.schema import Trace
from memsched.service import resolve_budget, solve_trace
from memsched.service.importers import import_pipedream

RESULTS = Path(__file__).resolve().parent / "results"
HOST_FRACTIONS = (0.75, 0.5, 0.25, 0.0)
"""Host budgets as fractions of the host peak of the plan solved without one."""


def _row(trace: Trace, budget: str, budget_bytes: int, options: SolveOptions) -> dict[str, Any]:
    """One solve, timed, as a results row."""
    host = options.host_budget
    t0 = time.perf_counter()
    row: dict[str, Any] = {"budget": budget, "budget_bytes": budget_bytes, "host_budget_bytes": host}
    try:
        sc = solve_trace(trace, budget_bytes, options)
    except InfeasibleHostBudgetError as e:
        row.update(
            wall_s=round(time.perf_counter() - t0, 3),
            status="infeasible host budget",
            min_host_bytes=e.min_host_bytes,
            min_host_proven=e.proven,
        )
        return row
    p, s = sc.prediction, sc.solver
    row.update(
        wall_s=round(time.perf_counter() - t0, 3),
        status=s.status.value,
        overhead_pct=round(p.overhead_pct, 3),
        overhead_s=p.overhead_s,
        host_peak_bytes=p.host_peak_bytes,
        bound_s=s.best_bound_s,
        gap=s.gap,
        actions=sc.action_counts(),
    )
    assert host is None or (p.host_peak_bytes or 0) <= host, row  # the promise the bench measures
    assert p.peak_bytes <= budget_bytes, row
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shared", default="/work/shared", help="folder holding data/pipedream")
    ap.add_argument("--limit", type=float, default=10.0, help="time limit per solve, seconds")
    ap.add_argument("--budgets", default="50%,25%", help="device budgets, comma-separated")
    args = ap.parse_args()
    trace = import_pipedream(Path(args.shared) / "data" / "pipedream" / "resnet50.graph.txt", 128)
    rows = []
    for budget in args.budgets.split(","):
        budget_bytes = resolve_budget(budget, trace)
        free = _row(trace, budget, budget_bytes, SolveOptions(time_limit_s=args.limit))
        rows.append(free)
        peak = free.get("host_peak_bytes") or 0
        for frac in HOST_FRACTIONS:
            opts = SolveOptions(time_limit_s=args.limit, host_budget=int(peak * frac))
            rows.append(_row(trace, budget, budget_bytes, opts))
    doc = {
        "meta": bench_meta(("memsched", "numpy", "numba", "pulp")),
        "trace": "pipedream/resnet50 batch 128",
        "time_limit_s": args.limit,
        "rows": rows,
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "host_budget.json").write_text(json.dumps(doc, indent=2) + "\n")
    (RESULTS / "host_budget.md").write_text(_markdown(doc))
    print(_markdown(doc))


def _gib(b: int | None) -> str:
    return "-" if b is None else f"{b / 2**30:.3f}"


def _markdown(doc: dict[str, Any]) -> str:
    meta = doc["meta"]
    lines = [
        f"# Host-budget benchmark: PipeDream ResNet-50 (batch 128), {doc['time_limit_s']:g} s per solve",
        "",
        f"- command: `{meta['command']}` at commit {meta['commit']}, {meta['date_utc']}",
        f"- machine: {meta['machine']}",
        f"- versions: {meta['versions']}",
        "- host budgets: none, then 75 / 50 / 25 / 0% of the host peak of the plan solved without one",
        "",
        "| budget | host budget (GiB) | status | overhead % | host peak (GiB) | bound (ms) | gap | k/o/r | wall (s) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in doc["rows"]:
        host = "none" if r["host_budget_bytes"] is None else _gib(r["host_budget_bytes"])
        if r["status"] == "infeasible host budget":
            least = _gib(r["min_host_bytes"]) + ("" if r["min_host_proven"] else " (at most)")
            lines.append(
                f"| {r['budget']} | {host} | no plan fits: the least that works is {least} GiB | - | - | - | - | - "
                f"| {r['wall_s']:.1f} |"
            )
            continue
        a, b, g = r["actions"], r["bound_s"], r["gap"]
        lines.append(
            f"| {r['budget']} | {host} | {r['status']} | {r['overhead_pct']:.2f} | {_gib(r['host_peak_bytes'])} | "
            f"{'-' if b is None else f'{1e3 * b:.2f}'} | {'-' if g is None else f'{100 * g:.2f}%'} | "
            f"{a.get('keep', 0)}/{a.get('offload', 0)}/{a.get('recompute', 0)} | {r['wall_s']:.1f} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
