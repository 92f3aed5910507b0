"""Sweep benchmark: a 20-point `memsched sweep` of PipeDream ResNet-50 (batch 128) at a 1% gap, timed, at each
per-point time limit asked for. Writes bench/results/sweep_bench.{md,json} naming the machine, versions,
command and commit, with each point's budget, overhead, bound, gap and status.

    python bench/sweep_bench.py [--shared /work/shared] [--limits 5,12] [--points 20] [--workers N] [--refine both]

The profile is read from SHARED/data/pipedream (read-only), never copied into the project. Every point solves
through memsched.service.sweep.sweep_trace, the function the CLI and POST /v1/sweeps call.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from solver_bench import _meta as bench_meta  # run by path (python bench/sweep_bench.py): bench/ is on sys.path

from memsched.options import SolveOptions
from memsched.service.importers import import_pipedream
from memsched.service.sweep import SweepPoint, SweepResult, default_workers, sweep_trace

RESULTS = Path(__file__).resolve().parent / "results"


def _meta() -> dict[str, object]:
    return bench_meta(("memsched", "numpy", "numba", "pulp"))


def _solved_again(p: SweepPoint) -> bool:
    return any(d.startswith("sweep: solved again") for d in p.schedule.solver.details)


def _summary(limit: float, refine: bool, res: SweepResult) -> dict[str, object]:
    gaps = [p.gap for p in res.points]
    return {
        "time_limit_per_point_s": limit,
        "refine": refine,
        "solved_again": sum(1 for p in res.points if _solved_again(p)),
        "points": len(res.points),
        "workers": res.workers,
        "wall_s": res.wall_s,
        "within_1pct": sum(1 for g in gaps if g is not None and g <= 0.01 + 1e-9),
        "max_gap": max((g for g in gaps if g is not None), default=None),
        "no_bound": sum(1 for g in gaps if g is None),
        "reused": sum(1 for p in res.points if p.reused_from is not None),
        "knees_bytes": [k.budget_bytes for k in res.knees],
        "zero_overhead_bytes": res.zero_overhead_bytes,
        "rows": [
            {
                "budget_bytes": p.budget_bytes,
                "overhead_s": p.overhead_s,
                "overhead_pct": round(p.overhead_pct, 3),
                "bound_s": p.bound_s,
                "gap": p.gap,
                "status": p.status.value,
                "reused_from": p.reused_from,
                "solve_s": p.solve_s,
                "solved_again": _solved_again(p),
            }
            for p in res.points
        ],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shared", default="/work/shared", help="folder holding data/pipedream")
    ap.add_argument("--limits", default="5,12", help="per-point time limits to run, seconds, comma-separated")
    ap.add_argument("--points", type=int, default=20)
    ap.add_argument("--workers", type=int, default=None, help="solver processes (default: one per core)")
    ap.add_argument(
        "--refine",
        choices=("on", "off", "both"),
        default="both",
        help="solve the points left open again with the time the sweep has left (both: each limit without, then with)",
    )
    args = ap.parse_args()
    trace = import_pipedream(Path(args.shared) / "data" / "pipedream" / "resnet50.graph.txt", 128)
    workers = args.workers or default_workers()
    runs = []
    modes = {"on": (True,), "off": (False,), "both": (False, True)}[args.refine]
    for limit in (float(x) for x in args.limits.split(",")):
        for refine in modes:
            t0 = time.perf_counter()
            opts = SolveOptions(time_limit_s=limit, gap=0.01)
            res = sweep_trace(trace, opts, points=args.points, workers=workers, refine=refine)
            outer = time.perf_counter() - t0
            runs.append({**_summary(limit, refine, res), "wall_with_pool_start_s": round(outer, 3), "notes": res.notes})
    doc = {"meta": _meta(), "trace": "pipedream/resnet50 batch 128", "gap": 0.01, "runs": runs}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "sweep_bench.json").write_text(json.dumps(doc, indent=2) + "\n")
    md = RESULTS / "sweep_bench.md"
    # Hand-written notes (from the first '## Notes' heading on) outlive the run that rewrites the tables.
    old = md.read_text() if md.exists() else ""
    notes = old[old.index("\n## Notes") :] if "\n## Notes" in old else ""
    md.write_text(_markdown(doc) + notes)
    print(_markdown(doc))


def _markdown(doc: dict[str, object]) -> str:
    meta = doc["meta"]
    assert isinstance(meta, dict)
    lines = [
        "# Sweep benchmark: PipeDream ResNet-50 (batch 128), 20 points, gap 1%",
        "",
        f"- command: `{meta['command']}` at commit {meta['commit']}, {meta['date_utc']}",
        f"- machine: {meta['machine']}",
        f"- versions: {meta['versions']}",
        "",
        "| limit per point | open points solved again | points | workers | wall (s) | with pool start (s) "
        "| within 1% | max gap | reused | knees |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    runs = doc["runs"]
    assert isinstance(runs, list)
    for r in runs:
        knees = ", ".join(f"{b / 2**30:.2f} GiB" for b in r["knees_bytes"])
        mg = r["max_gap"]
        lines.append(
            f"| {r['time_limit_per_point_s']:g} s | {_again(r)} | {r['points']} | {r['workers']} | {r['wall_s']:.1f} | "
            f"{r['wall_with_pool_start_s']:.1f} | {r['within_1pct']} | "
            f"{'-' if mg is None else f'{100 * mg:.1f}%'} | {r['reused']} | {knees} |"
        )
    for r in runs:
        lines += [
            "",
            f"## {r['time_limit_per_point_s']:g} s per point, open points solved again: {_again(r)}",
            "",
            *(f"- note: {n}" for n in r.get("notes", [])),
            "",
            "| budget (GiB) | overhead (ms) | overhead % | bound (ms) | gap | status | solve s | reused from |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for p in r["rows"]:
            b = p["bound_s"]
            g = p["gap"]
            lines.append(
                f"| {p['budget_bytes'] / 2**30:.3f} | {1e3 * p['overhead_s']:.2f} | {p['overhead_pct']:.2f} | "
                f"{'-' if b is None else f'{1e3 * b:.2f}'} | {'-' if g is None else f'{100 * g:.2f}%'} | "
                f"{p['status']} | {p['solve_s']:.1f}{' (again)' if p.get('solved_again') else ''} | "
                f"{'' if p['reused_from'] is None else p['reused_from']} |"
            )
    return "\n".join(lines) + "\n"


def _again(r: dict[str, object]) -> str:
    """'no' (not asked), or how many points the run solved again."""
    return f"yes ({r['solved_again']})" if r.get("refine") else "no"


if __name__ == "__main__":
    main()
