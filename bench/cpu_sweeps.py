"""Keep / recompute sweeps of CPU traces, before and after a change: `memsched sweep TRACE --json` (20 points, the
CLI's defaults: a CPU trace plans keep and recompute) run by two checkouts, each with its own .venv, one after
the other per trace, on one core. Writes bench/results/cpu_sweeps.{md,json} naming the machine, versions, command
and both commits, with each side's points proven within the gap, largest gap, smallest budget reached and wall.

    python bench/cpu_sweeps.py --before /tmp/B --after /tmp/A [--trace-dir DIR] [--core 0]

The traces: the CPU traces in traces/, and small CPU decoders traced now into --trace-dir (reused when present;
bench/solver_bench.py's `trace_cpu_decoder`, with the after side's `memsched`). Why this bench: the proving
searches relax some memory rules (side inputs, 2026-12-07), which a 16-layer Llama's sweep showed as points left
open at 3-50% gaps.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

from solver_bench import _commit, kept_notes, results_header, trace_cpu_decoder  # run by path (bench/ on sys.path)
from solver_bench import _meta as bench_meta

RESULTS = Path(__file__).resolve().parent / "results"
TRACES = Path(__file__).resolve().parents[1] / "traces"
DECODERS = (("llama", 4), ("llama", 16), ("gpt2", 16))
"""CPU decoders traced for the bench (model, blocks), besides traces/*-cpu.json."""


def _side(checkout: Path, trace: Path, core: int | None) -> dict[str, object]:
    """One sweep by `checkout`'s memsched, in a process of its own."""
    cmd = [str(checkout / ".venv" / "bin" / "python"), "-m", "memsched.cli", "sweep", str(trace), "--json"]
    if core is not None:
        cmd = ["taskset", "-c", str(core), *cmd]
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=tempfile.gettempdir())
    wall = time.perf_counter() - t0
    doc = json.loads(out.stdout)
    points = doc["points"]
    gaps = [p["gap"] for p in points]
    return {
        "points": len(points),
        "proven": sum(1 for p in points if p["status"] == "optimal"),
        "max_gap": max((g for g in gaps if g is not None), default=None),
        "no_bound": sum(1 for g in gaps if g is None),
        "lo_bytes": doc["lo_bytes"],
        "wall_s": round(wall, 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", type=Path, required=True, help="a checkout with its own .venv")
    ap.add_argument("--after", type=Path, required=True, help="a checkout with its own .venv")
    ap.add_argument("--trace-dir", type=Path, default=Path(tempfile.gettempdir()) / "memsched-bench-traces")
    ap.add_argument("--core", type=int, default=None, help="CPU core both sides run on (taskset)")
    args = ap.parse_args()
    args.trace_dir.mkdir(parents=True, exist_ok=True)
    os.environ["PATH"] = f"{args.after / '.venv' / 'bin'}:{os.environ['PATH']}"  # the tracer's memsched
    traces = sorted(TRACES.glob("*-cpu.json")) + [trace_cpu_decoder(m, n, args.trace_dir) for m, n in DECODERS]
    meta = bench_meta(("memsched", "numpy", "numba"))
    meta["before"] = {"path": str(args.before), "commit": _commit(args.before)}
    meta["after"] = {"path": str(args.after), "commit": _commit(args.after)}
    rows = []
    for trace in traces:
        row = {"trace": trace.name, "before": _side(args.before, trace, args.core)}
        row["after"] = _side(args.after, trace, args.core)
        rows.append(row)
        print(row, flush=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    md = RESULTS / "cpu_sweeps.md"
    notes = kept_notes(md)
    (RESULTS / "cpu_sweeps.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    lines = [
        *results_header("Keep / recompute sweeps of CPU traces, before and after", meta),
        "",
        f"Before: {args.before} at commit {meta['before']['commit']}; after: {args.after} at commit "
        f"{meta['after']['commit']}. Each side runs `memsched sweep TRACE --json` (20 points, the CLI's defaults) in "
        f"a process of its own, one after the other per trace{'' if args.core is None else f', on core {args.core}'}."
        " Cells: points proven within the gap / points; the largest gap; the smallest budget the sweep reached "
        "(bytes: where keep and recompute first fit); wall s of the whole command.",
        "",
        "| trace | before: proven | before: max gap | before: smallest budget | before: wall s | after: proven | "
        "after: max gap | after: smallest budget | after: wall s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        cells = []
        for side in ("before", "after"):
            s = r[side]
            gap = "-" if s["max_gap"] is None else f"{100 * s['max_gap']:.2f}%"
            cells += [f"{s['proven']} / {s['points']}", gap, str(s["lo_bytes"]), str(s["wall_s"])]
        lines.append(f"| {r['trace']} | " + " | ".join(cells) + " |")
    md.write_text("\n".join(lines) + "\n" + notes)


if __name__ == "__main__":
    main()
